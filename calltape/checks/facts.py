"""One pass over a session's events that collects what the check rules read.

The pass drives the very :class:`~calltape.projections.ContextFold` that builds contexts, so
"included", "interrupted" and the epoch mean exactly what they mean in SPEC section 2: a rule can
never disagree with the projection about which reply a barge-in cancelled. The rules themselves
(:mod:`calltape.checks.rules`) are then small functions over these facts.

Memory is one session: the facts keep a few numbers per call, reply and interruption, never the
events' text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from calltape.events import Event
from calltape.projections.effects import EffectLog
from calltape.projections.fold import ContextFold


@dataclass(slots=True)
class StartFact:
    """One ``tool.started`` of a call."""

    seq: int
    at_ms: int
    epoch: int
    late: bool
    """The call's reply was already interrupted and the call had never started (``late-start``)."""
    after_result: bool
    """The call already had its ``tool.result`` (it ran again)."""


@dataclass(slots=True)
class CallFact:
    """A tool call as the rules see it."""

    call: str
    name: str
    reply: str | None
    seq: int
    at_ms: int
    timeout_s: float | None
    starts: list[StartFact] = field(default_factory=list)
    settles: list[tuple[int, int]] = field(default_factory=list)
    """(seq, at_ms) of every ``tool.result`` and ``tool.cancelled``."""
    result_seq: int | None = None
    status: str = "in_progress"
    included: bool = True


@dataclass(slots=True)
class ReplyFact:
    """A reply's barge-in history: when it was interrupted and what kept coming after."""

    reply: str
    interrupted_seq: int | None = None
    late_text_seqs: list[int] = field(default_factory=list)
    speech_started: bool = False
    speech_stopped: bool = False
    """``agent.speech.ended`` seen, or the call ended or dropped under the playout."""

    @property
    def playing(self) -> bool:
        """``agent.speech.started`` (or progress) seen and the playout has not stopped."""
        return self.speech_started and not self.speech_stopped


@dataclass(slots=True)
class BargeInFact:
    """An ``interruption`` that landed while its reply was playing."""

    seq: int
    at_ms: int
    reply: str
    ended_at_ms: int | None = None
    """When the playout stopped: the reply's ``agent.speech.ended``, or the call ending or dropping."""


@dataclass(slots=True)
class EffectStartFact:
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
class UnsettledEffectFact:
    """An effect still ``started`` at a ``session.ended`` or ``session.resumed``."""

    seq: int
    """Its ``started``."""
    name: str
    call: str
    at_seq: int
    at_type: str


@dataclass(slots=True)
class SessionFacts:
    """Everything the rules need about one session, collected in one pass."""

    session: str
    events: int = 0
    first_at_ms: int | None = None
    last_seq: int = 0
    last_at_ms: int | None = None
    last_type: str | None = None
    last_core_seq: int = 0
    last_core_at_ms: int | None = None
    last_core_type: str | None = None
    """The last event that is not an ``x.`` extension (bookkeeping records do not settle a drop)."""
    calls: dict[str, CallFact] = field(default_factory=dict)
    replies: dict[str, ReplyFact] = field(default_factory=dict)
    barge_ins: list[BargeInFact] = field(default_factory=list)
    stale: list[tuple[int, int, int]] = field(default_factory=list)
    """(seq, event epoch, session epoch) of every event written with an older epoch."""
    ended_seqs: list[int] = field(default_factory=list)
    dropped_seqs: list[int] = field(default_factory=list)
    resumed_seqs: list[int] = field(default_factory=list)
    effect_starts: list[EffectStartFact] = field(default_factory=list)
    unsettled_effects: list[UnsettledEffectFact] = field(default_factory=list)
    effects: EffectLog | None = None
    fold: ContextFold | None = None


_PLAYOUT_STOPS = frozenset({"session.ended", "session.dropped"})
_LOOK_BEFORE = frozenset({"interruption", "tool.started"})


def collect(events: Iterable[Event], session: str | None = None) -> SessionFacts:
    """Folds the events once and returns the facts (and the final fold, for the context checks)."""
    fold = ContextFold(session)
    apply = fold.apply
    replies: dict[str, ReplyFact] = {}
    calls: dict[str, CallFact] = {}
    pending_barge: dict[str, BargeInFact] = {}
    stale: list[tuple[int, int, int]] = []
    ended_seqs: list[int] = []
    dropped_seqs: list[int] = []
    resumed_seqs: list[int] = []
    barge_ins: list[BargeInFact] = []
    effects = EffectLog()
    effect_starts: list[EffectStartFact] = []
    unsettled: list[UnsettledEffectFact] = []
    reported: set[int] = set()  # started seqs already reported unsettled
    count = 0
    first: Event | None = None
    last: Event | None = None
    last_seq = 0
    last_core: Event | None = None
    last_core_seq = 0
    for event in events:
        etype = event.type
        data: dict[str, Any] = event.data
        event_epoch = event.epoch
        epoch_before = fold.epoch
        target: str | None = None
        playing_before = False
        call_started_before = False
        call_interrupted_before = False
        if etype in _LOOK_BEFORE:
            if etype == "interruption":
                rid = data.get("reply")
                target = rid if isinstance(rid, str) else fold.latest_reply()
                fact = replies.get(target) if target is not None else None
                playing_before = fact is not None and fact.playing
            else:
                cid = data.get("call")
                state = fold.tool_call(cid) if isinstance(cid, str) else None
                if state is not None:
                    call_started_before = state.started
                    owner = replies.get(state.reply)
                    call_interrupted_before = owner is not None and owner.interrupted_seq is not None
        if etype == "tool.effect" and data.get("phase") == "started":
            before = effects.get(str(data.get("name")), str(data.get("key")))
            start_before = (before.runs[-1].seq if before.runs else None, before.phase) if before else (None, None)
        if not apply(event):
            continue  # a duplicate id: it never happened twice
        effects.apply(event)
        seq = fold.seq
        count += 1
        if first is None:
            first = event
        last, last_seq = event, seq
        if not etype.startswith("x."):
            last_core, last_core_seq = event, seq
        if event_epoch is not None and epoch_before and event_epoch < epoch_before:
            stale.append((seq, event_epoch, epoch_before))

        if etype == "agent.text":
            rid = data.get("reply")
            if isinstance(rid, str):
                fact = replies.get(rid)
                if fact is None:
                    replies[rid] = ReplyFact(rid)
                elif fact.interrupted_seq is not None:
                    fact.late_text_seqs.append(seq)
        elif etype == "agent.reply.started":
            rid = data.get("reply")
            if isinstance(rid, str) and rid not in replies:
                replies[rid] = ReplyFact(rid)
        elif etype in ("agent.speech.started", "agent.speech.progress"):
            rid = data.get("reply")
            fact = replies.get(rid) if isinstance(rid, str) else None
            if fact is not None:
                fact.speech_started = True  # progress implies the playout started
        elif etype == "agent.speech.ended":
            rid = data.get("reply")
            fact = replies.get(rid) if isinstance(rid, str) else None
            if fact is not None:
                fact.speech_started = fact.speech_stopped = True
                _mark_interrupted(fold, fact, seq)
                barge = pending_barge.pop(fact.reply, None)
                if barge is not None:
                    barge.ended_at_ms = event.at_ms
        elif etype == "interruption":
            fact = replies.get(target) if target is not None else None
            if fact is not None:
                _mark_interrupted(fold, fact, seq)
                if playing_before and fact.reply not in pending_barge:
                    barge = BargeInFact(seq, event.at_ms, fact.reply)
                    pending_barge[fact.reply] = barge
                    barge_ins.append(barge)
        elif etype == "tool.call":
            cid = data.get("call")
            if isinstance(cid, str) and cid not in calls:
                state = fold.tool_call(cid)
                timeout = data.get("timeout")
                valid_timeout = isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0
                calls[cid] = CallFact(
                    call=cid,
                    name=str(data.get("name")),
                    reply=state.reply if state is not None else None,
                    seq=seq,
                    at_ms=event.at_ms,
                    timeout_s=float(timeout) if valid_timeout and timeout is not None else None,
                )
                if state is not None and state.reply not in replies:
                    replies[state.reply] = ReplyFact(state.reply)
        elif etype == "tool.started":
            cid = data.get("call")
            call = calls.get(cid) if isinstance(cid, str) else None
            if call is not None:
                epoch = event.epoch if event.epoch is not None else max(fold.epoch, 1)
                call.starts.append(
                    StartFact(
                        seq=seq,
                        at_ms=event.at_ms,
                        epoch=epoch,
                        late=call_interrupted_before and not call_started_before,
                        after_result=call.result_seq is not None,
                    )
                )
        elif etype in ("tool.result", "tool.cancelled"):
            cid = data.get("call")
            call = calls.get(cid) if isinstance(cid, str) else None
            if call is not None:
                call.settles.append((seq, event.at_ms))
                if etype == "tool.result" and call.result_seq is None:
                    call.result_seq = seq
        elif etype in _PLAYOUT_STOPS:
            # The transport went away (or the call ended): whatever was playing stopped with it.
            for barge in pending_barge.values():
                barge.ended_at_ms = event.at_ms
            pending_barge.clear()
            for fact in replies.values():
                if fact.speech_started:
                    fact.speech_stopped = True
            if etype == "session.ended":
                ended_seqs.append(seq)
            else:
                dropped_seqs.append(seq)
        elif etype == "session.resumed":
            resumed_seqs.append(seq)
        elif etype == "tool.effect" and data.get("phase") == "started":
            effect_starts.append(_effect_start(fold, data, seq, *start_before))
        if etype in ("session.ended", "session.resumed"):
            for running in effects.started():
                run = running.runs[-1]
                if run.seq not in reported:
                    reported.add(run.seq)
                    unsettled.append(UnsettledEffectFact(run.seq, running.name, run.call, seq, etype))
    facts = SessionFacts(
        session=fold.session or session or "",
        events=count,
        first_at_ms=first.at_ms if first is not None else None,
        last_seq=last_seq,
        last_at_ms=last.at_ms if last is not None else None,
        last_type=last.type if last is not None else None,
        last_core_seq=last_core_seq,
        last_core_at_ms=last_core.at_ms if last_core is not None else None,
        last_core_type=last_core.type if last_core is not None else None,
        barge_ins=barge_ins,
        stale=stale,
        ended_seqs=ended_seqs,
        dropped_seqs=dropped_seqs,
        resumed_seqs=resumed_seqs,
        effect_starts=effect_starts,
        unsettled_effects=unsettled,
        effects=effects,
        fold=fold,
    )
    for state in fold.tool_calls():
        call = calls.get(state.call_id)
        if call is not None:
            call.status, call.included = state.status, state.included
    facts.calls, facts.replies = calls, replies
    return facts


def _effect_start(
    fold: ContextFold, data: dict[str, Any], seq: int, earlier_seq: int | None, earlier_phase: str | None
) -> EffectStartFact:
    call = fold.tool_call(str(data.get("call")))
    reply = fold.reply_state(call.reply) if call is not None else None
    played = reply is not None and reply.played_out
    return EffectStartFact(
        seq=seq,
        name=str(data.get("name")),
        call=str(data.get("call")),
        heard=data.get("heard") is True,
        earlier_seq=earlier_seq,
        earlier_phase=earlier_phase,
        reply=call.reply if call is not None else None,
        reply_played=played,
    )


def _mark_interrupted(fold: ContextFold, fact: ReplyFact, seq: int) -> None:
    if fact.interrupted_seq is not None:
        return
    state = fold.reply_state(fact.reply)
    if state is not None and state.interrupted:
        fact.interrupted_seq = seq
