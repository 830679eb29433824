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
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from calltape.checks import CheckOptions, Violation
from calltape.errors import Interrupted
from calltape.events import Event
from calltape.eventstore import EventStore
from calltape.runtime import CallSession, ToolSpec
from calltape.testing.virtualtime import JumpingClockLoop

Scenario = Callable[[CallSession], Awaitable[None]]
"""The agent under test, driving one call."""

Assertion = Callable[["Run"], Any]
"""The user's own checks of one run (raise ``AssertionError``; may be async)."""

__all__ = ["Exploration", "Run", "explore", "set_barge_in"]

BargeIn = Callable[[], Any]
"""How a barge-in reaches the agent's framework (may return an awaitable)."""

_BARGE_INS: weakref.WeakKeyDictionary[CallSession, BargeIn] = weakref.WeakKeyDictionary()


def set_barge_in(call: CallSession, barge_in: BargeIn) -> None:
    """Makes exploration land its barge-ins on ``call`` through ``barge_in`` (a scripted caller
    speaking into the real pipeline) instead of recording an interruption on the call directly, so
    the framework's own interruption handling is what gets explored."""
    _BARGE_INS[call] = barge_in


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

    @property
    def failed(self) -> bool:
        """Whether this run broke an invariant or a user assertion."""
        return bool(self.violations or self.problems)

    def describe(self) -> str:
        """The instant and what broke there (ids and rule names only, never the call's words)."""
        if self.dropped is not None and self.after is None:
            where = f"a drop while tool call {self.dropped} ran (it did not land: the call finished first)"
        elif self.dropped is not None:
            where = f"a drop and resume while tool call {self.dropped} ran (landed after {self.after})"
        elif self.boundary is None:
            where = "the uninterrupted run"
        else:
            where = f"a barge-in at boundary {self.boundary} (landed after {self.after})"
        lines = [f"{where}:"]
        lines += [f"  {v}" for v in self.violations]
        lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)


@dataclass
class Exploration:
    """Every run of one exploration."""

    runs: list[Run]
    seconds: float
    notes: list[str] = field(default_factory=list)
    """What the exploration left out, and why (e.g. drop runs a framework caller cannot carry)."""

    @property
    def baseline(self) -> Run:
        """The uninterrupted run."""
        return self.runs[0]

    @property
    def failures(self) -> list[Run]:
        """The runs that broke something, in boundary order."""
        return [r for r in self.runs if r.failed]

    def assert_ok(self) -> None:
        """Raises ``AssertionError`` naming the first failing instant (its timeline goes to stderr)."""
        failures = self.failures
        if not failures:
            return
        first = failures[0]
        try:
            from calltape.testing import timeline_text

            sys.stderr.write(f"calltape: timeline of the first failing run ({first.describe().splitlines()[0]})\n")
            sys.stderr.write(timeline_text(first.events))
        except Exception as exc:  # the timeline is a courtesy: never hide the failure
            sys.stderr.write(f"calltape: timeline unavailable ({type(exc).__name__})\n")
        raise AssertionError(f"{len(failures)} of {len(self.runs)} runs failed; the first: {first.describe()}")


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
        original = call._fold

        def fold(event: Event) -> None:
            original(event)
            if event.type.startswith("x."):
                return
            self.count += 1
            self.types.append(event.type)
            if self.count == self.at:
                # A real barge-in arrives from another task, so it lands at the scenario's next await.
                asyncio.get_running_loop().call_soon(self._land)

        call._fold = fold  # type: ignore[method-assign]

    def _land(self) -> None:
        if {"session.ended", "session.dropped"} & set(self.types):
            return
        self.after = f"{self.types[-1]}, event {self.count}"
        barge_in = _BARGE_INS.get(self.call)
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
    from calltape.testing import invariant_violations
    from calltape.testing.dropresume import DropHook, carries_drops

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
        hook.uncarried = call in _BARGE_INS and not carries_drops(call)
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

    Returns every run; call :meth:`Exploration.assert_ok` to fail a test on the first broken instant.
    """
    from calltape.eventstore import open_store

    if virtual_time:
        from calltape.testing.virtualtime import run_in_virtual_time

        return await run_in_virtual_time(
            lambda: explore(
                scenario,
                assertions=assertions,
                agent=agent,
                options=options,
                concurrency=concurrency,
                tools=tools,
                drops=drops,
            )
        )
    checks = [assertions] if callable(assertions) else list(assertions or [])
    started = time.perf_counter()
    store = await open_store("sqlite://")  # one private in-memory store; each run is its own session
    try:
        return await _explore(store, scenario, checks, agent, options, concurrency, started, tools, drops)
    finally:
        await store.close()


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
