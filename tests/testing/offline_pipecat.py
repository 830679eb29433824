"""The offline pipeline the Pipecat exploration tests run their agents in (import after
``pytest.importorskip("pipecat")``): calltape's shipped stand-ins (transport, STT, TTS) around the
agent's own LLM and context, a user turn ending after 50 ms of silence, as a real call's would."""

from __future__ import annotations

from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import SpeechTimeoutUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies

from calltape.testing.pipecat import SAMPLE_RATE, OfflineTransport, ScriptedLLM, ScriptedSTT, ScriptedTTS


def offline_worker(llm: ScriptedLLM, context: LLMContext) -> PipelineWorker:
    """The agent's pipeline (its tools already registered on ``llm``), ready for a ``PipecatCaller``."""
    transport = OfflineTransport()
    pair = LLMContextAggregatorPair(
        context,
        user_params=LLMUserAggregatorParams(
            user_turn_strategies=UserTurnStrategies(stop=[SpeechTimeoutUserTurnStopStrategy(user_speech_timeout=0.05)]),
            user_turn_stop_timeout=0.3,
        ),
    )
    pipeline = Pipeline(
        [transport.input(), ScriptedSTT(), pair.user(), llm, ScriptedTTS(), transport.output(), pair.assistant()]
    )
    return PipelineWorker(
        pipeline,
        params=PipelineParams(audio_out_sample_rate=SAMPLE_RATE),
        idle_timeout_secs=None,
        enable_rtvi=False,
        enable_turn_tracking=False,
    )
