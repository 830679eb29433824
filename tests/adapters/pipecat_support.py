"""Offline building blocks for tests that run a real Pipecat pipeline.

Everything here subclasses the real Pipecat base classes and leaves their machinery alone:

* :class:`ScriptedLLM` is an ``LLMService`` that answers each ``LLMContextFrame`` from a script, the way
  the OpenAI service does (start frame, text frames, ``run_function_calls``, end frame in ``finally``),
  so function calls go through Pipecat's own runner, timeouts and interruption handling.
* :class:`ScriptedTTS` is a ``TTSService`` whose ``run_tts`` yields silence-free PCM proportional to
  the words, so Pipecat's own audio contexts order ``TTSTextFrame``\\ s behind their audio.
* :class:`NullOutputTransport` is a ``BaseOutputTransport`` whose device takes audio in real time, so
  the real media sender decides when the bot starts/stops speaking and which text was played.

No network, no keys, no model files.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    LLMContextFrame,
    OutputAudioRawFrame,
    StartFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMAssistantAggregator,
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import (
    SpeechTimeoutUserTurnStopStrategy,
)
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.workers.runner import WorkerRunner

from calltape.testing.pipecat import Call, Pause, Say, Step  # noqa: F401 - the tests import them from here
from calltape.testing.pipecat import ScriptedLLM as _ShippedLLM
from calltape.testing.pipecat import ScriptedTTS as _ShippedTTS

SAMPLE_RATE = 16000


LIVE_BOTS: list[VoiceBot] = []
"""Pipelines started by the current test (a fixture stops what a failing test left running)."""


# ---------------------------------------------------------------------------------------------
# The scripted LLM


class ScriptedLLM(_ShippedLLM):
    """The shipped offline LLM (``calltape.testing.pipecat``), telling the tests when it is asked."""

    def __init__(self, turns: Sequence[Sequence[Step]] = (), **kwargs: Any) -> None:
        super().__init__(turns, **kwargs)
        self.inference = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, LLMContextFrame):
            self.inference.set()
        await super().process_frame(frame, direction)


# ---------------------------------------------------------------------------------------------
# The scripted TTS and the null audio device


class ScriptedTTS(_ShippedTTS):
    """The shipped offline TTS (``calltape.testing.pipecat``) at the tests' pace: 60 ms per word."""

    def __init__(self, *, word_secs: float = 0.06, **kwargs: Any) -> None:
        super().__init__(word_secs=word_secs, **kwargs)


class NullOutputTransport(BaseOutputTransport):  # type: ignore[misc]
    """A ``BaseOutputTransport`` whose audio device plays in real time and goes nowhere."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            TransportParams(audio_out_enabled=True, audio_out_sample_rate=SAMPLE_RATE, audio_out_end_silence_secs=0),
            **kwargs,
        )
        self.played_bytes = 0

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        self.played_bytes += len(frame.audio)
        await asyncio.sleep(len(frame.audio) / (frame.sample_rate * 2 * frame.num_channels))
        return True


class SlowConsumer(FrameProcessor):  # type: ignore[misc]
    """A processor after the output transport that takes ``delay`` per data frame (say, a recorder
    writing audio to disk). Played ``TTSTextFrame``\\ s queue up in front of it, as in pipecat-ai#4996."""

    def __init__(self, delay: float = 0.05) -> None:
        super().__init__()
        self._delay = delay

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM and isinstance(frame, OutputAudioRawFrame):
            await asyncio.sleep(self._delay)
        await self.push_frame(frame, direction)


# ---------------------------------------------------------------------------------------------
# A recording observer for the tests (what reached which processor, in order)


class FrameLog(BaseObserver):  # type: ignore[misc]
    """Remembers every frame each processor received, to assert Pipecat's own behaviour."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[tuple[FrameProcessor, Frame]] = []

    async def on_push_frame(self, data: FramePushed) -> None:
        self.received.append((data.destination, data.frame))

    def types_reaching(self, processor: FrameProcessor) -> list[str]:
        return [type(f).__name__ for p, f in self.received if p is processor]


# ---------------------------------------------------------------------------------------------
# A voice pipeline: user aggregator → LLM → TTS → null transport → assistant aggregator


@dataclass
class VoiceBot:
    llm: ScriptedLLM
    tts: ScriptedTTS
    output: NullOutputTransport
    context: LLMContext
    pair: LLMContextAggregatorPair
    worker: PipelineWorker
    runner: WorkerRunner
    task: asyncio.Task[None] | None = None

    @property
    def assistant(self) -> LLMAssistantAggregator:
        return self.pair.assistant()

    async def start(self) -> None:
        LIVE_BOTS.append(self)
        started = asyncio.Event()

        @self.worker.event_handler("on_pipeline_started")  # type: ignore[misc]
        async def _started(_worker: PipelineWorker, _frame: Frame) -> None:
            started.set()

        await self.runner.add_workers(self.worker)
        self.task = asyncio.create_task(self.runner.run())
        await asyncio.wait_for(started.wait(), 5)

    async def push(self, *frames: Frame) -> None:
        for frame in frames:
            await self.worker.queue_frame(frame)

    async def end(self) -> None:
        await self.worker.queue_frame(EndFrame())
        await self.wait_finished()

    async def cancel(self) -> None:
        await self.worker.queue_frame(CancelFrame())
        await self.wait_finished()

    async def stop(self) -> None:
        """Cancels the pipeline if it still runs (test teardown)."""
        if self.task is not None and not self.task.done():
            await self.worker.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.task, 5)

    async def wait_finished(self, timeout: float = 10) -> None:
        assert self.task is not None
        await asyncio.wait_for(self.task, timeout)

    def messages(self) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.context.get_messages()))


def build_voice_bot(
    llm: ScriptedLLM,
    *,
    messages: list[dict[str, Any]] | None = None,
    tools: list[Any] | None = None,
    observers: list[BaseObserver] | None = None,
    word_secs: float = 0.06,
    extra: Sequence[FrameProcessor] = (),
    after_output: Sequence[FrameProcessor] = (),
    llm_timeout: float | None = None,
    user_mute_strategies: Sequence[Any] = (),
    user_turn_start: Sequence[Any] | None = None,
    output: bool = True,
) -> VoiceBot:
    """Builds the idiomatic cascade pipeline (transcripts are pushed in as frames, no STT).

    ``output=False`` builds a text pipeline (no TTS, no output transport); ``tools`` are the
    context's (``FunctionSchema``\\ s or direct functions)."""
    system = [{"role": "system", "content": "You are a test bot."}]
    context = LLMContext(messages=messages or system, tools=tools) if tools else LLMContext(messages=messages or system)
    pair = LLMContextAggregatorPair(
        context,
        user_params=LLMUserAggregatorParams(
            user_turn_strategies=UserTurnStrategies(
                start=list(user_turn_start) if user_turn_start is not None else None,
                stop=[SpeechTimeoutUserTurnStopStrategy(user_speech_timeout=0.05)],
            ),
            user_turn_stop_timeout=0.3,
            user_mute_strategies=list(user_mute_strategies),
        ),
    )
    tts = ScriptedTTS(word_secs=word_secs)
    transport = NullOutputTransport()
    playout: list[FrameProcessor] = [tts, *extra, transport, *after_output] if output else []
    pipeline = Pipeline([pair.user(), llm, *playout, pair.assistant()])
    worker = PipelineWorker(
        pipeline,
        observers=list(observers or []),
        params=PipelineParams(audio_out_sample_rate=SAMPLE_RATE),
        idle_timeout_secs=None,
        enable_rtvi=False,
        enable_turn_tracking=False,
    )
    return VoiceBot(llm, tts, transport, context, pair, worker, WorkerRunner())


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 5.0, interval: float = 0.01
) -> None:
    """Waits until ``predicate`` holds (fails the test with a clear message after ``timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        await asyncio.sleep(interval)
