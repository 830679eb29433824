"""calltape: an event-sourced session store for real-time voice agents.

Record every transcript chunk, VAD edge, reply, tool call and barge-in; rebuild the context an LLM
should see at any instant; resume a dropped call or hand it to another agent without losing or
repeating a tool call.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Every CLI call imports this package: names load on first use (PEP 562), so `calltape --help` does
# not pay for the runtime, the projections and SQLAlchemy.
_EXPORTS = {
    "Calltape": "calltape.client",
    "Resumed": "calltape.client",
    "connect": "calltape.client",
    "CalltapeError": "calltape.errors",
    "ConcurrencyConflict": "calltape.errors",
    "FencedWrite": "calltape.errors",
    "InvalidEvent": "calltape.errors",
    "SchemaOutdated": "calltape.errors",
    "SessionNotFound": "calltape.errors",
    "StoreUnavailable": "calltape.errors",
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
    "RecorderFull": "calltape.eventstore.recorder",
    "RecorderSpilled": "calltape.eventstore.recorder",
    "SessionTape": "calltape.eventstore.recorder",
    "ContextFold": "calltape.projections",
    "ContextFormat": "calltape.projections",
    "build_context": "calltape.projections",
    "render": "calltape.projections",
    "CallSession": "calltape.runtime",
    "Interrupted": "calltape.runtime",
    "ResumePlan": "calltape.runtime",
    "ToolOutcome": "calltape.runtime",
    "ToolSpec": "calltape.runtime",
    "handoff": "calltape.runtime",
    "recoveries": "calltape.runtime",
    "resume": "calltape.runtime",
}

if TYPE_CHECKING:
    from calltape.client import Calltape, Resumed, connect
    from calltape.errors import (
        CalltapeError,
        ConcurrencyConflict,
        FencedWrite,
        InvalidEvent,
        SchemaOutdated,
        SessionNotFound,
        StoreUnavailable,
    )
    from calltape.events import Event, EventType, make_event, parse_event
    from calltape.eventstore import EventStore, FeedPosition, SessionInfo, open_store, upgrade
    from calltape.eventstore.recorder import Recorder, RecorderFull, RecorderSpilled, SessionTape
    from calltape.projections import ContextFold, ContextFormat, build_context, render
    from calltape.runtime import (
        CallSession,
        Interrupted,
        ResumePlan,
        ToolOutcome,
        ToolSpec,
        handoff,
        recoveries,
        resume,
    )


def __getattr__(name: str) -> Any:
    """Loads an exported name on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'calltape' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API, for ``dir(calltape)``, completion and ``help()`` (the names load lazily)."""
    return sorted(__all__)


__version__ = "0.1.0"

__all__ = [
    "CallSession",
    "Calltape",
    "CalltapeError",
    "ConcurrencyConflict",
    "ContextFold",
    "ContextFormat",
    "Event",
    "EventStore",
    "EventType",
    "FeedPosition",
    "FencedWrite",
    "Interrupted",
    "InvalidEvent",
    "Recorder",
    "RecorderFull",
    "RecorderSpilled",
    "ResumePlan",
    "Resumed",
    "SchemaOutdated",
    "SessionInfo",
    "SessionNotFound",
    "SessionTape",
    "StoreUnavailable",
    "ToolOutcome",
    "ToolSpec",
    "__version__",
    "build_context",
    "connect",
    "handoff",
    "make_event",
    "open_store",
    "parse_event",
    "recoveries",
    "render",
    "resume",
    "upgrade",
]
