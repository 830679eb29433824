"""Projections: the context a session should have at an instant (SPEC section 2).

Pure except :mod:`calltape.projections.context`, which reads the store.
"""

from calltape.errors import InvalidInstant, SnapshotMismatch, UnknownFormat
from calltape.projections.context import (
    DEFAULT_POLICY,
    ContextStore,
    SnapshotPolicy,
    build_context,
    resolve_seq,
    snapshot_now,
)
from calltape.projections.fold import (
    FOLD_VERSION,
    ContextFold,
    ReplyState,
    ToolCallState,
    fold_events,
)
from calltape.projections.formats import (
    FORMATS,
    ContextFormat,
    output_text,
    render,
    to_anthropic,
    to_openai,
    to_realtime,
)
from calltape.projections.instant import (
    AtOffset,
    AtSeq,
    AtTime,
    Instant,
    parse_instant,
    seq_for_instant,
)

__all__ = [
    "DEFAULT_POLICY",
    "FOLD_VERSION",
    "FORMATS",
    "AtOffset",
    "AtSeq",
    "AtTime",
    "ContextFold",
    "ContextFormat",
    "ContextStore",
    "Instant",
    "InvalidInstant",
    "ReplyState",
    "SnapshotMismatch",
    "SnapshotPolicy",
    "ToolCallState",
    "UnknownFormat",
    "build_context",
    "fold_events",
    "output_text",
    "parse_instant",
    "render",
    "resolve_seq",
    "seq_for_instant",
    "snapshot_now",
    "to_anthropic",
    "to_openai",
    "to_realtime",
]
