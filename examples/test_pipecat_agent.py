"""Testing a Pipecat agent under barge-in, offline: copy this file into your agent's tests.

Run: pytest examples/test_pipecat_agent.py   (needs `pip install 'calltape[pipecat]' pytest-asyncio`;
no keys, no network)

``build_worker`` stands for your agent: your real pipeline, with the network services passed in, so
the test hands it calltape's offline stand-ins (``ScriptedLLM``, ``ScriptedSTT``, ``ScriptedTTS``,
``OfflineTransport``). The test plays one call, then replays it once per event boundary with the caller
barging in exactly there, and once per tool call with the call dropped and resumed while it runs
(a new pipeline, built by ``build_worker`` on the resumed call's context, carries the call on), and
checks every run: the ``calltape check`` rules, the context invariants,
and the assertion below. A failure names the instant and prints the call's timeline.

The refill is a real-world action, so the handler runs it through ``calltape.effect``, keyed by the
prescription and heard first: run once, whatever call id the LLM asks under after a barge-in or a
resume, and only once the caller has heard "Refilling that for you now" to its end. The
``double-effect``, ``unheard-effect`` and ``unsettled-effect`` rules check that on every run by
themselves; the assertion below checks the pharmacy's own side, reply by reply.
"""

from __future__ import annotations

import asyncio

import pytest
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pipecat.services.stt_service import STTService
from pipecat.services.tts_service import TTSService
from pipecat.transports.base_transport import BaseTransport
from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import SpeechTimeoutUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies

import calltape
from calltape import CallSession
from calltape.adapters.pipecat import register_function
from calltape.checks import CheckOptions
from calltape.testing.explore import Run, explore
from calltape.testing.pipecat import (
    Call,
    OfflineTransport,
    PipecatCaller,
    Say,
    ScriptedLLM,
    ScriptedSTT,
    ScriptedTTS,
)

# ---------------------------------------------------------------------------------------------
# Your agent (in your project: `from my_agent import build_worker`)

REFILLS: dict[str, list[str]] = {}  # the pharmacy's side effects, per call


def build_worker(
    call: CallSession,
    *,
    llm: LLMService,
    stt: STTService,
    tts: TTSService,
    transport: BaseTransport,
    context: LLMContext | None = None,
) -> PipelineWorker:
    """A pharmacy line: refills a prescription, then says goodbye and hangs up (``context``: a resumed
    call's, else a new call's)."""

    async def refill(rx: str) -> dict[str, str]:
        await asyncio.sleep(0.2)  # the pharmacy's API
        REFILLS.setdefault(call.session_id, []).append(rx)
        return {"ready": "tomorrow"}

    async def refill_prescription(params: FunctionCallParams) -> None:
        rx = params.arguments["rx"]
        # the action, once per prescription, after the caller heard the announcement to its end
        await params.result_callback(await calltape.effect("refill", rx, lambda: refill(rx), heard=True))

    async def end_call(params: FunctionCallParams) -> None:
        await params.result_callback({"ended": True})

    # calltape runs each tool under its guard: durable start, timeout, exactly once, and a call of
    # a reply the caller interrupted is never started (pipecat-ai#4997).
    register_function(llm, call, "refill_prescription", refill_prescription, cancel_on_interruption=False)
    register_function(llm, call, "end_call", end_call)

    context = context or LLMContext(messages=[{"role": "system", "content": "You are a pharmacy's phone agent."}])
    pair = LLMContextAggregatorPair(
        context,
        user_params=LLMUserAggregatorParams(
            user_turn_strategies=UserTurnStrategies(stop=[SpeechTimeoutUserTurnStopStrategy(user_speech_timeout=0.1)]),
        ),
    )
    pipeline = Pipeline([transport.input(), stt, pair.user(), llm, tts, transport.output(), pair.assistant()])
    return PipelineWorker(pipeline, params=PipelineParams(audio_out_sample_rate=16000), idle_timeout_secs=None)


# ---------------------------------------------------------------------------------------------
# The test


async def one_call(call: CallSession) -> None:
    """The scenario: a scripted caller and LLM drive the real pipeline, recorded into ``call``."""
    llm = ScriptedLLM(
        [
            [Say("Refilling that for you now."), Call("refill_prescription", "c1", {"rx": "RX-1"})],
            [Say("It will be ready tomorrow. Goodbye!"), Call("end_call", "c2")],
        ],
        run_in_parallel=False,
    )

    def offline(llm: ScriptedLLM, context: LLMContext | None = None) -> PipelineWorker:
        return build_worker(
            call, llm=llm, stt=ScriptedSTT(), tts=ScriptedTTS(), transport=OfflineTransport(), context=context
        )

    # After a drop, a new pipeline (a new LLM with what is left of the script) on the resumed context.
    def rebuild(context: LLMContext) -> PipelineWorker:
        return offline(ScriptedLLM(list(llm.turns), run_in_parallel=False), context)

    async with PipecatCaller(offline(llm), call, rebuild=rebuild) as caller:
        await caller.says("I need my prescription refilled, number RX-1")
        await caller.settled()


def refilled_once_and_only_when_heard(run: Run) -> None:
    """Your own checks of each run, per reply: the pharmacy refilled at most once, and only when the
    reply that asked for the refill had played to its end."""
    refills = REFILLS.get(run.events[0].session, [])
    assert len(refills) <= 1, f"refilled {len(refills)} times"
    if refills:
        asking = next(e.data.get("reply") for e in run.events if e.type == "tool.call" and e.data["call"] == "c1")
        heard = any(
            e.type == "agent.speech.ended" and e.data["reply"] == asking and not e.data["interrupted"]
            for e in run.events
        )
        assert heard, f"refilled although reply {asking} was cut off"


@pytest.mark.asyncio
async def test_every_barge_in_instant() -> None:
    REFILLS.clear()
    exploration = await explore(
        one_call,
        assertions=refilled_once_and_only_when_heard,
        options=CheckOptions(talk_over_ms=2000),  # wall-clock thresholds, on a busy CI machine
        concurrency=8,  # runs at a time: on a small CI machine, fewer keep latencies realistic
    )
    exploration.assert_ok()
    drops = sum(r.dropped is not None for r in exploration.runs)  # one per tool call, on a new pipeline
    print(f"{len(exploration.runs)} runs ({drops} with a drop) in {exploration.seconds:.1f} s")
