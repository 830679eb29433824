"""What the observer, the guarded tools and the live reconciler of one call share."""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from typing import Any

import orjson

SUPPORTED_PIPECAT = ">=1.10,<1.15"
"""The Pipecat releases calltape is tested on (oldest and newest in CI)."""


@dataclass
class Shared:
    """Per call: which tools are guarded, which reply asked for each call, what Pipecat gave up on."""

    guarded_names: set[str] = field(default_factory=set)
    call_reply: dict[str, str | None] = field(default_factory=dict)
    call_seen: dict[str, asyncio.Event] = field(default_factory=dict)
    guard_entered: set[str] = field(default_factory=set)
    abandoned: set[str] = field(default_factory=set)
    """Guarded calls Pipecat cancelled while calltape let them run (``on_interrupt="finish"``)."""
    background: set[asyncio.Future[Any]] = field(default_factory=set)
    observed: bool = False

    def seen(self, call_id: str) -> asyncio.Event:
        """Set once the observer has recorded the call's ``tool.call`` (with its reply)."""
        event = self.call_seen.get(call_id)
        if event is None:
            event = self.call_seen[call_id] = asyncio.Event()
        return event


_SHARED: weakref.WeakKeyDictionary[Any, Shared] = weakref.WeakKeyDictionary()
_SHARED_BY_ID: dict[int, Shared] = {}


def shared(call: object) -> Shared:
    """The one :class:`Shared` of ``call`` (kept as long as the call object lives)."""
    try:
        state = _SHARED.get(call)
        if state is None:
            state = _SHARED[call] = Shared()
        return state
    except TypeError:  # a call object without __weakref__: keep it for the process lifetime
        return _SHARED_BY_ID.setdefault(id(call), Shared())


def jsonable(value: Any) -> Any:
    """A Pipecat value (arbitrary Python) as JSON, the way the log stores it."""
    try:
        return orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))
    except (TypeError, orjson.JSONEncodeError):
        return str(value)


def consume(task: asyncio.Future[Any]) -> None:
    """Retrieves a finished task's exception so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()
