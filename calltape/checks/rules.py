"""The rules of ``calltape check`` (SPEC section 7), one function each, registered under its id.

A rule reads the :class:`~calltape.checks.facts.SessionFacts` of one session and yields its
violations. Ids are part of the contract; so is the seq each rule names. Messages name calls,
replies and tools by id and name only, never by their content (transcripts, arguments, outputs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from calltape.checks.facts import SessionFacts


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: the session, the seq of the event that breaks it, the rule id, a sentence."""

    session: str
    seq: int
    rule: str
    message: str

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` shape: ``{"session", "seq", "rule", "message"}``."""
        return {"session": self.session, "seq": self.seq, "rule": self.rule, "message": self.message}

    def __str__(self) -> str:
        return f"{self.session} {self.seq} {self.rule}: {self.message}"


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """The thresholds of the time-based rules (the CLI's options)."""

    talk_over_ms: int = 500
    stale_after_ms: int = 10 * 60 * 1000
    default_tool_timeout_s: float = 30.0
    now_ms: int | None = None
    """The current time for ``unsettled-drop``; None reads the clock."""


RuleFunction = Callable[[SessionFacts, CheckOptions], Iterator[Violation]]

Finding = tuple[int, str]
"""What a rule function may yield instead of a whole :class:`Violation`: the seq of the event that
breaks the rule, and the sentence. :func:`rule` adds the session and the rule's id, stated once."""

RuleBody = Callable[[SessionFacts, CheckOptions], Iterator[Violation | Finding]]


@dataclass(frozen=True, slots=True)
class Rule:
    """A registered rule: its contract id, a one-line summary and the function that applies it."""

    id: str
    summary: str
    apply: RuleFunction


RULES: dict[str, Rule] = {}
"""Every rule of SPEC section 7, by id, in the order they are documented."""


def rule(rule_id: str, summary: str) -> Callable[[RuleBody], RuleFunction]:
    """Registers a rule function under its id (the decorator every rule below uses).

    The function yields ``(seq, message)`` findings, which become violations of this rule in the facts'
    session (a :class:`Violation` it yields whole is passed on as it is). Returns the registered rule's
    function, which yields violations."""

    def register(body: RuleBody) -> RuleFunction:
        if rule_id in RULES:
            raise ValueError(f"rule '{rule_id}' is registered twice")

        @functools.wraps(body)
        def apply(facts: SessionFacts, options: CheckOptions) -> Iterator[Violation]:
            for found in body(facts, options):
                yield found if isinstance(found, Violation) else Violation(facts.session, found[0], rule_id, found[1])

        RULES[rule_id] = Rule(rule_id, summary, apply)
        return apply

    return register


def _call(name: str, call: str) -> str:
    return f"tool call '{name}' [{call}]"


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.1f} s"


@rule("orphan-call", "an included tool call never got a result or a cancel although the call ended or resumed")
def orphan_call(facts: SessionFacts, options: CheckOptions) -> Iterator[Finding]:
    """A call left open when the call ended (or was resumed and not run again) never reaches the LLM settled."""
    for call in facts.calls.values():
        if call.status != "in_progress" or not call.included:
            continue
        ended = next((s for s in facts.ended_seqs if s > call.seq), None)
        if ended is not None:
            yield (
                call.seq,
                f"{_call(call.name, call.call)} has no result and no cancel although the session ended at seq {ended}",
            )
            continue
        resumed = [s for s in facts.resumed_seqs if s > call.seq]
        if resumed and not any(start.seq > resumed[-1] for start in call.starts):
            yield (
                call.seq,
                f"{_call(call.name, call.call)} has no result and no cancel although the session was resumed "
                f"at seq {resumed[0]} (and the resumed agent did not run it again)",
            )


@rule("late-start", "a call of an interrupted reply started after the interruption")
def late_start(facts: SessionFacts, options: CheckOptions) -> Iterator[Finding]:
    """A call of a cancelled generation must never start (SPEC section 3); pipecat-ai#4997's shape."""
    for call in facts.calls.values():
        for start in call.starts:
            if start.late:
                reply = facts.replies.get(call.reply or "")
                where = f" at seq {reply.interrupted_seq}" if reply is not None and reply.interrupted_seq else ""
                yield (
                    start.seq,
                    f"{_call(call.name, call.call)} started after its reply [{call.reply}] was interrupted{where}: "
                    "a call of a cancelled generation ran",
                )


@rule("double-run", "a call id started twice within one epoch, or again after its result")
def double_run(facts: SessionFacts, options: CheckOptions) -> Iterator[Finding]:
    """A tool with side effects must run once per call id (a resume's retry in a new epoch aside)."""
    for call in facts.calls.values():
        first_in_epoch: dict[int, int] = {}
        for start in call.starts:
            if start.after_result:
                yield (
                    start.seq,
                    f"{_call(call.name, call.call)} started again after its result at seq {call.result_seq}",
                )
            elif start.epoch in first_in_epoch:
                yield (
                    start.seq,
                    f"{_call(call.name, call.call)} started a second time in epoch {start.epoch} "
                    f"(first start at seq {first_in_epoch[start.epoch]})",
                )
            first_in_epoch.setdefault(start.epoch, start.seq)


@rule("stale-epoch", "an event written with an epoch older than the session's")
def stale_epoch(facts: SessionFacts, options: CheckOptions) -> Iterator[Finding]:
    """A write from a fenced (zombie) agent got into the log."""
    for seq, epoch, current in facts.stale:
        yield (seq, f"an event of epoch {epoch} got in after the session reached epoch {current} (a zombie writer)")


@rule("talk-over", "the agent kept talking after a barge-in longer than the threshold")
def talk_over(facts: SessionFacts, options: CheckOptions) -> Iterator[Finding]:
    """The agent kept talking over the caller after the barge-in."""
    for barge in facts.barge_ins:
        if barge.ended_at_ms is None:
            yield (barge.seq, f"the playout of reply [{barge.reply}] never ended after the barge-in")
            continue
        late = barge.talk_over_ms
        if late is not None and late > options.talk_over_ms:
            yield (
                barge.seq,
                f"the agent kept talking {late} ms after the barge-in on reply [{barge.reply}] "
                f"(threshold {options.talk_over_ms} ms)",
            )


@rule("late-tokens", "text of a reply kept arriving after its interruption")
def late_tokens(facts: SessionFacts, options: CheckOptions) -> Iterator[Finding]:
    """The LLM kept generating for a cancelled reply (wasted tokens, a generation not cancelled)."""
    for reply in facts.replies.values():
        if reply.late_text_seqs:
            count = len(reply.late_text_seqs)
            yield (
                reply.late_text_seqs[0],
                f"{count} agent.text event{'s' if count != 1 else ''} for reply [{reply.reply}] after its "
                f"interruption at seq {reply.interrupted_seq} (the LLM was not cancelled)",
            )


@rule("unsettled-drop", "a dropped call that nobody resumed or ended")
def unsettled_drop(facts: SessionFacts, options: CheckOptions) -> Iterator[Finding]:
    """A dropped call nobody resumed or ended leaves its caller and its tools in limbo."""
    if facts.last_core_type != "session.dropped" or facts.last_core_at_ms is None:
        return
    from calltape.events import now_ms

    now = options.now_ms if options.now_ms is not None else now_ms()
    age = now - facts.last_core_at_ms
    if age > options.stale_after_ms:
        yield (
            facts.last_core_seq,
            f"the call dropped {_age(age)} ago and was never resumed or ended "
            f"(threshold {_age(options.stale_after_ms)})",
        )


def _age(ms: int) -> str:
    minutes = ms // 60_000
    if minutes < 1:
        return _seconds(ms)
    if minutes < 120:
        return f"{minutes} min"
    hours = minutes // 60
    return f"{hours} h" if hours < 48 else f"{hours // 24} days"


@rule("slow-tool", "a tool ran longer than its declared timeout (else 30 s)")
def slow_tool(facts: SessionFacts, options: CheckOptions) -> Iterator[Finding]:
    """A tool over its timeout means a caller waiting in silence."""
    last_at = facts.last_at_ms
    for call in facts.calls.values():
        limit_s = call.timeout_s if call.timeout_s is not None else options.default_tool_timeout_s
        limit_ms = limit_s * 1000
        for start in call.starts:
            end = next(((seq, at) for seq, at in call.settles if seq > start.seq), None)
            if end is not None:
                took = end[1] - start.at_ms
                how = f"ran {_seconds(took)}"
            else:
                took = (last_at or start.at_ms) - start.at_ms
                how = f"was still running after {_seconds(took)} at the session's last event"
            if took > limit_ms:
                which = "its declared timeout" if call.timeout_s is not None else "the default limit"
                yield (start.seq, f"{_call(call.name, call.call)} {how}, over {which} of {limit_s:g} s")
                break


# -- Effects (SPEC section 8) ---------------------------------------------------------------------
# Messages name the effect and its calls, never its key (an application's key may hold what it names).


@rule("double-effect", "a real-world action started again although its earlier run had not failed")
def double_effect(facts: SessionFacts, options: CheckOptions) -> Iterator[Finding]:
    """Only a ``failed`` run allows another: after ``done`` the recorded output answers, after ``started``
    or ``unknown`` the action may have happened (a card charged twice, a table booked twice)."""
    for start in facts.effect_starts:
        if start.earlier_seq is None or start.earlier_phase == "failed":
            continue
        yield (
            start.seq,
            f"effect '{start.name}' started again for call [{start.call}] although its run started at seq "
            f"{start.earlier_seq} is {start.earlier_phase} (only a failed run may be run again)",
        )


@rule("unheard-effect", "a heard-first action started before the reply announcing it played to its end")
def unheard_effect(facts: SessionFacts, options: CheckOptions) -> Iterator[Finding]:
    """The caller must hear the announcement (and have the chance to say stop) before the action runs."""
    for start in facts.effect_starts:
        if not start.heard or start.reply_played:
            continue
        if start.reply is None:
            why = f"its call [{start.call}] is not in the log"
        else:
            reply = facts.replies.get(start.reply)
            cut = reply.interrupted_seq if reply is not None else None
            why = (
                f"its reply [{start.reply}] was interrupted at seq {cut}"
                if cut is not None
                else f"its reply [{start.reply}] had not played to its end"
            )
        yield (start.seq, f"effect '{start.name}' of call [{start.call}] is heard first but started although {why}")


@rule("unsettled-effect", "a real-world action still started when the call ended or was resumed")
def unsettled_effect(facts: SessionFacts, options: CheckOptions) -> Iterator[Finding]:
    """Nobody knows whether the action happened: resume must settle it to ``unknown``, a run must end."""
    for fact in facts.unsettled_effects:
        where = "the session ended" if fact.at_type == "session.ended" else "the session was resumed"
        yield (
            fact.seq,
            f"effect '{fact.name}' of call [{fact.call}] was still started when {where} at seq {fact.at_seq}",
        )
