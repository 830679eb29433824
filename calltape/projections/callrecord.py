"""The read model of one recorded call: its replies, tool calls, barge-ins and effects, in one pass.

Every reader of a finished (or running) call -- ``calltape check``'s rules, ``calltape show``'s
timeline, the timeline picture, the OpenTelemetry spans (:mod:`calltape.runtime.traces`, fed one
committed event at a time) -- used to walk the events type by type on its own and decide again
which reply an interruption cut, when a talk-over ends, which result came late. They now read a
:class:`CallRecord`: one pass that drives the :class:`~calltape.projections.ContextFold` (the only
authority on SPEC section 2: what a reply is, whether it is active, what was heard, a call's outcome)
and the :class:`~calltape.projections.effects.EffectLog` (SPEC section 8), and keeps beside them the
few times and seqs the section 7 rules measure. Each of those measurements is made here, once:

=============================  ====================================================================
what                           where
=============================  ====================================================================
a reply cut, and by which seq  ``CallRecord._cut`` (asks the fold, after the event)
late tokens                    ``CallRecord._on_reply_event`` (``agent.text`` after the cut)
talk-over interval             :class:`Playouts` (also the live latency figures' ``TALK_OVER``)
a late start, a second run     ``CallRecord._on_tool_event`` (``tool.started``: :class:`ToolStart`)
a late result                  ``CallRecord._on_tool_settled`` (after the barge-in, or a new turn)
an effect run again / unheard  ``CallRecord._effect_start`` (what the log held before it)
an effect left started         ``CallRecord._unsettled`` (at an end or a resume)
stale epoch                    ``CallRecord.apply``
=============================  ====================================================================

A record keeps a few seqs and times per reply, call and barge-in, and a call's arguments and output
(what ``show`` prints); the conversation's text stays in the fold, which keeps what the context
needs. It is incremental: :meth:`CallRecord.apply` folds one event and returns what that event did
(:class:`Applied`), which is what a reader drawing one row per event needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from calltape.events import Event
from calltape.projections.effects import EffectLog
from calltape.projections.fold import ContextFold
from calltape.projections.records import ReplyState, ToolCallState

__all__ = [
    "Applied",
    "BargeIn",
    "CallRecord",
    "EffectStart",
    "Playouts",
    "ReplySpan",
    "ToolCallSpan",
    "ToolStart",
    "UnsettledEffect",
    "read_call",
]


@dataclass(slots=True)
class ReplySpan:
    """One reply as the section 7 rules measure it: when it began, when it was cut, what kept coming."""

    reply: str
    seq: int
    """The event that began it (for the fold)."""
    at_ms: int
    own_at_ms: int | None = None
    """Its first own event (``agent.*`` naming it); None while only a tool call named it."""
    end_at_ms: int | None = None
    """The latest of its own events."""
    seqs: list[int] = field(default_factory=list)
    """Its own events, the interruptions aimed at it and the tool calls it carries."""
    interrupted_seq: int | None = None
    """The event that cut it (an ``interruption`` or an ``agent.speech.ended`` with ``interrupted``)."""
    interrupted_at_ms: int | None = None
    late_text_seqs: list[int] = field(default_factory=list)
    """``agent.text`` events after the cut (the fold ignores them: late tokens)."""
    speech_ended_at_ms: int | None = None
    """Its first ``agent.speech.ended``."""

    @property
    def anonymous(self) -> bool:
        """A reply the fold made up for a ``tool.call`` that named none (no event of its own)."""
        return self.reply.startswith("\x00")


@dataclass(slots=True)
class ToolStart:
    """One ``tool.started`` of a call."""

    seq: int
    at_ms: int
    epoch: int
    late: bool
    """The call's reply was already interrupted and the call had never started (``late-start``)."""
    after_result: bool
    """The call already had its ``tool.result`` (it ran again)."""


@dataclass(slots=True)
class ToolCallSpan:
    """A tool call: when it was asked for, each start, each settling event, and its outcome (the fold's)."""

    call: str
    name: str
    reply: str | None
    """The reply carrying it (the fold's choice: named, else the latest, else an anonymous one)."""
    seq: int
    at_ms: int
    timeout_s: float | None
    arguments: Any = None
    """As the ``tool.call`` gave them (the fold keeps the JSON text)."""
    seqs: list[int] = field(default_factory=list)
    """Its ``tool.*`` events (effects aside)."""
    starts: list[ToolStart] = field(default_factory=list)
    settles: list[tuple[int, int]] = field(default_factory=list)
    """(seq, at_ms) of every ``tool.result`` and ``tool.cancelled``."""
    result_seq: int | None = None
    late: tuple[str, int] | None = None
    """Its first settling event was a result that came late: ``("barge-in", seq)`` after its reply was
    cut, or ``("user", seq)`` after the user spoke again."""
    status: str = "in_progress"
    included: bool = True
    output: Any = None

    @property
    def started_at_ms(self) -> int | None:
        """Its first ``tool.started``."""
        return self.starts[0].at_ms if self.starts else None

    @property
    def end_at_ms(self) -> int | None:
        """Its first ``tool.result`` or ``tool.cancelled``."""
        return self.settles[0][1] if self.settles else None

    def duration_ms(self) -> int | None:
        """How long the tool ran (from its start, else from the call), once it ended."""
        end = self.end_at_ms
        if end is None:
            return None
        started = self.started_at_ms
        return end - (started if started is not None else self.at_ms)


@dataclass(slots=True)
class BargeIn:
    """An ``interruption`` that landed while its reply was playing, and when the playout stopped."""

    seq: int
    at_ms: int
    reply: str
    ended_at_ms: int | None = None
    """When the playout stopped: the reply's ``agent.speech.ended``, or the call ending or dropping."""
    ended_by: str | None = None
    """The type of the event that stopped it."""

    @property
    def talk_over_ms(self) -> int | None:
        """How long the agent kept talking over the caller (None: the playout never stopped)."""
        return None if self.ended_at_ms is None else self.ended_at_ms - self.at_ms

    @property
    def measured(self) -> bool:
        """The playout itself reported its end (a drop or the end of the call measures the outage)."""
        return self.ended_by == "agent.speech.ended"


class Playouts:
    """Which replies are playing, and the barge-ins waiting for their playout to stop.

    The one statement of the talk-over interval (SPEC section 7): it opens at an ``interruption`` that
    lands while its reply plays (speech started, or progress reported, and not stopped) and closes at
    that reply's ``agent.speech.ended`` -- or at a drop or the end of the call, which stop every
    playout. ``calltape check``'s ``talk-over`` and the ``interruption_to_agent_stopped`` figure both
    read it; it holds reply ids only.
    """

    __slots__ = ("_playing", "_stopped", "pending")

    def __init__(self) -> None:
        self._playing: set[str] = set()
        self._stopped: set[str] = set()
        self.pending: dict[str, BargeIn] = {}

    def playing(self, reply: str | None) -> bool:
        """Whether ``reply``'s playout started and has not stopped."""
        return reply in self._playing

    def start(self, reply: str) -> None:
        """``agent.speech.started`` or ``agent.speech.progress`` (progress implies the start)."""
        if reply not in self._stopped:
            self._playing.add(reply)

    def barge(self, reply: str, seq: int, at_ms: int, playing: bool) -> BargeIn | None:
        """An interruption aimed at ``reply``; ``playing``: whether it played just before. Opens a
        barge-in unless one is waiting already."""
        if not playing or reply in self.pending:
            return None
        barge = self.pending[reply] = BargeIn(seq, at_ms, reply)
        return barge

    def end(self, reply: str, at_ms: int, by: str = "agent.speech.ended") -> BargeIn | None:
        """The reply's playout stopped; returns the barge-in that closes, if any."""
        self._playing.discard(reply)
        self._stopped.add(reply)
        barge = self.pending.pop(reply, None)
        if barge is not None:
            barge.ended_at_ms, barge.ended_by = at_ms, by
        return barge

    def stop_all(self, at_ms: int, by: str) -> list[BargeIn]:
        """The transport went away (or the call ended): whatever was playing stopped with it."""
        closed = list(self.pending.values())
        for barge in closed:
            barge.ended_at_ms, barge.ended_by = at_ms, by
        self.pending.clear()
        self._stopped |= self._playing
        self._playing.clear()
        return closed


@dataclass(slots=True)
class EffectStart:
    """One ``tool.effect`` ``started`` (SPEC section 8) and what the log held when it came."""

    seq: int
    name: str
    call: str
    heard: bool
    earlier_seq: int | None
    """The previous ``started`` of the same ``(name, key)``, if any."""
    earlier_phase: str | None
    """The effect's latest phase before this ``started`` (None: never run)."""
    reply: str | None
    """The reply that carried the call (None: the call is not in the log)."""
    reply_played: bool
    """That reply had played to its end uninterrupted (a reply with no text: done, not interrupted)."""


@dataclass(slots=True)
class UnsettledEffect:
    """An effect still ``started`` at a ``session.ended`` or ``session.resumed``."""

    seq: int
    """Its ``started``."""
    name: str
    call: str
    at_seq: int
    at_type: str


@dataclass(frozen=True, slots=True)
class Applied:
    """What one event did to the record (for readers that draw a row per event)."""

    new: bool
    """False: a duplicate id, which never happened twice (nothing changed)."""
    target: str | None = None
    """The reply an ``interruption`` aims at (its own, else the latest), or the reply of a reply event."""
    cut: str | None = None
    """The reply this event interrupted (the fold decided it was active)."""
    ignored: bool = False
    """An ``interruption`` with no effect: nothing was playing, generating or running."""


_DUPLICATE: Final = Applied(False)
_NOTHING: Final = Applied(True)
_NOT_REPLY_EVENTS: Final = frozenset({"agent.handoff", "agent.instructions"})
_PLAYOUT_STOPS: Final = frozenset({"session.ended", "session.dropped"})


class CallRecord:
    """One call's read model, built event by event (see the module docstring)."""

    def __init__(self, session: str | None = None) -> None:
        self.fold = ContextFold(session)
        self.effects = EffectLog()
        self.replies: dict[str, ReplySpan] = {}
        """Every reply the fold knows, in the order they began."""
        self.calls: dict[str, ToolCallSpan] = {}
        """Every tool call, in ``tool.call`` order."""
        self.playouts = Playouts()
        self.barge_ins: list[BargeIn] = []
        self.stale: list[tuple[int, int, int]] = []
        """(seq, event epoch, session epoch) of every event written with an older epoch."""
        self.ended_seqs: list[int] = []
        self.dropped_seqs: list[int] = []
        self.resumed_seqs: list[int] = []
        self.user_turn_seqs: list[int] = []
        """Every final ``user.transcript`` and ``user.text`` (what the user said, not VAD)."""
        self.effect_starts: list[EffectStart] = []
        self.unsettled_effects: list[UnsettledEffect] = []
        self._reported: set[int] = set()
        self._early: dict[str, ReplySpan] = {}
        """Own events of replies the fold does not know yet (their times, for the picture)."""
        self.events = 0
        self.first_at_ms: int | None = None
        self.last_seq = 0
        self.last_at_ms: int | None = None
        self.last_type: str | None = None
        self.last_core_seq = 0
        self.last_core_at_ms: int | None = None
        self.last_core_type: str | None = None
        """The last event that is not an ``x.`` extension (bookkeeping records do not settle a drop)."""

    @property
    def session(self) -> str:
        """The session id (the first event's)."""
        return self.fold.session or ""

    @property
    def last_user_seq(self) -> int:
        """The latest user turn's seq (0: none yet)."""
        return self.user_turn_seqs[-1] if self.user_turn_seqs else 0

    def reply_state(self, reply: str) -> ReplyState | None:
        """The fold's state of one reply (active, heard, generated)."""
        return self.fold.reply_state(reply)

    def active(self, reply: str) -> bool:
        """Whether an interruption would cut ``reply`` now (the fold's rule, SPEC section 2)."""
        return self.fold.reply_active(reply)

    def tool_states(self) -> list[ToolCallState]:
        """The fold's state of every call (outcome, output, included)."""
        return self.fold.tool_calls()

    # -- folding ---------------------------------------------------------------------------------

    def apply(self, event: Event) -> Applied:
        """Folds one event into the record (and its fold and effect log)."""
        fold = self.fold
        etype = event.type
        data: dict[str, Any] = event.data
        epoch_before = fold.epoch
        target: str | None = None
        playing_before = False
        started_before = cut_before = False
        if etype == "interruption":
            rid = data.get("reply")
            target = rid if isinstance(rid, str) else fold.latest_reply()
            playing_before = self.playouts.playing(target)
        elif etype == "tool.started":
            cid = data.get("call")
            state = fold.tool_call(cid) if isinstance(cid, str) else None
            if state is not None:
                started_before = state.started
                owner = self.replies.get(state.reply)
                cut_before = owner is not None and owner.interrupted_seq is not None
        elif etype == "tool.effect" and data.get("phase") == "started":
            before = self.effects.get(str(data.get("name")), str(data.get("key")))
            earlier = (before.runs[-1].seq if before.runs else None, before.phase) if before else (None, None)
        ignored_before = fold.counters["interruptions_ignored"]
        if not fold.apply(event):
            return _DUPLICATE
        self.effects.apply(event)
        seq, at = fold.seq, event.at_ms
        self.events += 1
        if self.first_at_ms is None:
            self.first_at_ms = at
        self.last_seq, self.last_at_ms, self.last_type = seq, at, etype
        if not etype.startswith("x."):
            self.last_core_seq, self.last_core_at_ms, self.last_core_type = seq, at, etype
        if event.epoch is not None and epoch_before and event.epoch < epoch_before:
            self.stale.append((seq, event.epoch, epoch_before))

        if etype.startswith("agent.") and etype not in _NOT_REPLY_EVENTS:
            return self._on_reply_event(etype, data, seq, at)
        if etype == "interruption":
            return self._on_interruption(target, seq, at, playing_before, ignored_before)
        if etype.startswith("tool."):
            self._on_tool_event(etype, data, seq, at, started_before, cut_before, event)
            if etype == "tool.effect" and data.get("phase") == "started":
                self.effect_starts.append(self._effect_start(data, seq, *earlier))
        elif etype in _PLAYOUT_STOPS:
            self.playouts.stop_all(at, etype)
            (self.ended_seqs if etype == "session.ended" else self.dropped_seqs).append(seq)
        elif etype == "session.resumed":
            self.resumed_seqs.append(seq)
        elif etype == "user.text" or (etype == "user.transcript" and data.get("final")):
            self.user_turn_seqs.append(seq)
        if etype in ("session.ended", "session.resumed"):
            self._unsettled(seq, etype)
        return _NOTHING

    def _span(self, reply: str, seq: int, at: int) -> ReplySpan | None:
        span = self.replies.get(reply)
        if span is None and self.fold.reply_state(reply) is not None:
            span = self.replies[reply] = ReplySpan(reply, seq, at)
            early = self._early.pop(reply, None)
            if early is not None:  # its playout was reported before it began: drawn from there
                span.own_at_ms, span.end_at_ms, span.seqs = early.own_at_ms, early.end_at_ms, early.seqs
                span.speech_ended_at_ms = early.speech_ended_at_ms
        return span

    def _cut(self, span: ReplySpan, seq: int, at: int) -> bool:
        """Marks the reply cut by this event when the fold says it is now interrupted (first time)."""
        if span.interrupted_seq is not None:
            return False
        state = self.fold.reply_state(span.reply)
        if state is None or not state.interrupted:
            return False
        span.interrupted_seq, span.interrupted_at_ms = seq, at
        return True

    def _on_reply_event(self, etype: str, data: dict[str, Any], seq: int, at: int) -> Applied:
        rid = data.get("reply")
        if not isinstance(rid, str):
            return _NOTHING
        span = self._span(rid, seq, at)
        if span is None:  # a playout or done event naming a reply that has not begun: the fold ignores it
            early = self._early.get(rid)
            if early is None:
                early = self._early[rid] = ReplySpan(rid, seq, at, at)
            early.seqs.append(seq)
            early.end_at_ms = max(early.end_at_ms or at, at)
            if etype == "agent.speech.ended" and early.speech_ended_at_ms is None:
                early.speech_ended_at_ms = at
            return Applied(True, rid)
        span.seqs.append(seq)
        if span.own_at_ms is None:
            span.own_at_ms = at
        span.end_at_ms = at if span.end_at_ms is None else max(span.end_at_ms, at)
        cut = False
        if etype == "agent.text":
            if span.interrupted_seq is not None:
                span.late_text_seqs.append(seq)
        elif etype in ("agent.speech.started", "agent.speech.progress"):
            self.playouts.start(rid)
        elif etype == "agent.speech.ended":
            if span.speech_ended_at_ms is None:
                span.speech_ended_at_ms = at
            cut = self._cut(span, seq, at)
            self.playouts.end(rid, at)
        return Applied(True, rid, rid if cut else None)

    def _on_interruption(
        self, target: str | None, seq: int, at: int, playing_before: bool, ignored_before: int
    ) -> Applied:
        ignored = self.fold.counters["interruptions_ignored"] > ignored_before
        span = self.replies.get(target) if target is not None else None
        cut = False
        if span is not None:
            span.seqs.append(seq)
            cut = self._cut(span, seq, at)
            barge = self.playouts.barge(span.reply, seq, at, playing_before)
            if barge is not None:
                self.barge_ins.append(barge)
        return Applied(True, target, target if cut else None, ignored)

    def _on_tool_event(
        self, etype: str, data: dict[str, Any], seq: int, at: int, started_before: bool, cut_before: bool, event: Event
    ) -> None:
        cid = data.get("call")
        if not isinstance(cid, str):
            return
        if etype == "tool.call" and cid not in self.calls:
            self._on_tool_call(cid, data, seq, at)
            return
        call = self.calls.get(cid)
        if call is None or etype == "tool.effect":
            return
        call.seqs.append(seq)
        if etype == "tool.started":
            epoch = event.epoch if event.epoch is not None else max(self.fold.epoch, 1)
            late = cut_before and not started_before
            call.starts.append(ToolStart(seq, at, epoch, late, call.result_seq is not None))
        elif etype in ("tool.result", "tool.cancelled"):
            self._on_tool_settled(call, etype, seq, at)

    def _on_tool_call(self, cid: str, data: dict[str, Any], seq: int, at: int) -> None:
        state = self.fold.tool_call(cid)
        reply = state.reply if state is not None else None
        timeout = data.get("timeout")
        valid = isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0
        self.calls[cid] = ToolCallSpan(
            call=cid,
            name=str(data.get("name")),
            reply=reply,
            seq=seq,
            at_ms=at,
            timeout_s=float(timeout) if valid and timeout is not None else None,
            arguments=data.get("arguments"),
            seqs=[seq],
        )
        span = self._span(reply, seq, at) if reply is not None else None
        if span is not None:
            span.seqs.append(seq)

    def _on_tool_settled(self, call: ToolCallSpan, etype: str, seq: int, at: int) -> None:
        first = not call.settles
        call.settles.append((seq, at))
        if etype != "tool.result":
            return
        if call.result_seq is None:
            call.result_seq = seq
        if first:
            owner = self.replies.get(call.reply or "")
            if owner is not None and owner.interrupted_seq is not None:
                call.late = ("barge-in", owner.interrupted_seq)
            elif self.last_user_seq > call.seq:
                call.late = ("user", self.last_user_seq)

    def _effect_start(
        self, data: dict[str, Any], seq: int, earlier_seq: int | None, earlier_phase: str | None
    ) -> EffectStart:
        call = self.fold.tool_call(str(data.get("call")))
        reply = self.fold.reply_state(call.reply) if call is not None else None
        played = reply is not None and reply.played
        return EffectStart(
            seq=seq,
            name=str(data.get("name")),
            call=str(data.get("call")),
            heard=data.get("heard") is True,
            earlier_seq=earlier_seq,
            earlier_phase=earlier_phase,
            reply=call.reply if call is not None else None,
            reply_played=played,
        )

    def _unsettled(self, seq: int, etype: str) -> None:
        for running in self.effects.started():
            run = running.runs[-1]
            if run.seq not in self._reported:
                self._reported.add(run.seq)
                self.unsettled_effects.append(UnsettledEffect(run.seq, running.name, run.call, seq, etype))

    def settle(self) -> CallRecord:
        """Copies the fold's verdicts (outcome, output, included) onto the call spans; returns self.

        A call's outcome can change after its last event (its reply interrupted before it started
        cancels it), so readers call this once the events are in."""
        for state in self.fold.tool_calls():
            call = self.calls.get(state.call_id)
            if call is not None:
                call.status, call.included, call.output = state.status, state.included, state.output
        return self


def read_call(events: Iterable[Event], session: str | None = None) -> CallRecord:
    """The read model of one session's events (in seq order), settled."""
    record = CallRecord(session)
    apply = record.apply
    for event in events:
        apply(event)
    return record.settle()
