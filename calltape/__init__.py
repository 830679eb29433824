"""calltape: an event-sourced session store for real-time voice agents.

Record every transcript chunk, VAD edge, reply, tool call and barge-in; rebuild the context an LLM
should see at any instant; resume a dropped call or hand it to another agent without losing or
repeating a tool call.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

# Every CLI call imports this package: names load on first use (PEP 562), so `calltape --help` does
# not pay for the runtime, the projections and SQLAlchemy.
_EXPORTS = {
    "Calltape": "calltape.client",
    "Resumed": "calltape.client",
    "connect": "calltape.client",
    "AlreadyResumed": "calltape.errors",
    "CalltapeError": "calltape.errors",
    "ConcurrencyConflict": "calltape.errors",
    "DurableAppendTimeout": "calltape.errors",
    "EffectNotRun": "calltape.errors",
    "EffectUnknown": "calltape.errors",
    "FencedWrite": "calltape.errors",
    "Interrupted": "calltape.errors",
    "InvalidEvent": "calltape.errors",
    "InvalidInstant": "calltape.errors",
    "RecorderClosed": "calltape.errors",
    "RecorderFull": "calltape.errors",
    "RecorderSpilled": "calltape.errors",
    "SchemaOutdated": "calltape.errors",
    "SessionErased": "calltape.errors",
    "SessionNotFound": "calltape.errors",
    "StoreUnavailable": "calltape.errors",
    "TenantRefused": "calltape.errors",
    "UnknownFormat": "calltape.errors",
    "Event": "calltape.events",
    "EventType": "calltape.events",
    "make_event": "calltape.events",
    "parse_event": "calltape.events",
    "EventStore": "calltape.eventstore",
    "FeedPosition": "calltape.eventstore",
    "SessionInfo": "calltape.eventstore",
    "open_store": "calltape.eventstore",
    "upgrade": "calltape.eventstore",
    "Recorder": "calltape.eventstore.recorder",
    "ContextFold": "calltape.projections",
    "ContextFormat": "calltape.projections",
    "build_context": "calltape.projections",
    "render": "calltape.projections",
    "CallSession": "calltape.runtime",
    "ResumePlan": "calltape.runtime",
    "ToolOutcome": "calltape.runtime",
    "ToolSpec": "calltape.runtime",
    "Reconciled": "calltape.runtime",
    "effect": "calltape.runtime",
    "handoff": "calltape.runtime",
    "recoveries": "calltape.runtime",
    "resume": "calltape.runtime",
}

if TYPE_CHECKING:
    from calltape.client import Calltape, Resumed, connect
    from calltape.errors import (
        AlreadyResumed,
        CalltapeError,
        ConcurrencyConflict,
        DurableAppendTimeout,
        EffectNotRun,
        EffectUnknown,
        FencedWrite,
        Interrupted,
        InvalidEvent,
        InvalidInstant,
        RecorderClosed,
        RecorderFull,
        RecorderSpilled,
        SchemaOutdated,
        SessionErased,
        SessionNotFound,
        StoreUnavailable,
        TenantRefused,
        UnknownFormat,
    )
    from calltape.events import Event, EventType, make_event, parse_event
    from calltape.eventstore import EventStore, FeedPosition, SessionInfo, open_store, upgrade
    from calltape.eventstore.recorder import Recorder
    from calltape.projections import ContextFold, ContextFormat, build_context, render
    from calltape.runtime import (
        CallSession,
        Reconciled,
        ResumePlan,
        ToolOutcome,
        ToolSpec,
        effect,
        handoff,
        recoveries,
        resume,
    )


_DEPRECATED = {"SessionTape": ("calltape.eventstore.recorder", "_SessionTape", "SESSION_TAPE_DEPRECATED")}
"""Old public names (module, the private name now, the module's warning): each still loads, with a
``DeprecationWarning`` on every use, and is neither in ``__all__`` nor in ``dir(calltape)``."""


def __getattr__(name: str) -> Any:
    """Loads an exported name on first use (PEP 562)."""
    if name in _DEPRECATED:
        where, private, message = _DEPRECATED[name]
        old = importlib.import_module(where)
        warnings.warn(getattr(old, message), DeprecationWarning, stacklevel=2)
        return getattr(old, private)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'calltape' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API, for ``dir(calltape)``, completion and ``help()`` (the names load lazily)."""
    return sorted(__all__)


from calltape.version import __version__  # noqa: E402  (a leaf module: the CLI reads it too)

__all__ = [
    "AlreadyResumed",
    "CallSession",
    "Calltape",
    "CalltapeError",
    "ConcurrencyConflict",
    "ContextFold",
    "ContextFormat",
    "DurableAppendTimeout",
    "EffectNotRun",
    "EffectUnknown",
    "Event",
    "EventStore",
    "EventType",
    "FeedPosition",
    "FencedWrite",
    "Interrupted",
    "InvalidEvent",
    "InvalidInstant",
    "Reconciled",
    "Recorder",
    "RecorderClosed",
    "RecorderFull",
    "RecorderSpilled",
    "ResumePlan",
    "Resumed",
    "SchemaOutdated",
    "SessionErased",
    "SessionInfo",
    "SessionNotFound",
    "StoreUnavailable",
    "TenantRefused",
    "ToolOutcome",
    "ToolSpec",
    "UnknownFormat",
    "__version__",
    "build_context",
    "connect",
    "effect",
    "handoff",
    "make_event",
    "open_store",
    "parse_event",
    "recoveries",
    "render",
    "resume",
    "upgrade",
]
