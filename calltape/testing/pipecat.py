"""Offline stand-ins for a Pipecat agent's LLM, STT, TTS and transport, and a scripted caller.

A test builds the user's *real* pipeline with these in place of the network services, so it runs with
no keys and no network, and drives it as a caller would::

    async def scenario(call):
        llm = ScriptedLLM([[Say("Checking."), Call("check_balance", "c1")], [Say("You have ten.")]])
        worker = build_my_agent(call, llm=llm, stt=ScriptedSTT(), tts=ScriptedTTS(), transport=OfflineTransport())
        async with PipecatCaller(worker, call) as caller:
            await caller.says("what is my balance")
            await caller.settled()

    exploration = await explore(scenario)   # calltape.testing.explore: one run per barge-in instant

Everything subclasses Pipecat's own base classes and leaves their machinery alone: function calls go
through ``LLMService.run_function_calls`` (Pipecat's runner, its queue and its interruption handling),
the TTS's audio contexts order text behind audio, and the output transport's media sender decides when
the bot starts and stops speaking and which words were played. Audio plays ``speed`` times faster than
real time, so a call takes a fraction of its length.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import importlib
import inspect
import re
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from types import TracebackType
from typing import Any

from calltape.extras import requires_extra

with requires_extra("pipecat", "the Pipecat test harness (calltape.testing.pipecat)"):
    from pipecat.frames.frames import (
        EndFrame,
        Frame,
        FunctionCallFromLLM,
        InputAudioRawFrame,
        InterimTranscriptionFrame,
        LLMContextFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMRunFrame,
        OutputAudioRawFrame,
        StartFrame,
        TranscriptionFrame,
        TTSAudioRawFrame,
        VADUserStartedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.llm_service import LLMService
    from pipecat.services.stt_service import STTService
    from pipecat.services.tts_service import TTSService
    from pipecat.transports.base_output import BaseOutputTransport
    from pipecat.transports.base_transport import BaseTransport, TransportParams
    from pipecat.utils.time import time_now_iso8601
    from pipecat.workers.runner import WorkerRunner

from calltape.adapters.pipecat import CalltapeObserver, seed_llm_context
from calltape.runtime import CallSession, ResumePlan
from calltape.testing.dropresume import DropCarrying, set_drop_carrier
from calltape.testing.explore import set_barge_in
from calltape.testing.script import Call, Pause, Say, Step

__all__ = [
    "SAMPLE_RATE",
    "Call",
    "OfflineOutput",
    "OfflineTransport",
    "Pause",
    "PipecatCaller",
    "Say",
    "ScriptedLLM",
    "ScriptedSTT",
    "ScriptedTTS",
]

SAMPLE_RATE = 16000
"""The sample rate of every stand-in (16 kHz mono PCM)."""


def _offline_sentences() -> None:
    """Pipecat < 1.11 splits TTS text into sentences with NLTK data it downloads at run time; offline,
    split at sentence punctuation instead (1.11+ bundles its splitter and is left alone)."""
    from pipecat.utils import string as pipecat_string

    loader = getattr(pipecat_string, "_sent_tokenizer", None)
    if loader is None or inspect.signature(loader).parameters:
        return
    try:
        importlib.import_module("nltk").data.find("tokenizers/punkt_tab")
    except LookupError:

        def split(text: str) -> list[str]:
            return [s for s in re.split(r"(?<=[.!?;])\s+", text) if s]

        setattr(pipecat_string, "_sent_tokenizer", lambda: split)  # noqa: B010 - the attribute's type differs by release
    except ImportError:
        return


_offline_sentences()


def _complete_settings(service: Any) -> None:
    """A stand-in has no model, voice or language: say so (None) rather than leave them unset, which
    Pipecat >= 1.13 reports as an error at start."""
    settings = getattr(service, "_settings", None)
    if settings is None or not dataclasses.is_dataclass(settings):
        return
    for f in dataclasses.fields(settings):
        if type(getattr(settings, f.name, None)).__name__ == "NotGiven":
            setattr(settings, f.name, None)


# ---------------------------------------------------------------------------------------------
# The scripted LLM


class ScriptedLLM(LLMService):
    """An ``LLMService`` answering each inference with the next scripted turn (an empty reply once the
    script runs out), streaming the way a real service does: start frame, text frames, the calls
    handed to Pipecat's function-call runner, end frame. ``received`` keeps every context it was sent."""

    def __init__(self, turns: Sequence[Sequence[Step]] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _complete_settings(self)
        self.turns: deque[list[Step]] = deque(list(t) for t in turns)
        self.received: list[list[dict[str, Any]]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Answers ``LLMContextFrame``\\ s; passes every other frame on."""
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        messages: list[Any] = list(frame.context.get_messages())
        self.received.append(copy.deepcopy(messages))
        turn = self.turns.popleft() if self.turns else []
        try:
            await self.push_frame(LLMFullResponseStartFrame())
            await self._play(turn, frame.context)
        finally:
            await self.push_frame(LLMFullResponseEndFrame())

    async def _play(self, turn: list[Step], context: LLMContext) -> None:
        calls: list[FunctionCallFromLLM] = []
        for step in turn:
            if isinstance(step, Say):
                for i, word in enumerate(step.text.split(" ")):
                    await self._push_llm_text(word if i == 0 else " " + word)
                    if step.gap:
                        await asyncio.sleep(step.gap)
            elif isinstance(step, Call):
                calls.append(
                    FunctionCallFromLLM(
                        function_name=step.name, tool_call_id=step.call_id, arguments=step.arguments, context=context
                    )
                )
            else:
                await asyncio.sleep(step.seconds)
        if calls:
            await self.run_function_calls(calls)


# ---------------------------------------------------------------------------------------------
# STT and TTS


class ScriptedSTT(STTService):
    """An ``STTService`` that transcribes the caller's audio as the words the caller was scripted to say
    (:class:`PipecatCaller` queues them with :meth:`hear` before it sends the audio)."""

    def __init__(self, **kwargs: Any) -> None:
        # Its transcripts are ready the moment the audio arrives: tell the turn strategies so.
        kwargs.setdefault("ttfs_p99_latency", 0.01)
        super().__init__(**kwargs)
        _complete_settings(self)
        self._pending: deque[tuple[str, bool]] = deque()

    def hear(self, text: str, *, final: bool = True) -> None:
        """Queues the transcript of the next audio frame (an interim one unless ``final``)."""
        self._pending.append((text, final))

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame | None, None]:
        """Yields the queued transcripts (none for audio nobody scripted)."""
        while self._pending:
            text, final = self._pending.popleft()
            kind = TranscriptionFrame if final else InterimTranscriptionFrame
            yield kind(text, "caller", time_now_iso8601())


class ScriptedTTS(TTSService):
    """A ``TTSService`` rendering ``word_secs`` of (non-silent) audio per word."""

    def __init__(self, *, word_secs: float = 0.05, **kwargs: Any) -> None:
        kwargs.setdefault("push_start_frame", True)
        kwargs.setdefault("push_stop_frames", True)
        super().__init__(sample_rate=SAMPLE_RATE, **kwargs)
        _complete_settings(self)
        self.word_secs = word_secs

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """One audio frame as long as the words take to say."""
        samples = int(SAMPLE_RATE * self.word_secs * max(1, len(text.split())))
        yield TTSAudioRawFrame(b"\x10\x02" * samples, SAMPLE_RATE, 1, context_id=context_id)


# ---------------------------------------------------------------------------------------------
# The transport


class OfflineOutput(BaseOutputTransport):
    """An output transport whose device plays ``speed`` times faster than real time and goes nowhere;
    ``played_seconds`` is how much audio the caller heard."""

    def __init__(self, *, speed: float = 4.0, **kwargs: Any) -> None:
        super().__init__(
            TransportParams(audio_out_enabled=True, audio_out_sample_rate=SAMPLE_RATE, audio_out_end_silence_secs=0),
            **kwargs,
        )
        self.speed = speed
        self.played_seconds = 0.0

    async def start(self, frame: StartFrame) -> None:
        """Starts the media sender at once (there is no connection to wait for)."""
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        """Plays the frame (sleeps its duration divided by ``speed``)."""
        seconds = len(frame.audio) / (frame.sample_rate * 2 * frame.num_channels)
        self.played_seconds += seconds
        await asyncio.sleep(seconds / self.speed)
        return True


class _OfflineInput(FrameProcessor):
    """Where the caller's frames enter (they are queued on the worker, so this only passes them on)."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)


class OfflineTransport(BaseTransport):
    """A transport with no network: ``input()`` passes the scripted caller's frames on, ``output()``
    is an :class:`OfflineOutput`, so an agent written as ``Pipeline([transport.input(), ...,
    transport.output(), ...])`` runs unchanged."""

    def __init__(self, *, speed: float = 4.0) -> None:
        super().__init__()
        self._input = _OfflineInput()
        self._output = OfflineOutput(speed=speed)

    def input(self) -> FrameProcessor:
        """The caller's side."""
        return self._input

    def output(self) -> OfflineOutput:
        """The agent's voice."""
        return self._output


# ---------------------------------------------------------------------------------------------
# The scripted caller


class PipecatCaller(DropCarrying):
    """Runs a ``PipelineWorker`` recorded into ``call`` and speaks into it as a caller would.

    ``async with PipecatCaller(worker, call) as caller``: adds a
    :class:`~calltape.adapters.pipecat.CalltapeObserver` unless the worker has one, starts the
    pipeline, and makes :func:`calltape.testing.explore.explore` land its barge-ins as this caller
    starting to talk over the bot (VAD, then transcripts), the way a real barge-in reaches Pipecat.
    On exit the pipeline ends with an ``EndFrame`` (which ends the call).

    With ``rebuild`` (your function building the agent's worker around a given ``LLMContext``) the
    caller also carries a drop over, as a lost agent process would: at the drop the pipeline is cut
    off from the call and cancelled, and after the resume ``rebuild(context)`` builds a new pipeline on
    the plan's settled context (:func:`~calltape.adapters.pipecat.seed_llm_context`), which takes the
    call on at the new epoch and speaks first. A processor cannot join a second pipeline, so without
    ``rebuild`` the exploration runs no drops for this caller (and its notes say so)."""

    def __init__(
        self,
        worker: PipelineWorker,
        call: CallSession,
        *,
        stt: ScriptedSTT | None = None,
        rebuild: Callable[[LLMContext], PipelineWorker] | None = None,
    ) -> None:
        super().__init__()
        self.worker = worker
        self.call = call
        self.stt = stt if stt is not None else _find(worker, ScriptedSTT)
        self.rebuild = rebuild
        """After a drop, the new worker around the resumed call's context (None: drops are not carried)."""
        self._runner = WorkerRunner(handle_sigint=False)
        self._task: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> PipecatCaller:
        await self._open()
        set_barge_in(self.call, self.barge_in)
        if self.rebuild is not None:
            set_drop_carrier(self.call, self)
        return self

    async def _open(self) -> None:
        if not any(isinstance(o, CalltapeObserver) for o in _observers(self.worker)):
            self.worker.add_observer(CalltapeObserver(self.call))
        started = asyncio.Event()

        async def _started(_worker: Any, _frame: Frame) -> None:
            started.set()

        self.worker.add_event_handler("on_pipeline_started", _started)
        self._runner = WorkerRunner(handle_sigint=False)
        await self._runner.add_workers(self.worker)
        self._task = asyncio.create_task(self._runner.run())
        waiter = asyncio.ensure_future(started.wait())
        await asyncio.wait({waiter, self._task}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        if not started.is_set():
            waiter.cancel()
            await self._stop(self.worker, self._task)
            raise RuntimeError("the Pipecat pipeline did not start within 10 s")
        self._running = True

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._leave()
        if kind is None:
            await self.worker.queue_frame(EndFrame())
            try:
                await asyncio.wait_for(asyncio.shield(self._done()), 10)
                return
            except TimeoutError:
                pass
        await self._stop(self.worker, self._task)

    async def _done(self) -> None:
        assert self._task is not None
        await self._task

    @staticmethod
    async def _stop(worker: PipelineWorker, task: asyncio.Task[Any] | None) -> None:
        if task is not None and not task.done():
            await worker.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 5)

    # -- a drop (exploration's drop runs): the pipeline is lost, a new one carries the call on ----

    def lose(self) -> None:
        """The agent's process is lost: the pipeline is cut off from the call (nothing it does is
        recorded any more) and cancelled; the caller waits for :meth:`carry_on` before speaking again."""
        for observer in _observers(self.worker):
            if isinstance(observer, CalltapeObserver):
                observer.detach()
        self._cut_off(self._stop(self.worker, self._task))

    async def carry_on(self, plan: ResumePlan) -> None:
        """The call was resumed (``plan``): :attr:`rebuild` builds a new pipeline on the resumed call's
        settled context, which takes the call on at the new epoch and speaks first, as a resumed
        agent does."""
        try:
            await self._closed()
            assert self.rebuild is not None
            self.worker = self.rebuild(seed_llm_context(self.call))
            self.stt = _find(self.worker, ScriptedSTT)
            await self._open()
            await self.worker.queue_frame(LLMRunFrame())
        finally:
            self._carried.set()

    async def says(self, text: str) -> None:
        """One complete utterance: speech starts, the transcript arrives, speech stops."""
        await self._carried.wait()
        await self._speak(text)

    async def barge_in(self, text: str = "wait") -> None:
        """The caller talks over whatever is playing (an interim transcript first, as STT gives it)."""
        if self._running:
            await self._speak(text, interim=True)

    async def _speak(self, text: str, *, interim: bool = False) -> None:
        await self.worker.queue_frame(VADUserStartedSpeakingFrame())
        first = " ".join(text.split()[:2])
        if self.stt is not None:
            if interim:
                self.stt.hear(first, final=False)
            self.stt.hear(text)
            samples = SAMPLE_RATE // 50  # 20 ms
            await self.worker.queue_frame(InputAudioRawFrame(b"\x10\x02" * samples, SAMPLE_RATE, 1))
        else:
            if interim:
                await self.worker.queue_frame(InterimTranscriptionFrame(first, "caller", time_now_iso8601()))
            await self.worker.queue_frame(TranscriptionFrame(text, "caller", time_now_iso8601()))
        await self.worker.queue_frame(VADUserStoppedSpeakingFrame())


def _observers(worker: PipelineWorker) -> list[Any]:
    """The worker's observers (Pipecat keeps no public list: read its ``WorkerObserver``'s)."""
    found = getattr(getattr(worker, "_observer", None), "_observers", None)
    return list(found) if isinstance(found, list) else []


def _find(worker: PipelineWorker, kind: type[Any]) -> Any:
    from calltape.adapters.pipecat.attach import processors

    return next((p for p in processors(worker) if isinstance(p, kind)), None)
