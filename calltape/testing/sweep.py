"""Sweeping a user's *existing* tests under barge-in: the tests as written, then once per event boundary.

A team already has tests in its framework's own style; calltape runs them unchanged:

* :func:`sweep_livekit`: a LiveKit ``session.run(...)`` / ``RunResult`` test (``async with
  AgentSession(llm=...) as session: await session.start(agent); result = await session.run(user_input=...);
  result.expect...``), an ``async`` function taking no argument;
* :func:`sweep_pipecat_evals`: a Pipecat Evals scenario file (the YAML ``pipecat eval`` runs), against
  the user's pipeline.

Each is run once as written, then once per event boundary of that run with a barge-in landing there
(and, where the framework session can be rebuilt, once per tool call with the call dropped and resumed
while it runs: :func:`calltape.testing.explore.explore`). Every run is checked against every rule of
``calltape check`` (SPEC sections 7 and 8) with no assertion of the user's. The user's own
expectations are kept: they must hold on the run as written; on a run with a barge-in or a drop the
conversation is not the one they describe (the caller cut the agent off), so what they say there is
recorded (:attr:`Sweep.unmet`) and fails the sweep only with ``strict=True``.

The frameworks' runners need a network model (the agent's LLM; LiveKit's ``judge()``, Pipecat's judge
and simulated caller): the sweep drives the turns with calltape's offline stand-ins instead, a
:class:`~calltape.testing.script` of what the model says per turn, and leaves the judging out, each
such leaving-out counted in :attr:`Sweep.notes`.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from calltape.runtime import CallSession
from calltape.testing.explore import Exploration, Run, explore, set_barge_in
from calltape.testing.script import Step

__all__ = ["Sweep", "sweep_livekit"]


@dataclass
class Sweep:
    """One sweep of a user's existing test: the exploration, and what became of the test's own
    expectations on each run."""

    exploration: Exploration
    unmet: dict[str, str] = field(default_factory=dict)
    """By run session: the test's own expectation that did not hold there (its message)."""
    notes: list[str] = field(default_factory=list)
    """What the sweep did not keep of the test (a judge, timing budgets…), and why."""

    @property
    def runs(self) -> list[Run]:
        """Every run: the test as written first."""
        return self.exploration.runs

    @property
    def seconds(self) -> float:
        """How long the sweep took (wall clock)."""
        return self.exploration.seconds

    def assert_ok(self) -> None:
        """Fails on a broken rule in any run, or an expectation of the test broken on the run as written
        (on any run with ``strict``): :meth:`Exploration.assert_ok`."""
        self.exploration.assert_ok()


def _expectations(unmet: dict[str, str], strict: bool) -> Callable[[Run], None]:
    """The explore assertion that keeps the test's own expectations."""

    def kept(run: Run) -> None:
        message = unmet.get(run.session)
        if message is None:
            return
        if strict or (run.boundary is None and run.dropped is None):
            raise AssertionError(f"the test's own expectation failed: {message}")

    return kept


# ---------------------------------------------------------------------------------------------
# LiveKit: session.run / RunResult tests


@dataclass
class _LiveKitRun:
    call: CallSession
    turns: Sequence[Sequence[Step]]
    taps: list[Any] = field(default_factory=list)
    judged: int = 0


_LIVEKIT_RUN: contextvars.ContextVar[_LiveKitRun | None] = contextvars.ContextVar("calltape_livekit_run", default=None)


@contextlib.contextmanager
def _livekit_patched() -> Iterator[None]:
    """While a sweep runs, an ``AgentSession`` made in one of its runs gets the run's scripted LLM,
    is recorded into the run's call when it starts, and takes the run's barge-in as
    ``session.interrupt()``; ``judge()`` of a ``RunResult`` is not asked (it needs a network model):
    the message must still exist and have text, as LiveKit's judge requires first."""
    from livekit.agents import AgentSession
    from livekit.agents.voice.run_result import ChatMessageAssert

    from calltape.adapters.livekit import attach
    from calltape.testing.livekit import ScriptedLLM

    init, start, judge = AgentSession.__init__, AgentSession.start, ChatMessageAssert.judge

    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        run = _LIVEKIT_RUN.get()
        if run is not None:
            kwargs["llm"] = ScriptedLLM(run.turns)
        init(self, *args, **kwargs)

    async def patched_start(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = _LIVEKIT_RUN.get()
        if run is not None:
            run.taps.append(attach(self, run.call))
            set_barge_in(run.call, self.interrupt)
        return await start(self, *args, **kwargs)

    async def patched_judge(self: Any, llm_v: Any, *, intent: str) -> Any:
        run = _LIVEKIT_RUN.get()
        if run is None:
            return await judge(self, llm_v, intent=intent)
        run.judged += 1
        if not self._event.item.text_content:
            self._raise("The chat message is empty.")
        return self

    AgentSession.__init__ = patched_init  # type: ignore[method-assign]
    AgentSession.start = patched_start  # type: ignore[method-assign]
    ChatMessageAssert.judge = patched_judge  # type: ignore[method-assign]
    try:
        yield
    finally:
        AgentSession.__init__ = init  # type: ignore[method-assign]
        AgentSession.start = start  # type: ignore[method-assign]
        ChatMessageAssert.judge = judge  # type: ignore[method-assign]


async def sweep_livekit(
    test: Callable[[], Awaitable[Any]],
    *,
    llm: Sequence[Sequence[Step]],
    strict: bool = False,
    concurrency: int = 8,
    virtual_time: bool = True,
) -> Sweep:
    """Runs the LiveKit test ``test`` (unchanged: it makes its own ``AgentSession`` and agent, calls
    ``session.run`` and asserts on the ``RunResult``) as written, then once per event boundary with
    the caller cutting in there (``session.interrupt()``); checks every rule on every run.

    ``llm``: what the agent's model answers, turn by turn (:mod:`calltape.testing.script` steps), in
    place of the session's network model, in every run. Not kept: ``judge()`` (LLM-judged intent; the
    message must still have text), and drop runs (the test holds its session: nothing can rebuild it,
    and :attr:`Exploration.notes` says so)."""
    unmet: dict[str, str] = {}
    judged: list[int] = []

    async def scenario(call: CallSession) -> None:
        run = _LiveKitRun(call, llm)
        token = _LIVEKIT_RUN.set(run)
        try:
            await test()
        except AssertionError as exc:
            unmet[call.session_id] = _first_line(exc)
        finally:
            _LIVEKIT_RUN.reset(token)
            for tap in run.taps:
                await tap.drain()
            judged.append(run.judged)

    started = time.perf_counter()
    with _livekit_patched():
        exploration = await explore(
            scenario,
            assertions=_expectations(unmet, strict),
            concurrency=concurrency,
            virtual_time=virtual_time,
        )
    exploration.seconds = time.perf_counter() - started
    notes = [
        "no drop runs: the test holds its AgentSession, and nothing can rebuild it after a drop"
        if n.startswith("no drop runs")
        else n
        for n in exploration.notes
    ]
    if any(judged):
        notes.append(
            f"judge() not asked ({max(judged)} per run): it needs a network model; the judged message had to have text"
        )
    return Sweep(exploration, unmet, notes)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
