"""Barge-in exploration: run an agent's scenario once, then once per event boundary with a barge-in
landing exactly there, and once per tool call with the call dropped and resumed while it runs; check
every run.

A scenario is an ``async`` function that drives a :class:`~calltape.runtime.CallSession` the way the
agent does (a scripted caller and a scripted LLM emitting events, the agent's real tools under
``call.run_tool`` or not). The uninterrupted run fixes the boundaries: after its k-th event, run k
records an ``interruption`` of the latest reply at the scenario's first ``await`` after that event
(where a barge-in from the transport can really land), and lets the scenario carry on. Each run is
its own session in one private in-memory store; runs go concurrently. Every run is checked with
:func:`calltape.testing.invariant_violations` (the ``calltape check`` rules and the context
invariants) and with the user's own assertions. The drop runs are
:mod:`calltape.testing.dropresume`'s: the writer stops mid-tool, the session is resumed from the log
and the scenario carries on on the resumed call (a framework caller that registered itself with
:func:`calltape.testing.dropresume.set_drop_carrier` loses its framework session at the drop and
carries the call on on a new one).

An agent on a real framework lands its barge-ins through the framework: its scripted caller registers
itself with :func:`set_barge_in` (:class:`calltape.testing.pipecat.PipecatCaller` and
:class:`calltape.testing.livekit.LiveKitCaller` do), and at run k the caller starts talking over the
bot instead of the interruption being written on the call directly.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from calltape.checks import CheckOptions, Violation
from calltape.errors import Interrupted
from calltape.events import Event
from calltape.eventstore import EventStore
from calltape.projections.effects import EffectLog, EffectState
from calltape.projections.fold import ContextFold
from calltape.runtime import CallSession, ToolSpec
from calltape.testing.quiet import in_harness_run, quieted
from calltape.testing.virtualtime import JumpingClockLoop

Scenario = Callable[[CallSession], Awaitable[None]]
"""The agent under test, driving one call."""

Assertion = Callable[["Run"], Any]
"""The user's own checks of one run (raise ``AssertionError``; may be async)."""

__all__ = ["USER_ASSERTION", "Exploration", "Run", "explore", "set_barge_in"]

BargeIn = Callable[[], Any]
"""How a barge-in reaches the agent's framework (may return an awaitable)."""


class _BargeInPart:
    """The call's own slot (:meth:`CallSession.part`) for how its barge-ins reach the framework."""

    def __init__(self, call: CallSession) -> None:
        self.barge_in: BargeIn | None = None


def set_barge_in(call: CallSession, barge_in: BargeIn) -> None:
    """Makes exploration land its barge-ins on ``call`` through ``barge_in`` (a scripted caller
    speaking into the real pipeline) instead of recording an interruption on the call directly, so
    the framework's own interruption handling is what gets explored."""
    call.part(_BargeInPart).barge_in = barge_in


def _barge_in_of(call: CallSession) -> BargeIn | None:
    return call.part(_BargeInPart).barge_in


@dataclass
class Run:
    """One run of the scenario: where the barge-in landed, what was recorded, what went wrong."""

    boundary: int | None
    """None: the uninterrupted run; k: the barge-in landed right after the run's k-th event."""
    after: str | None = None
    """The type of the event the barge-in followed."""
    events: list[Event] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)
    """The final ``native`` context of the call."""
    violations: list[Violation] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """The user's failed assertions and unexpected exceptions of the scenario."""
    interrupted: bool = False
    """The scenario stopped on :class:`~calltape.runtime.Interrupted` (an agent giving up its turn)."""
    dropped: str | None = None
    """A drop run: the call id that was running when the call was dropped (then resumed)."""
    resume: dict[str, Any] | None = None
    """A drop run: the resume plan's JSON (checkpoint, epoch, tool decisions)."""
    _folded: ContextFold | None = field(default=None, repr=False, compare=False)

    @property
    def failed(self) -> bool:
        """Whether this run broke an invariant or a user assertion."""
        return bool(self.violations or self.problems)

    @property
    def session(self) -> str:
        """The run's session id in the exploration's store."""
        return self.events[0].session if self.events else ""

    # -- what a user's own assertion needs ------------------------------------------------------

    def _fold(self) -> ContextFold:
        if self._folded is None or self._folded.seq != (self.events[-1].seq if self.events else 0):
            fold = ContextFold()
            for event in self.events:
                fold.apply(event)
            self._folded = fold
        return self._folded

    def reply_of(self, call: str) -> str | None:
        """The reply that carried the tool call ``call`` (None: no such call)."""
        state = self._fold().tool_call(call)
        return state.reply if state is not None else None

    def heard(self, reply: str) -> str:
        """The text of ``reply`` the caller heard (the context's, SPEC section 2 rule 3)."""
        state = self._fold().reply_state(reply)
        return state.heard if state is not None else ""

    def played(self, reply: str) -> bool:
        """Whether ``reply`` played to its end uninterrupted (a reply with no text: once it was done
        with no interruption), the condition a heard-first effect waits for (SPEC section 8)."""
        state = self._fold().reply_state(reply)
        if state is None or state.interrupted:
            return False
        return state.speech_ended or (state.done and not state.generated)

    def calls(self, name: str) -> list[str]:
        """The call ids of tool ``name`` in this run, in order."""
        return [e.data["call"] for e in self.events if e.type == "tool.call" and e.data.get("name") == name]

    def effects(self, name: str) -> list[EffectState]:
        """The effects named ``name`` (``calltape.effect(name, key, ...)``: the action, not the tool that
        runs it), one per key, in the order first recorded, as
        SPEC section 8 folds them (:class:`~calltape.projections.effects.EffectLog`): each with its latest
        phase, its runs (the call and seq of every ``started``, and what became of it) and its output."""
        return [state for state in EffectLog.of(self.events) if state.name == name]

    # -- the report -----------------------------------------------------------------------------

    @property
    def where(self) -> str:
        """Where the barge-in or the drop landed, in words."""
        if self.dropped is not None and self.after is None:
            return f"a drop while tool call {self.dropped} ran (it did not land: the call finished first)"
        if self.dropped is not None:
            return f"a drop and resume while tool call {self.dropped} ran (landed after {self.after})"
        if self.boundary is None:
            return "the uninterrupted run"
        return f"a barge-in at boundary {self.boundary} (landed after {self.after})"

    @property
    def landed_seq(self) -> int | None:
        """The seq of the run's first barge-in or drop in the log (None: none was recorded)."""
        kinds = ("session.dropped",) if self.dropped is not None else ("interruption", "session.dropped")
        return next((e.seq for e in self.events if e.type in kinds), None)

    def describe(self) -> str:
        """The instant and what broke there (ids and rule names only, never the call's words)."""
        lines = [f"{self.where}:"]
        lines += [f"  {v}" for v in self.violations]
        lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)


USER_ASSERTION = "assertion"
"""The report's group of runs that broke the user's own assertions (or whose scenario raised)."""


@dataclass
class Exploration:
    """Every run of one exploration."""

    runs: list[Run]
    seconds: float
    notes: list[str] = field(default_factory=list)
    """What the exploration left out, and why (e.g. drop runs a framework caller cannot carry)."""
    silenced: dict[str, int] = field(default_factory=dict)
    """The framework's log messages the exploration kept quiet, by message, with how many times: expected
    consequences of its own barge-ins and drops (:mod:`calltape.testing.quiet`)."""

    @property
    def baseline(self) -> Run:
        """The uninterrupted run."""
        return self.runs[0]

    @property
    def failures(self) -> list[Run]:
        """The runs that broke something, in boundary order."""
        return [r for r in self.runs if r.failed]

    def by_rule(self) -> dict[str, list[tuple[Run, int | None]]]:
        """Every failing run grouped by the rule it broke (``assertion``: the user's own), each with the
        seq the rule names (for an assertion: where the barge-in or drop was recorded); a run that
        breaks several rules is in each group. Rules in their documented order."""
        from calltape.checks import RULES

        groups: dict[str, list[tuple[Run, int | None]]] = {}
        for run in self.failures:
            for violation in run.violations:
                groups.setdefault(violation.rule, []).append((run, violation.seq))
            if run.problems:
                groups.setdefault(USER_ASSERTION, []).append((run, run.landed_seq))
        order = [*RULES, "context", USER_ASSERTION]
        return dict(sorted(groups.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))

    def summary(self) -> str:
        """Every failing run, grouped by rule: where it landed, the seq and the sentence (ids and rule
        names only, never the call's words: fit for an exception message or a log line)."""
        failures = self.failures
        lines = [f"{len(failures)} of {len(self.runs)} runs failed"]
        for rule_id, entries in self.by_rule().items():
            lines.append(f"{rule_id} ({len(entries)} run{'s' if len(entries) != 1 else ''}):")
            for run, seq in entries:
                at = f"seq {seq}" if seq is not None else "no seq"
                if rule_id == USER_ASSERTION:  # first lines only: pytest's assertion detail is in the report
                    lines += [
                        f"  {run.where}, {at}: {p.strip().splitlines()[0] if p.strip() else p}" for p in run.problems
                    ]
                else:
                    lines += [
                        f"  {run.where}, seq {v.seq}: {v.message}"
                        for v in run.violations
                        if v.rule == rule_id and v.seq == seq
                    ][:1]
        return "\n".join(lines)

    def report(self, *, radius: int = 6) -> str:
        """:meth:`summary` with, under each entry, the run's timeline around the seq it names (that seq
        marked ``▶``). The timelines show the call's words: print the report, never log it."""
        from calltape.testing.invariants import timeline_text

        failures = self.failures
        lines = [f"{len(failures)} of {len(self.runs)} runs failed ({self.seconds:.1f} s)"]
        lines += [f"note: {n}" for n in self.notes]
        if self.silenced:
            count = sum(self.silenced.values())
            lines.append(f"note: {count} expected framework log message{'s' if count != 1 else ''} kept quiet")
        for rule_id, entries in self.by_rule().items():
            lines.append("")
            lines.append(f"== {rule_id}: {len(entries)} run{'s' if len(entries) != 1 else ''}")
            for run, seq in entries:
                found = [v.message for v in run.violations if v.rule == rule_id and v.seq == seq]
                what = found[:1] if rule_id != USER_ASSERTION else run.problems
                lines.append(f"-- {run.session}: {run.where}; seq {seq if seq is not None else '-'}")
                lines += [f"   {w}" for w in what]
                if seq is not None:
                    try:
                        lines.append(timeline_text(run.events, around=seq, radius=radius).rstrip())
                    except Exception as exc:  # the timeline is a courtesy: never hide the failure
                        lines.append(f"   (timeline unavailable: {type(exc).__name__})")
        return "\n".join(lines)

    def assert_ok(self) -> None:
        """Raises ``AssertionError`` listing every failing run grouped by rule (:meth:`summary`); the
        report with the timelines goes to stderr, where pytest shows it under the failing test."""
        if not self.failures:
            return
        sys.stderr.write(f"calltape: exploration report\n{self.report()}\n")
        raise AssertionError(self.summary())


class _BargeIn:
    """Counts the events a run records and lands the barge-in right after the k-th one."""

    def __init__(self, call: CallSession, at: int | None) -> None:
        self.call = call
        self.at = at
        self.count = 1  # session.started, recorded before the scenario runs
        self.after: str | None = None
        self.landing: asyncio.Future[Any] | None = None
        self.types: list[str] = ["session.started"]
        self.uncarried = False
        """A framework caller lands barge-ins on this call but cannot carry a drop over."""
        call.add_listener(self._folded)

    def _folded(self, event: Event) -> None:
        if event.type.startswith("x."):
            return
        self.count += 1
        self.types.append(event.type)
        if self.count == self.at:
            # A real barge-in arrives from another task, so it lands at the scenario's next await.
            asyncio.get_running_loop().call_soon(self._land)

    def _land(self) -> None:
        if {"session.ended", "session.dropped"} & set(self.types):
            return
        self.after = f"{self.types[-1]}, event {self.count}"
        barge_in = _barge_in_of(self.call)
        if barge_in is None:
            self.call.interrupt(cause="user_speech")
            return
        result = barge_in()
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            self.landing = asyncio.ensure_future(result)


async def _one_run(
    store: EventStore,
    scenario: Scenario,
    at: int | None,
    *,
    agent: str,
    assertions: list[Assertion],
    options: CheckOptions | None,
    tools: Mapping[str, ToolSpec] | None = None,
    drop: tuple[int, str] | None = None,
) -> tuple[Run, _BargeIn]:
    from calltape.eventstore.recorder import Recorder
    from calltape.testing.dropresume import DropHook, carries_drops
    from calltape.testing.invariants import invariant_violations

    in_harness_run(at is not None or drop is not None)
    run = Run(boundary=at, dropped=drop[1] if drop else None)
    if isinstance(asyncio.get_running_loop(), JumpingClockLoop):
        # on a virtual clock every timer fires as soon as the loop waits on the database's thread, so
        # the recorder's give-up timers would fire at once: the store is the test's own, so wait
        recorder = Recorder(store, close_timeout=None, durable_timeout=None)
    else:
        recorder = Recorder(store)
    await recorder.start()
    session = "explored-baseline" if at is None else f"explored-at-{at}"
    if drop is not None:
        session = f"explored-drop-{drop[0]}"
    dropping: DropHook | None = None
    try:
        call = await CallSession.start(recorder, session, agent=agent, tools=tools)
        hook = _BargeIn(call, at)
        if drop is not None:
            dropping = DropHook(call, store, recorder, drop[1], agent)
        try:
            await scenario(call)
        except Interrupted:
            run.interrupted = True
        except Exception as exc:
            run.problems.append(f"the scenario raised {type(exc).__name__}")
        if hook.landing is not None:
            try:
                await hook.landing
            except Exception as exc:
                run.problems.append(f"the barge-in raised {type(exc).__name__}")
        if dropping is not None:
            await dropping.finish()
            if dropping.error is not None:
                run.problems.append(f"the drop and resume raised {type(dropping.error).__name__}")
        if not {"session.ended", "session.dropped"} & set(hook.types):
            await call.end("scenario finished")
        hook.uncarried = _barge_in_of(call) is not None and not carries_drops(call)
    finally:
        await recorder.close()
    run.after = hook.after if dropping is None else dropping.after
    if dropping is not None and dropping.plan is not None:
        run.resume = dropping.plan.to_json()
    run.events = await store.read(session)
    run.context = call.fold.native()
    run.violations = invariant_violations(run.events, session, options)
    for check in assertions:
        try:
            result = check(run)
            if asyncio.iscoroutine(result):
                await result
        except AssertionError as exc:
            run.problems.append(f"assertion failed: {exc}" if str(exc) else "an assertion failed")
    return run, hook


async def explore(
    scenario: Scenario,
    *,
    assertions: Assertion | list[Assertion] | None = None,
    agent: str = "agent",
    options: CheckOptions | None = None,
    concurrency: int = 16,
    tools: Mapping[str, ToolSpec] | None = None,
    drops: bool = True,
    virtual_time: bool = False,
) -> Exploration:
    """Runs ``scenario`` uninterrupted, then once per event boundary with a barge-in there, then (unless
    ``drops=False``) once per tool call of the uninterrupted run with the call dropped and resumed while
    that tool runs. ``tools`` are the calls' tool specs (resume reads ``idempotent`` and ``reconcile``).
    A framework caller that cannot carry a drop over to a new session gets no drop runs, and
    :attr:`Exploration.notes` says so.

    Every run is checked against every rule of ``calltape check`` (:data:`calltape.checks.RULES`, so a
    rule added there applies here) and the context invariants, with no assertion of the user's; then
    against ``assertions``. The framework messages that are expected consequences of the barge-ins and
    drops are kept quiet meanwhile (:mod:`calltape.testing.quiet`).

    Returns every run; :meth:`Exploration.assert_ok` fails a test listing every failing run by rule,
    :meth:`Exploration.report` adds each one's timeline around the seq its rule names.
    """
    from calltape.eventstore import open_store

    checks = [assertions] if callable(assertions) else list(assertions or [])

    async def here() -> Exploration:
        started = time.perf_counter()
        store = await open_store("sqlite://")  # one private in-memory store; each run is its own session
        try:
            return await _explore(store, scenario, checks, agent, options, concurrency, started, tools, drops)
        finally:
            await store.close()

    with quieted() as silenced:
        if virtual_time:
            from calltape.testing.virtualtime import run_in_virtual_time

            exploration = await run_in_virtual_time(here)
        else:
            exploration = await here()
    exploration.silenced = dict(silenced)
    return exploration


async def _explore(
    store: EventStore,
    scenario: Scenario,
    checks: list[Assertion],
    agent: str,
    options: CheckOptions | None,
    concurrency: int,
    started: float,
    tools: Mapping[str, ToolSpec] | None = None,
    drops: bool = False,
) -> Exploration:
    from calltape.testing.dropresume import started_calls

    baseline, hook = await _one_run(store, scenario, None, agent=agent, assertions=checks, options=options, tools=tools)
    types = hook.types
    boundaries = [
        k for k, kind in enumerate(types, start=1) if k > 1 and kind not in ("session.ended", "session.dropped")
    ]
    gate = asyncio.Semaphore(max(1, concurrency))

    async def bounded(k: int) -> Run:
        async with gate:
            run, _ = await _one_run(store, scenario, k, agent=agent, assertions=checks, options=options, tools=tools)
            return run

    async def dropped(n: int, call_id: str) -> Run:
        async with gate:
            run, _ = await _one_run(
                store, scenario, None, agent=agent, assertions=checks, options=options, tools=tools, drop=(n, call_id)
            )
            return run

    calls = started_calls(baseline.events) if drops else []
    notes: list[str] = []
    if calls and hook.uncarried:
        notes.append(
            f"no drop runs ({len(calls)} tool call{'s' if len(calls) != 1 else ''} started): the scenario's "
            "framework caller does not carry a drop over to a new session (PipecatCaller: pass rebuild=)"
        )
        calls = []
    runs = await asyncio.gather(
        *(bounded(k) for k in boundaries), *(dropped(n, c) for n, c in enumerate(calls, start=1))
    )
    return Exploration([baseline, *runs], time.perf_counter() - started, notes)
