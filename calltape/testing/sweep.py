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

from calltape.checks import CheckOptions
from calltape.runtime import CallSession
from calltape.testing.explore import Exploration, Run, explore, set_barge_in
from calltape.testing.script import Step

__all__ = ["Sweep", "sweep_livekit", "sweep_pipecat_evals"]


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


def _expectations(
    unmet: dict[str, str], strict: bool, evaluate: Callable[[Run], str | None] | None = None
) -> Callable[[Run], None]:
    """The explore assertion that keeps the test's own expectations: ``evaluate`` (when the sweep
    checks them on the recorded events) or what the run's test itself raised (in ``unmet``)."""

    def kept(run: Run) -> None:
        if evaluate is not None:
            found = evaluate(run)
            if found is not None:
                unmet[run.session] = found
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
    options: CheckOptions | None = None,
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
            options=options,
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


# ---------------------------------------------------------------------------------------------
# Pipecat Evals: a scenario file


_EVENTS: dict[str, tuple[str, ...]] = {
    "user_started_speaking": ("user.speech.started",),
    "vad_user_started_speaking": ("user.speech.started",),
    "user_stopped_speaking": ("user.speech.stopped",),
    "vad_user_stopped_speaking": ("user.speech.stopped",),
    "user_transcription": ("user.transcript",),
    "llm_started": ("agent.reply.started",),
    "llm_response": ("agent.reply.done",),
    "response": ("agent.reply.done",),
    "tts_response": ("agent.speech.ended",),
    "bot_started_speaking": ("agent.speech.started",),
    "bot_stopped_speaking": ("agent.speech.ended",),
    "function_call": ("tool.call",),
    "function_call_stopped": ("tool.result", "tool.cancelled"),
    "bot_interrupted": ("interruption",),
}
"""The Pipecat Evals events a sweep checks, as the calltape events that record them."""


def _squash(text: str) -> str:
    return "".join(text.split()).lower()


class _EvalsCheck:
    """A scripted scenario's expectations, checked turn by turn on a run's recorded events, the way
    ``pipecat eval`` matches them on the bot's events: in order, each from where the one above it was
    met (``check_from: turn_start``: from the turn's start), an ``absent`` one when none comes."""

    def __init__(self, scenario: Any) -> None:
        self.scenario = scenario
        self.left_out: dict[str, set[tuple[int, int]]] = {}
        """What was not checked, by the (turn, expectation) it was left out of."""

    def _skip(self, what: str, where: tuple[int, int]) -> None:
        self.left_out.setdefault(what, set()).add(where)

    def windows(self, run: Run) -> list[tuple[int, int]]:
        """Each turn's events, as index ranges of ``run.events``: from the user's words to the next turn's."""
        events = run.events
        starts: list[int] = []
        at = 0
        for turn in self.scenario.turns:
            text = _squash(turn.user or "")
            found = None
            for i in range(at, len(events)):
                e = events[i]
                if e.type in ("user.transcript", "user.text") and e.data.get("final", True):
                    if not text or _squash(str(e.data.get("text", ""))) == text:
                        found = i
                        break
            if found is None:
                starts.append(len(events))
                continue
            # the turn begins where the user started saying it (what the bot did meanwhile, such as
            # being interrupted, is the turn's), after any earlier final words
            begin = found
            for j in range(found - 1, at - 1, -1):
                e = events[j]
                if e.type == "user.text" or (e.type == "user.transcript" and e.data.get("final")):
                    break
                if e.type == "user.speech.started":
                    begin = j
                    break
            starts.append(begin)
            at = found + 1
        bounds = [*starts[1:], len(events)]
        return list(zip(starts, bounds, strict=True))

    def evaluate(self, run: Run) -> str | None:
        """The first expectation that does not hold on ``run`` (None: all hold)."""
        events = run.events
        for t, (turn, (begin, end)) in enumerate(zip(self.scenario.turns, self.windows(run), strict=True), start=1):
            if turn.user and begin >= len(events):
                return f"turn {t}: the user's turn never reached the bot"
            claimed: set[int] = set()
            pointer = begin
            for x, exp in enumerate(turn.expect, start=1):
                kinds = _EVENTS.get(exp.event)
                if kinds is None:
                    self._skip(f"'{exp.event}' expectations", (t, x))
                    continue
                if exp.eval is not None:
                    self._skip("eval: criteria (an LLM judge)", (t, x))
                if exp.within_ms is not None:
                    self._skip("within_ms: budgets (offline timing is not the call's)", (t, x))
                since = begin if exp.check_from == "turn_start" else pointer
                where = f"turn {t}, expectation {x} ({exp.event})"
                candidates = [
                    i
                    for i in range(since, end)
                    if i not in claimed and events[i].type in kinds and self._kind_ok(exp, events[i])
                ]
                if exp.absent:
                    if candidates:
                        return f"{where}: expected none, got one at seq {events[candidates[0]].seq}"
                    continue
                if exp.event in ("function_call", "function_call_stopped"):
                    matched = self._calls(exp, events, candidates, run)
                    if matched is None:
                        return f"{where}: the expected calls were not all made"
                    claimed.update(matched)
                    pointer = max(pointer, max(matched) + 1 if matched else pointer)
                    continue
                hit = next((i for i in candidates if self._text_ok(exp, events[i], run)), None)
                if hit is None:
                    return f"{where}: no matching event" + (" (text checks)" if candidates else "")
                claimed.add(hit)
                pointer = hit + 1
        return None

    @staticmethod
    def _kind_ok(exp: Any, event: Any) -> bool:
        if exp.event == "user_transcription":
            return bool(event.data.get("final"))
        return True

    def _text(self, exp: Any, event: Any, run: Run) -> str:
        if event.type == "user.transcript":
            return str(event.data.get("text", ""))
        reply = str(event.data.get("reply"))
        if exp.event == "llm_response" or (exp.event == "response" and not self.scenario.bot_audio):
            state = run._fold().reply_state(reply)
            return state.generated if state is not None else ""
        return run.heard(reply)

    def _text_ok(self, exp: Any, event: Any, run: Run) -> bool:
        if exp.text_contains is None and exp.text_excludes is None:
            return True
        text = _squash(self._text(exp, event, run))
        if exp.text_contains is not None and _squash(exp.text_contains) not in text:
            return False
        return not (exp.text_excludes is not None and _squash(exp.text_excludes) in text)

    @staticmethod
    def _calls(exp: Any, events: list[Any], candidates: list[int], run: Run) -> list[int] | None:
        wanted = list(exp.calls or [None])
        matched: list[int] = []
        for want in wanted:
            hit = None
            for i in candidates:
                if i in matched:
                    continue
                data = events[i].data
                if events[i].type == "tool.call":
                    name, args = data.get("name"), data.get("arguments")
                    if isinstance(args, str):
                        import orjson

                        args = orjson.loads(args) if args else {}
                else:
                    state = run._fold().tool_call(str(data.get("call")))
                    name = state.name if state is not None else None
                    args = {"tool_call_id": data.get("call"), "cancelled": events[i].type == "tool.cancelled"}
                if want is not None and want.name is not None and want.name != name:
                    continue
                if want is not None and want.args and any((args or {}).get(k) != v for k, v in want.args.items()):
                    continue
                hit = i
                break
            if hit is None:
                return None
            matched.append(hit)
        return matched


async def sweep_pipecat_evals(
    path: str | Any,
    bot: Callable[[CallSession, Any, Any], Any],
    *,
    llm: Sequence[Sequence[Step]] | dict[str, Sequence[Sequence[Step]]],
    strict: bool = False,
    drops: bool = True,
    concurrency: int = 8,
    options: CheckOptions | None = None,
) -> dict[str, Sweep]:
    """Sweeps every scripted scenario of the Pipecat Evals file ``path`` (unchanged, read by Pipecat's
    own ``EvalScenarioFile``) against the user's pipeline: as written, then once per event boundary with
    a barge-in, and once per tool call with a drop and resume (the pipeline rebuilt on the resumed
    context); every rule on every run; the scenario's expectations checked on each run's events.

    ``options``: the rules' thresholds (a busy machine playing audio in real time may want a longer
    ``talk_over_ms``). ``bot(call, llm, context)`` builds the user's ``PipelineWorker`` recorded into
    ``call``, around calltape's :class:`~calltape.testing.pipecat.ScriptedLLM` (the user's tools
    registered on it; after a drop, a new one with what is left of the script) and the given
    ``LLMContext`` (the scenario's ``context:`` messages, or the resumed call's after a drop), with the
    offline transport, STT and TTS of :mod:`calltape.testing.pipecat`. ``llm``: what the model answers,
    turn by turn (per scenario name, or one script for all).

    Kept: the turns and their order, ``send_after`` (a turn sent after an event, the scenario's own
    barge-in), the expectations on user and bot speech, transcriptions, replies (``text_contains``,
    ``text_excludes``, ``absent``, ``check_from``) and function calls (names and arguments, how they
    stopped). Not kept, counted in :attr:`Sweep.notes`: ``eval:`` criteria (an LLM judge),
    ``within_ms`` budgets, markers, images, backchannels, DTMF and audio turns; a simulated scenario
    (``persona:``, an LLM plays the caller) is not swept at all."""
    from pipecat.evals.scenario import EvalScenarioFile
    from pipecat.evals.script import EvalScriptScenario
    from pipecat.processors.aggregators.llm_context import LLMContext

    from calltape.testing.pipecat import PipecatCaller, ScriptedLLM

    loaded = EvalScenarioFile.load(path)
    sweeps: dict[str, Sweep] = {}
    skipped: list[str] = []
    for scenario in loaded.scenarios:
        if not isinstance(scenario, EvalScriptScenario):
            skipped.append(scenario.name)
            continue
        script = llm[scenario.name] if isinstance(llm, dict) else llm
        check = _EvalsCheck(scenario)

        async def drive(call: CallSession, scenario: Any = scenario, script: Any = script, check: Any = check) -> None:
            scripted = ScriptedLLM(script)
            worker = bot(call, scripted, LLMContext(messages=list(scenario.context)))
            seen = _Seen(call)
            async with PipecatCaller(
                worker, call, rebuild=lambda context: bot(call, ScriptedLLM(list(scripted.turns)), context)
            ) as caller:
                for t, turn in enumerate(scenario.turns, start=1):
                    if turn.dtmf or turn.audio or turn.parts:
                        check._skip("DTMF and audio turns (their text is sent instead)", (t, 0))
                    if turn.send_after is not None:
                        await seen.after(len(seen.types), turn.send_after)
                    else:
                        await caller.settled()  # a turn is sent once the bot has finished, as pipecat eval does
                    if turn.user:
                        await caller.says(turn.user)
                await caller.settled()

        sweep = await _sweep(drive, check, strict=strict, drops=drops, concurrency=concurrency, options=options)
        sweeps[scenario.name] = sweep
    if skipped:
        for sweep in sweeps.values():
            sweep.notes.append(f"simulated scenarios not swept (an LLM plays the caller): {', '.join(skipped)}")
    return sweeps


class _Seen:
    """The event types a run records, in order, with a wakeup for whoever waits for one."""

    def __init__(self, call: CallSession) -> None:
        import asyncio

        self.types: list[str] = []
        self.arrived = asyncio.Event()
        call.add_listener(self._folded)

    def _folded(self, event: Any) -> None:
        self.types.append(event.type)
        self.arrived.set()

    async def after(self, mark: int, send_after: Any) -> None:
        """Waits for ``send_after``'s event (recorded since ``mark``; 30 s at most), then its delay."""
        import asyncio

        kinds = _EVENTS.get(send_after.event or "", ())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                while kinds and not any(kind in kinds for kind in self.types[mark:]):
                    self.arrived.clear()
                    await self.arrived.wait()
        await asyncio.sleep((send_after.delay_ms or 0) / 1000)


async def _sweep(
    drive: Callable[[CallSession], Awaitable[None]],
    check: _EvalsCheck,
    *,
    strict: bool,
    drops: bool,
    concurrency: int,
    options: CheckOptions | None,
) -> Sweep:
    unmet: dict[str, str] = {}
    started = time.perf_counter()
    exploration = await explore(
        drive,
        assertions=_expectations(unmet, strict, check.evaluate),
        concurrency=concurrency,
        drops=drops,
        options=options,
    )
    exploration.seconds = time.perf_counter() - started
    notes = list(exploration.notes)
    notes += [f"not kept: {what} ({len(where)} in the scenario)" for what, where in sorted(check.left_out.items())]
    return Sweep(exploration, unmet, notes)
