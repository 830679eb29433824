"""The Pipecat adapter's one object per call (:class:`PipecatCall`): observer, tool guard and context fixer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson

from calltape.runtime.protocol import EventSink, FoldedSink, HasParts

SUPPORTED_PIPECAT = ">=1.10,<1.15"
"""The Pipecat releases calltape is tested on (oldest and newest in CI)."""


class PipecatCall:
    """The adapter's one object per call: the observer recording it, the LLM services whose tools it
    guards, the context fixer (:meth:`reconcile`), and what they share (which tools are guarded,
    which reply asked for each call, what Pipecat gave up on).

    The call owns it (:meth:`calltape.runtime.CallSession.part`), so the observer, the guard and
    the fixer of one call find each other through the call, however the app wired them
    (:func:`~calltape.adapters.pipecat.attach`, or ``CalltapeObserver(call)`` and ``guard(llm,
    call)`` by hand), and it goes when the call goes. A recording-only sink (no ``part``) gets an
    object of its own each time: it cannot run guarded tools, so there is nothing to share."""

    def __init__(self, call: FoldedSink | EventSink) -> None:
        self.call = call
        self.observer: Any = None
        """The :class:`~calltape.adapters.pipecat.CalltapeObserver` recording the call, once made."""
        self.llms: list[Any] = []
        """The LLM services whose tools run guarded under this call (:func:`~calltape.adapters.pipecat.guard`)."""
        self.guarded_names: set[str] = set()
        self.call_reply: dict[str, str | None] = {}
        self.call_seen: dict[str, asyncio.Event] = {}
        self.guard_entered: set[str] = set()
        self.abandoned: set[str] = set()
        """Guarded calls Pipecat cancelled while calltape let them run (``on_interrupt="finish"``)."""
        self.background: set[asyncio.Future[Any]] = set()

    @classmethod
    def of(cls, call: FoldedSink | EventSink) -> PipecatCall:
        """The one :class:`PipecatCall` of ``call``."""
        if isinstance(call, HasParts):
            return call.part(cls)
        return cls(call)

    @property
    def observed(self) -> bool:
        """Whether an observer records the call (then it announces each tool call with its reply)."""
        return self.observer is not None

    def seen(self, call_id: str) -> asyncio.Event:
        """Set once the observer has recorded the call's ``tool.call`` (with its reply)."""
        event = self.call_seen.get(call_id)
        if event is None:
            event = self.call_seen[call_id] = asyncio.Event()
        return event

    def reconcile(self, context: Any) -> int:
        """The context fixer: rewrites each tool message of ``context`` (a Pipecat ``LLMContext``)
        whose guarded call the log settled differently; returns how many it changed (:mod:`.live`)."""
        fold = getattr(self.call, "fold", None)
        if fold is None:
            return 0
        changed = 0
        for message in context.get_messages():
            if not isinstance(message, dict) or message.get("role") != "tool":
                continue
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                continue
            state = fold.tool_call(call_id)
            if state is None or not state.included or state.name not in self.guarded_names:
                continue  # a call calltape does not guard keeps Pipecat's own message
            if state.status == "in_progress" and call_id not in self.abandoned:
                continue  # Pipecat still waits for it too
            if _as_json(message.get("content")) != state.output:
                message["content"] = json.dumps(state.output, ensure_ascii=False)
                changed += 1
        return changed


_MISSING = object()


def _as_json(content: Any) -> Any:
    if not isinstance(content, str):
        return _MISSING
    try:
        return json.loads(content)
    except ValueError:
        return _MISSING


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
