"""Replay of a recorded call into a changed agent: does the new build still handle yesterday's calls?

:func:`replay` forks the recorded session at seq N into a new session (the very copy ``calltape replay
SESSION --into NEW --to N`` makes), attaches a live :class:`~calltape.runtime.CallSession` to the
fork and runs the user's agent on it. The agent gets a :class:`RecordedCall`: what the caller said
after N (to feed its scripted caller) and a scripted tool host that answers each tool call with the
output the recorded call got for the same tool and the same arguments, in recorded order — so no
booking is made twice and no network is needed. Then the new agent's context is compared with the
recorded one, item by item, and the first difference is reported with the instant (seq and time)
each side reached it.
"""

from __future__ import annotations

import sys
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Unpack

import orjson

from calltape.errors import RecordedToolError, UnrecordedCall
from calltape.events import Event
from calltape.eventstore import EventStore
from calltape.eventstore.fork import fork_session
from calltape.projections import ContextFold
from calltape.runtime import CallSession, ToolOutcome, ToolSpec, canonical_arguments
from calltape.runtime.toolspec import ToolBody, ToolOptions

__all__ = ["Divergence", "RecordedCall", "RecordedToolError", "Replay", "ReplayAgent", "UnrecordedCall", "replay"]

ReplayAgent = Callable[[CallSession, "RecordedCall"], Awaitable[None]]
"""The changed agent: drives the forked call from seq N on (a scripted caller fed from the record)."""


def _key(name: str, arguments: Any) -> tuple[str, bytes]:
    return name, canonical_arguments(arguments)


@dataclass(slots=True)
class _Answer:
    output: Any
    error: bool


class RecordedCall:
    """What the recorded call holds after the fork point: the caller's turns and the tool outputs."""

    def __init__(self, events: list[Event], at: int) -> None:
        self.at = at
        self.tail = [e for e in events if (e.seq or 0) > at]
        """The recorded events after the fork point (the reference run)."""
        calls: dict[str, tuple[str, Any]] = {}
        answered: dict[str, _Answer] = {}
        for event in events:
            data = event.data
            if event.type == "tool.call":
                calls.setdefault(data["call"], (data["name"], data.get("arguments")))
            elif event.type == "tool.result" and data["call"] not in answered and (event.seq or 0) > at:
                answered[data["call"]] = _Answer(data.get("output"), bool(data.get("error")))
        self._answers: dict[tuple[str, bytes], deque[_Answer]] = {}
        for call_id, (name, arguments) in calls.items():  # recorded call order
            if call_id in answered:
                self._answers.setdefault(_key(name, arguments), deque()).append(answered[call_id])
        self.unanswered: list[str] = []
        """Call ids of the new run the record had no output for."""

    @property
    def user_turns(self) -> list[str]:
        """The caller's recorded turns after the fork point, in order (final transcripts and typed text,
        one string per turn: a turn ends when a reply starts, as in the context's user messages)."""
        turns: list[str] = []
        current: list[str] = []
        for event in self.tail:
            if event.type == "agent.reply.started" and current:
                turns.append(" ".join(current))
                current = []
            elif event.type == "user.text" or (event.type == "user.transcript" and event.data.get("final")):
                text = " ".join(str(event.data.get("text", "")).split())
                if text:
                    current.append(text)
        if current:
            turns.append(" ".join(current))
        return turns

    def answer(self, name: str, arguments: Any, call_id: str | None = None) -> ToolBody:
        """A tool body that returns the recorded output of the next recorded call of ``name`` with these
        arguments (raises :class:`UnrecordedCall` when the record has none left)."""
        queue = self._answers.get(_key(name, arguments))
        answer = queue.popleft() if queue else None
        if answer is None and call_id is not None:
            self.unanswered.append(call_id)

        async def body() -> Any:
            if answer is None:
                raise UnrecordedCall(f"the recorded call has no output left for tool '{name}' with these arguments")
            if answer.error:
                error = answer.output.get("error") if isinstance(answer.output, dict) else None
                raise RecordedToolError(error if isinstance(error, str) else "the recorded call failed")
            return answer.output

        return body

    async def run_tool(
        self, call: CallSession, call_id: str, name: str, arguments: Any, **options: Unpack[ToolOptions]
    ) -> ToolOutcome:
        """Runs the call under calltape's guard, answered from the record (see :meth:`answer`)."""
        return await call.run_tool(call_id, name, arguments, self.answer(name, arguments, call_id), **options)


def _comparable(item: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must match for two context items to be "the same": call ids are the agents' own names and
    may differ between runs; arguments and outputs compare as canonical JSON."""
    kind = item.get("type")
    if kind == "function_call":
        return (kind, item.get("name"), canonical_arguments(item.get("arguments")))
    if kind == "function_call_output":
        return (kind, item.get("status"), orjson.dumps(item.get("output"), option=orjson.OPT_SORT_KEYS))
    if kind == "message":
        return (kind, item.get("role"), item.get("content"), bool(item.get("interrupted")))
    return (kind, orjson.dumps({k: v for k, v in item.items()}, option=orjson.OPT_SORT_KEYS))


def _settled_at(events: list[Event], after: int) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
    """The final context items and, for each, the (seq, at_ms) of the event that gave it its final form
    (an item already final at the fork point gets the fork point's)."""
    fold = ContextFold()
    last: list[dict[str, Any]] = []
    when: list[tuple[int, int]] = []
    for event in events:
        fold.apply(event)
        if (event.seq or fold.seq) < after:
            continue
        items = fold.native()["items"]
        for i, item in enumerate(items):
            if i >= len(last):
                last.append(item)
                when.append((fold.seq, event.at_ms))
            elif item != last[i]:
                last[i] = item
                when[i] = (fold.seq, event.at_ms)
    items = fold.native()["items"]
    return items, when[: len(items)]


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first context item where the new agent's context differs from the recorded one."""

    index: int
    """Position in the context (0 is the system message)."""
    recorded: dict[str, Any] | None
    """The recorded item (None: the recorded context has no item there)."""
    new: dict[str, Any] | None
    """The new agent's item (None: the new context stopped earlier)."""
    recorded_seq: int | None
    new_seq: int | None
    recorded_offset_ms: int | None
    """Time since the recorded session's start when the item took its final form (``recorded_seq``)."""
    new_offset_ms: int | None

    def kind(self) -> str:
        """What differs, without the call's words: ``assistant message``, ``function_call``…"""
        item = self.recorded or self.new or {}
        if item.get("type") == "message":
            return f"{item.get('role')} message"
        return str(item.get("type"))

    def describe(self, limit: int = 70) -> str:
        """Two lines, recorded then new, each item shortened to ``limit`` characters (``calltape diff`` style)."""
        from calltape.cli.common import offset
        from calltape.cli.inspect import describe_item

        def side(label: str, item: dict[str, Any] | None, seq: int | None, at: int | None) -> str:
            where = f"seq {seq}, {offset(at)}" if seq is not None and at is not None else "—"
            return f"  {label} ({where}): {describe_item(item, limit) if item is not None else '(nothing)'}"

        return "\n".join(
            [
                f"first difference at context item {self.index}:",
                side("recorded", self.recorded, self.recorded_seq, self.recorded_offset_ms),
                side("new     ", self.new, self.new_seq, self.new_offset_ms),
            ]
        )


@dataclass
class Replay:
    """What one replay did: the fork, both contexts, and where they part."""

    session: str
    into: str
    at: int
    recorded: list[dict[str, Any]]
    """The recorded call's final context items."""
    new: list[dict[str, Any]]
    """The new agent's final context items."""
    divergence: Divergence | None
    unanswered: list[str] = field(default_factory=list)
    """Call ids of tool calls the new agent made that the record could not answer."""
    events: list[Event] = field(default_factory=list)
    """The new session's events (the fork's prefix, then the new agent's)."""

    @property
    def same(self) -> bool:
        """Whether the new agent ended with the recorded context (call ids aside)."""
        return self.divergence is None

    def assert_same(self) -> None:
        """Raises ``AssertionError`` naming the first differing item's position, instants and kind; the
        items themselves (the call's words) go to stderr, where pytest shows them under the test."""
        d = self.divergence
        if d is None:
            return
        sys.stderr.write(f"calltape: replay of {self.session} at seq {self.at} into {self.into}\n{d.describe()}\n")
        raise AssertionError(
            f"the new agent's context differs from the recorded one at item {d.index} ({d.kind()}): "
            f"recorded seq {d.recorded_seq}, new seq {d.new_seq} (replayed into '{self.into}')"
        )


def _first_divergence(
    recorded: tuple[list[dict[str, Any]], list[tuple[int, int]]],
    new: tuple[list[dict[str, Any]], list[tuple[int, int]]],
    starts: tuple[int, int],
) -> Divergence | None:
    (a, a_at), (b, b_at) = recorded, new
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x is not None and y is not None and _comparable(x) == _comparable(y):
            continue
        ra = a_at[i] if x is not None and i < len(a_at) else None
        nb = b_at[i] if y is not None and i < len(b_at) else None
        return Divergence(
            index=i,
            recorded=x,
            new=y,
            recorded_seq=ra[0] if ra else None,
            new_seq=nb[0] if nb else None,
            recorded_offset_ms=ra[1] - starts[0] if ra else None,
            new_offset_ms=nb[1] - starts[1] if nb else None,
        )
    return None


async def replay(
    store: EventStore,
    session: str,
    agent: ReplayAgent,
    *,
    at: int,
    into: str | None = None,
    tools: Mapping[str, ToolSpec] | None = None,
) -> Replay:
    """Forks ``session`` at seq ``at`` into ``into`` (default: a new id), runs ``agent`` on the fork with
    the recorded tool outputs, and compares the new context with the recorded one.

    ``agent(call, recorded)`` continues the call as the changed agent would: feed it
    ``recorded.user_turns`` and run its tools through ``recorded.run_tool(call, …)``. Raises
    ``SessionNotFound``, and ``ForkRefused`` for a seq past the end or an ``into`` that has events.
    """
    from calltape.eventstore.recorder import Recorder

    into = into or f"{session}-replay-{at}-{uuid.uuid4().hex[:6]}"
    await fork_session(store, session, into, to_seq=at)
    original = await store.read(session)
    recorded = RecordedCall(original, at)
    recorder = Recorder(store)
    await recorder.start()
    try:
        call = await CallSession.attach(recorder, into, tools=tools)
        await agent(call, recorded)
        await recorder.flush()
    finally:
        await recorder.close()
    events = await store.read(into)
    recorded_items = _settled_at(original, at)
    new_items = _settled_at(events, at)
    starts = (original[0].at_ms if original else 0, events[0].at_ms if events else 0)
    return Replay(
        session=session,
        into=into,
        at=at,
        recorded=recorded_items[0],
        new=new_items[0],
        divergence=_first_divergence(recorded_items, new_items, starts),
        unanswered=list(recorded.unanswered),
        events=events,
    )
