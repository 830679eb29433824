"""Resume (SPEC section 4): the plan, and the events that make the log alone reproduce it.

The plan is computed on a copy of the session's fold: every settling event is folded as it is
decided, so what the plan shows is exactly what ``context(session)`` will show once the events are
appended — by construction, not by a second implementation of the rules. The append carries
``expected_seq``: of two agents racing to resume one session, exactly one wins.

The plan's context is taken when the plan is made but rendered when first read (:class:`PlanContext`):
the settled part of a long call is kept as the encoded bytes the snapshot holds, so a resume costs the
tail and the live items, not the call; :meth:`ResumePlan.to_json_bytes` writes those bytes as they are.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import orjson

from calltape.errors import AlreadyResumed, ConcurrencyConflict, UnknownFormat
from calltape.events import Event, make_event
from calltape.eventstore import EventStore
from calltape.projections import ContextFold, SnapshotPolicy, ToolCallState, build_context, render
from calltape.projections.effects import EffectLog, effect_event_id
from calltape.projections.formats import FORMATS
from calltape.projections.snapshot import frozen_native_chunks
from calltape.runtime.effects import EffectReconcile, record_verdict
from calltape.runtime.recovery import RECOVERY_EVENT_TYPE, Recovery, RecoveryBus, recoveries
from calltape.runtime.toolspec import ToolSpec

_TOOL_EVENTS = frozenset({"tool.call", "tool.started", "tool.progress", "tool.result", "tool.cancelled"})


@dataclass(frozen=True, slots=True)
class ToolDecision:
    """What a resume decided for one tool call left open: ``reuse``, ``retry`` or ``unknown``."""

    call_id: str
    name: str
    status: str
    decision: str
    """``reuse`` (its result is in the log), ``retry`` (safe to run again under the same call id) or
    ``unknown`` (it may or may not have run: never re-run automatically)."""
    progress: Any = None
    has_progress: bool = False

    def to_json(self) -> dict[str, Any]:
        """The decision as the plan's JSON (``call_id``, ``name``, ``status``, ``decision``, ``progress?``)."""
        out: dict[str, Any] = {
            "call_id": self.call_id,
            "name": self.name,
            "status": self.status,
            "decision": self.decision,
        }
        if self.has_progress:
            out["progress"] = self.progress
        return out


_UNRENDERED: Any = object()


class PlanContext:
    """A fold's context at one instant, rendered in ``format`` when first asked for.

    Taking it costs the live items: the frozen ones stay the encoded chunks of the snapshot (a list
    copy of references, immutable), decoded only by :meth:`value`, and written as they are by
    :meth:`json_bytes`."""

    __slots__ = ("_chunks", "_format", "_head", "_value")

    def __init__(self, fold: ContextFold, format: str) -> None:
        if format not in FORMATS:
            raise UnknownFormat(f"unknown context format '{format}' (use one of: {', '.join(FORMATS)})")
        self._format = format
        self._head = fold.native(frozen=False)
        self._chunks = frozen_native_chunks(fold)
        self._value = _UNRENDERED

    def _native(self, frozen: list[Any]) -> dict[str, Any]:
        items = self._head["items"]
        return {**self._head, "items": [items[0], *frozen, *items[1:]]}

    def value(self) -> Any:
        """The context in the plan's format (rendered once, then the same object)."""
        if self._value is _UNRENDERED:
            frozen = orjson.loads(b"[" + b",".join(self._chunks) + b"]") if self._chunks else []
            self._value = render(self._native(frozen), self._format)
        return self._value

    def json_bytes(self) -> bytes:
        """The context as JSON; in the native format the frozen items are copied, never decoded."""
        if self._value is not _UNRENDERED or self._format != "native" or not self._chunks:
            return orjson.dumps(self.value())
        return orjson.dumps(self._native([orjson.Fragment(b",".join(self._chunks))]))


@dataclass(slots=True)
class ResumePlan:
    """What a resume did: the checkpoint, the new epoch, the settled context and the tool decisions."""

    session: str
    agent: str
    epoch: int
    checkpoint_seq: int
    resumed_at_seq: int
    rendered: PlanContext = field(repr=False)
    """The context, as taken when the plan was made (read it as :attr:`context`)."""
    tools: list[ToolDecision] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    """The settling events and ``session.resumed`` (with their seqs once appended)."""
    dry_run: bool = False
    fold: ContextFold | None = field(default=None, repr=False)

    @property
    def context(self) -> Any:
        """The settled context in the plan's format (rendered on first read)."""
        return self.rendered.value()

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON (what ``calltape resume`` prints)."""
        return self._body(self.context)

    def to_json_bytes(self) -> bytes:
        """:meth:`to_json` encoded; the context's settled items are copied as the bytes they are kept as."""
        return orjson.dumps(self._body(orjson.Fragment(self.rendered.json_bytes())))

    def _body(self, context: Any) -> dict[str, Any]:
        return {
            "session": self.session,
            "agent": self.agent,
            "epoch": self.epoch,
            "checkpoint_seq": self.checkpoint_seq,
            "resumed_at_seq": self.resumed_at_seq,
            "context": context,
            "tools": [t.to_json() for t in self.tools],
        }


class _Settler:
    """Builds the resume events on the session's fold, folding each one as it is decided.

    It takes the fold over: ``build_context`` made it for this resume alone, and copying a 50k-event
    fold would cost more than the rest of the resume."""

    def __init__(self, fold: ContextFold, agent: str, epoch: int) -> None:
        self.fold = fold
        self.agent, self.epoch = agent, epoch
        self.events: list[Event] = []

    def add(self, event_type: str, data: dict[str, Any], id: str | None = None) -> Event:
        assert self.fold.session is not None
        event = make_event(self.fold.session, event_type, data, id=id, agent=self.agent, epoch=self.epoch)
        event.seq = self.fold.seq + 1
        self.fold.apply(event)
        self.events.append(event)
        return event


async def _decide(call: ToolCallState, spec: ToolSpec | None, settler: _Settler) -> str:
    if call.status in ("completed", "error"):
        return "reuse"
    if call.status != "in_progress":
        return "reuse"  # settled already (timeout, cancelled, unknown): the recorded outcome stands
    if not call.started or (spec is not None and spec.idempotent):
        return "retry"  # never started (no side effects yet), or declared safe to repeat
    if spec is not None and spec.reconcile is not None:
        output = await spec.reconcile(call)
        if output is not None:
            settler.add("tool.result", {"call": call.call_id, "output": output, "reconciled": True})
            return "reuse"
    settler.add("tool.cancelled", {"call": call.call_id, "reason": "dropped", "outcome": "unknown"})
    return "unknown"


async def _settle_effects(tail: list[Event], hooks: Mapping[str, EffectReconcile], settler: _Settler) -> int:
    """Settles every effect the tail leaves ``started`` (SPEC section 8): the application's reconcile hook
    for its name may say ``done`` or ``failed``; otherwise ``unknown``, and it is never run again by
    itself. A run starts while its tool call is open, so it is in the tail after the checkpoint."""
    settled = 0
    for state in EffectLog.of(tail).started():
        run = state.runs[-1]
        hook = hooks.get(state.name)
        verdict = await hook(state.name, state.key) if hook is not None else None
        if verdict is not None:
            data = await record_verdict(None, state, run.call, verdict)
            settler.add("tool.effect", data, id=effect_event_id(state.name, state.key, state.failures, "settled"))
        else:
            data = {"call": run.call, "name": state.name, "key": state.key, "phase": "unknown"}
            settler.add("tool.effect", data, id=effect_event_id(state.name, state.key, state.failures, "unknown"))
        settled += 1
    return settled


def cut_replies(fold: ContextFold) -> list[tuple[str, dict[str, Any]]]:
    """The events that settle the replies a lost connection cut (a drop, a provider ending its session).

    A reply whose playout had started keeps what was heard so far; one still generating (or queued)
    was not heard at all."""
    settled: list[tuple[str, dict[str, Any]]] = []
    for reply in fold.open_replies():  # a list, taken before any settling event is folded
        if reply.speech_started:
            settled.append(("agent.speech.ended", {"reply": reply.reply, "interrupted": True, "heard": reply.heard}))
        else:
            settled.append(("interruption", {"reply": reply.reply, "cause": "system"}))
    return settled


RESUME_SNAPSHOTS = SnapshotPolicy(every=200)
"""A resume saves a snapshot once it folded 200 events past the last one (not the default 1,000): a call
dropped and resumed again and again adds a handful of events each time, and each resume read and folded
the whole tail since the last snapshot (up to 1,000 events, the largest part of a resume of a long call);
a save costs about 2 ms on PostgreSQL, and makes every later resume's tail short."""

RESUME_RETRY_SECONDS = 30.0
"""How long :func:`resume` keeps re-planning while the old writer is still appending."""


async def resume(
    store: EventStore,
    session: str,
    agent: str,
    *,
    dry_run: bool = False,
    tools: Mapping[str, ToolSpec] | None = None,
    instructions: str | None = None,
    format: str = "native",
    bus: RecoveryBus | None = None,
    take_over: bool = True,
    retry_for: float = RESUME_RETRY_SECONDS,
    effects: Mapping[str, EffectReconcile] | None = None,
) -> ResumePlan:
    """Settles what the drop left open and hands the session to ``agent`` at a new epoch.

    Works on a live session too (an operator moving a call): the old writer is fenced either way.
    While that writer still appends, the plan (made at one seq) loses the ``expected_seq`` race; it is
    then made again on the longer log, for up to ``retry_for`` seconds, until the resume lands and the
    old writer is fenced. Another *resume* winning in between is not retried: ``ConcurrencyConflict``.
    ``effects`` maps an effect name to the application's reconcile hook (SPEC section 8): an effect the
    drop left ``started`` is settled ``done``/``failed`` by it, else ``unknown``.
    ``take_over=False`` refuses (:class:`AlreadyResumed`) a call whose resumed agent is live (resumed
    and not dropped since), checked on the same read the plan is made from.
    Raises ``SessionNotFound``.
    """
    deadline = time.monotonic() + retry_for
    first_epoch: int | None = None
    conflict: ConcurrencyConflict | None = None
    attempt = 0
    while True:
        try:
            return await _resume_once(
                store, session, agent, dry_run, tools, instructions, format, bus, take_over, first_epoch, effects
            )
        except _LostToResume:
            assert conflict is not None
            raise conflict from None
        except _Replan as replan:
            conflict = replan.conflict
            first_epoch = replan.epoch if first_epoch is None else first_epoch
            if time.monotonic() >= deadline:
                raise conflict from None
        attempt += 1
        await asyncio.sleep(random.uniform(0, min(0.002 * attempt, 0.05)))


class _KeptReads:
    """The store as :func:`build_context` sees it, keeping the last events it read: the plan's tail
    (after the checkpoint) is the end of them, and reading it again cost each resume two more
    round trips (on SQLite two more transactions, a third of a short call's resume)."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self._after: int | None = None
        self._events: list[Event] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def read(self, session: str, **options: Any) -> list[Event]:
        """The store's read (:meth:`~calltape.eventstore.store.EventReader.read`'s options), kept when
        it is whole (no ``limit``, every type)."""
        events = await self._store.read(session, **options)
        if options.get("limit") is None and options.get("types") is None:
            self._after, self._events = options.get("after_seq", 0), events
        return events

    def tail(self, fold: ContextFold, checkpoint: int) -> list[Event] | None:
        """The events after ``checkpoint`` up to the fold's last one, if the fold was built from them
        (None: they were not all read, read them)."""
        if checkpoint == fold.seq:
            return []
        if self._after is None or self._after > checkpoint or not self._events or self._events[-1].seq != fold.seq:
            return None
        return [e for e in self._events if (e.seq or 0) > checkpoint]


class _LostToResume(Exception):
    """Re-planning found a higher epoch: another resume won the race."""


class _Replan(Exception):
    """The log moved under the plan (the old writer appended): plan again."""

    def __init__(self, conflict: ConcurrencyConflict, epoch: int) -> None:
        self.conflict, self.epoch = conflict, epoch


async def _resume_once(
    store: EventStore,
    session: str,
    agent: str,
    dry_run: bool,
    tools: Mapping[str, ToolSpec] | None,
    instructions: str | None,
    format: str,
    bus: RecoveryBus | None,
    take_over: bool,
    first_epoch: int | None,
    effects: Mapping[str, EffectReconcile] | None = None,
) -> ResumePlan:
    started = time.perf_counter()
    tools = tools or {}
    reads = _KeptReads(store)
    fold = await build_context(cast(EventStore, reads), session, snapshots=RESUME_SNAPSHOTS)
    checkpoint = fold.last_clean_seq
    base_seq = fold.seq
    # taken before any settling event is folded (those move fold.seq)
    kept = reads.tail(fold, checkpoint)
    # The fold tracks the epoch exactly as the store does (session.started opens 1, each
    # session.resumed raises it); a stale read loses to expected_seq below anyway.
    epoch = max(fold.epoch, 1)
    if not take_over and epoch > 1 and not fold.dropped:
        raise AlreadyResumed(session, fold.agent, epoch)
    if first_epoch is not None and epoch != first_epoch:
        raise _LostToResume  # another resume landed while we re-planned: that race had one winner
    settler = _Settler(fold, agent, epoch + 1)

    for event_type, data in cut_replies(fold):
        settler.add(event_type, data)

    tail = kept if kept is not None else await store.read(session, after_seq=checkpoint, to_seq=base_seq)
    settled_effects = await _settle_effects(tail, effects or {}, settler)
    tail_calls = list(dict.fromkeys(e.data["call"] for e in tail if e.type in _TOOL_EVENTS))
    decisions: list[ToolDecision] = []
    for call_id in tail_calls:
        call = settler.fold.tool_call(call_id)
        if call is None or not call.included:
            continue
        decision = await _decide(call, tools.get(call.name), settler)
        final = settler.fold.tool_call(call_id)
        assert final is not None
        decisions.append(ToolDecision(call_id, final.name, final.status, decision, final.progress, final.has_progress))

    resumed = settler.add("session.resumed", {"agent": agent, "epoch": settler.epoch, "from_seq": checkpoint})
    if instructions is not None:
        settler.add("agent.instructions", {"text": instructions})
    figures = {
        "checkpoint_seq": checkpoint,
        "settled": len(settler.events) - 1,
        "retry": sum(d.decision == "retry" for d in decisions),
        "unknown": sum(d.decision == "unknown" for d in decisions),
        "reuse": sum(d.decision == "reuse" for d in decisions),
        "effects_settled": settled_effects,
        "epoch": settler.epoch,
        "agent": agent,
    }
    settler.add(RECOVERY_EVENT_TYPE, {"kind": "resume", **figures})

    events = settler.events
    if not dry_run:
        # expected_seq: of two agents racing to resume, the second gets ConcurrencyConflict.
        try:
            events = await store.append(settler.events, expected_seq=base_seq)
        except ConcurrencyConflict as conflict:
            raise _Replan(conflict, epoch) from None
        figures["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
        (bus or recoveries).report(Recovery("resume", session, figures))
    assert resumed.seq is not None
    return ResumePlan(
        session=session,
        agent=agent,
        epoch=settler.epoch,
        checkpoint_seq=checkpoint,
        resumed_at_seq=resumed.seq,
        rendered=PlanContext(settler.fold, format),
        tools=decisions,
        events=events,
        dry_run=dry_run,
        fold=settler.fold,
    )


async def handoff(
    store: EventStore,
    session: str,
    to: str,
    *,
    instructions: str | None = None,
    reason: str | None = None,
    format: str = "native",
    bus: RecoveryBus | None = None,
) -> Any:
    """Hands a session to another agent from outside the live process: appends ``agent.handoff`` and
    returns the context the new agent starts with (calls and outputs kept, whatever its tools)."""
    fold = await build_context(store, session)
    data: dict[str, Any] = {"from": fold.agent or "", "to": to}
    if instructions is not None:
        data["instructions"] = instructions
    if reason is not None:
        data["reason"] = reason
    figures = {"from": data["from"], "to": to}
    event = make_event(session, "agent.handoff", data)
    # The recovery goes to the log with the handoff (as CallSession.handoff does), so `calltape stats`
    # counts it from the log alone.
    noted = make_event(session, RECOVERY_EVENT_TYPE, {"kind": "handoff", **figures}, agent=to)
    for stored in await store.append([event, noted], expected_seq=fold.seq):
        fold.apply(stored)
    (bus or recoveries).report(Recovery("handoff", session, figures))
    return render(fold.native(), format)
