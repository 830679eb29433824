"""Offline stand-ins for a LiveKit agent's LLM, STT and TTS, a speaker, and a scripted caller.

A test runs the user's *real* ``Agent`` in a real ``AgentSession`` with these in place of the network
services, so it needs no keys, no room and no server::

    async def scenario(call):
        llm = ScriptedLLM([[Say("Let me put you through."), Call("transfer", "c1")], [Say("Done.")]])
        session = AgentSession(llm=llm, tts=ScriptedTTS())
        async with LiveKitCaller(session, MyAgent(), call) as caller:
            await caller.says("I want a person")
            await caller.settled()

    exploration = await explore(scenario)   # calltape.testing.explore: one run per barge-in instant

With a :class:`ScriptedSTT` in the session (``AgentSession(stt=ScriptedSTT(), llm=..., tts=...,
**speaking_caller())``) the caller *speaks*: its words reach LiveKit as STT events
(start of speech, an interim transcript, the final one, end of speech), LiveKit's own turn detection
commits the turn, and a barge-in interrupts the agent the way a caller's voice does (LiveKit's
interruption by audio activity). Without one, the caller's turns are injected
(``generate_reply(user_input=...)``) and a barge-in is ``session.interrupt()``.

The stand-ins subclass LiveKit's ``llm.LLM`` / ``llm.LLMStream``, ``stt.STT`` / ``stt.RecognizeStream``
and ``tts.TTS`` / ``tts.ChunkedStream`` and its ``io.AudioOutput``, so tool execution, the speech
queue, turn detection, interruptions and playout tracking are LiveKit's own. Audio is silence, as long
as the words take to say (``word_secs`` per word), played in real time by :class:`OfflineSpeaker`; keep
``word_secs`` small and a call takes a fraction of a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, cast

from calltape.extras import requires_extra

with requires_extra("livekit", "the LiveKit test harness (calltape.testing.livekit)"):
    from livekit import rtc
    from livekit.agents import Agent, AgentSession, llm, stt, tts
    from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, APIConnectOptions, NotGivenOr
    from livekit.agents.voice import io
    from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer

from calltape.adapters.livekit import LiveKitTap, attach, rehydrate
from calltape.runtime import CallSession, ResumePlan
from calltape.testing.dropresume import DropCarrying, set_drop_carrier
from calltape.testing.explore import set_barge_in
from calltape.testing.script import Call, Pause, Say, Step

__all__ = [
    "SAMPLE_RATE",
    "Call",
    "LiveKitCaller",
    "OfflineSpeaker",
    "Pause",
    "Say",
    "ScriptedLLM",
    "ScriptedSTT",
    "ScriptedTTS",
    "Step",
    "speaking_caller",
]

SAMPLE_RATE = 16000
"""The sample rate of the stand-ins' audio (16 kHz mono PCM)."""


class ScriptedLLM(llm.LLM[Any]):
    """An ``llm.LLM`` answering each ``chat()`` with the next scripted turn (an empty reply once the
    script runs out); ``received`` keeps a copy of every chat context it was sent."""

    def __init__(self, turns: Sequence[Sequence[Step]] = ()) -> None:
        super().__init__()
        self.turns: deque[list[Step]] = deque(list(t) for t in turns)
        self.received: list[llm.ChatContext] = []

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: NotGivenOr[bool] = NOT_GIVEN,
        tool_choice: NotGivenOr[llm.ToolChoice] = NOT_GIVEN,
        extra_kwargs: NotGivenOr[dict[str, Any]] = NOT_GIVEN,
    ) -> llm.LLMStream:
        """Streams the next scripted turn."""
        self.received.append(chat_ctx.copy())
        turn = self.turns.popleft() if self.turns else []
        return _ScriptedStream(self, turn, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


class _ScriptedStream(llm.LLMStream):
    def __init__(self, owner: ScriptedLLM, turn: list[Step], **kwargs: Any) -> None:
        super().__init__(owner, **kwargs)
        self._turn = turn

    async def _run(self) -> None:
        rid = f"scripted_{id(self):x}"
        for step in self._turn:
            if isinstance(step, Say):
                for i, word in enumerate(step.text.split(" ")):
                    delta = llm.ChoiceDelta(role="assistant", content=word if i == 0 else " " + word)
                    self._event_ch.send_nowait(llm.ChatChunk(id=rid, delta=delta))
                    if step.gap:
                        await asyncio.sleep(step.gap)
            elif isinstance(step, Call):
                call = llm.FunctionToolCall(name=step.name, arguments=json.dumps(step.arguments), call_id=step.call_id)
                delta = llm.ChoiceDelta(role="assistant", tool_calls=[call])
                self._event_ch.send_nowait(llm.ChatChunk(id=rid, delta=delta))
            else:
                await asyncio.sleep(step.seconds)


def speaking_caller(*, endpointing: float = 0.1) -> dict[str, Any]:
    """``AgentSession`` options for a caller speaking through a :class:`ScriptedSTT`:
    ``AgentSession(stt=ScriptedSTT(), llm=..., tts=..., **speaking_caller())``.

    LiveKit's STT turn detection (the STT's end of speech ends the turn, ``endpointing`` seconds
    later), no VAD (there is no audio to run one on: LiveKit then interrupts on the caller's first
    interim transcript), and no echo-cancellation warm-up (which ignores a barge-in during the
    agent's first seconds of speech)."""
    return {
        "vad": None,
        "aec_warmup_duration": None,
        "turn_handling": {"turn_detection": "stt", "endpointing": {"min_delay": endpointing, "max_delay": 1.0}},
    }


class ScriptedSTT(stt.STT[Any]):
    """A streaming ``stt.STT`` transcribing the caller as scripted: :meth:`hear` makes the open stream
    report one utterance (start of speech, an interim transcript of its first words, the final
    transcript ``gap`` seconds later, end of speech). The audio it is given is ignored."""

    def __init__(self, *, gap: float = 0.05) -> None:
        super().__init__(capabilities=stt.STTCapabilities(streaming=True, interim_results=True))
        self.gap = gap
        self._heard: asyncio.Queue[tuple[str, bool]] = asyncio.Queue()

    def hear(self, text: str, *, interim: bool = True) -> None:
        """The caller says ``text`` (an interim transcript first unless ``interim`` is False)."""
        self._heard.put_nowait((text, interim))

    async def _recognize_impl(
        self, buffer: Any, *, language: Any = NOT_GIVEN, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> stt.SpeechEvent:
        raise NotImplementedError("ScriptedSTT only streams")

    def stream(
        self, *, language: Any = NOT_GIVEN, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> stt.RecognizeStream:
        """The stream LiveKit reads the caller's words from."""
        return _Transcribing(stt=self, conn_options=conn_options)


class _Transcribing(stt.RecognizeStream):
    async def _run(self) -> None:
        owner = cast(ScriptedSTT, self._stt)
        audio = asyncio.ensure_future(self._drain())
        try:
            while True:
                text, interim = await owner._heard.get()
                self._send(stt.SpeechEventType.START_OF_SPEECH)
                if interim:
                    self._send(stt.SpeechEventType.INTERIM_TRANSCRIPT, " ".join(text.split()[:2]))
                await asyncio.sleep(owner.gap)
                self._send(stt.SpeechEventType.FINAL_TRANSCRIPT, text)
                self._send(stt.SpeechEventType.END_OF_SPEECH)
        finally:
            audio.cancel()

    async def _drain(self) -> None:
        async for _ in self._input_ch:
            pass

    def _send(self, kind: stt.SpeechEventType, text: str | None = None) -> None:
        alternatives = [stt.SpeechData(language=cast(Any, "en"), text=text)] if text is not None else []
        self._event_ch.send_nowait(stt.SpeechEvent(type=kind, alternatives=alternatives))


class ScriptedTTS(tts.TTS[Any]):
    """A non-streaming ``tts.TTS`` rendering ``word_secs`` of silence per word (LiveKit splits the
    reply into sentences for it, as for any non-streaming TTS)."""

    def __init__(self, *, word_secs: float = 0.03) -> None:
        super().__init__(capabilities=tts.TTSCapabilities(streaming=False), sample_rate=SAMPLE_RATE, num_channels=1)
        self.word_secs = word_secs

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> tts.ChunkedStream:
        """The silence for ``text``."""
        return _Silence(tts=self, input_text=text, conn_options=conn_options)


class _Silence(tts.ChunkedStream):
    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        owner = cast(ScriptedTTS, self._tts)
        output_emitter.initialize(request_id="silence", sample_rate=SAMPLE_RATE, num_channels=1, mime_type="audio/pcm")
        samples = int(SAMPLE_RATE * owner.word_secs * max(1, len(self.input_text.split())))
        chunk = SAMPLE_RATE // 100  # 10 ms
        for i in range(0, samples, chunk):
            output_emitter.push(b"\x00\x00" * min(chunk, samples - i))
        output_emitter.flush()


class OfflineSpeaker(io.AudioOutput):
    """An audio output that plays what it is given in real time and goes nowhere; a barge-in
    (``clear_buffer``) reports how far playout got, as a real transport does."""

    def __init__(self) -> None:
        super().__init__(
            label="offline-speaker",
            next_in_chain=None,
            sample_rate=SAMPLE_RATE,
            capabilities=io.AudioOutputCapabilities(pause=False),
        )
        self._queued = 0.0
        self._began: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        """Queues the frame; the first one of a segment starts playback."""
        await super().capture_frame(frame)
        self._queued += frame.duration
        if self._began is None:
            self._began = asyncio.get_running_loop().time()
            self.on_playback_started(created_at=time.time())

    def flush(self) -> None:
        """The segment is complete: it finishes once its audio has had time to play."""
        super().flush()
        if not self._queued or self._began is None:
            return
        delay = max(0.0, self._queued - (asyncio.get_running_loop().time() - self._began))
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._finished, self._queued, False)

    def clear_buffer(self) -> None:
        """Stops playback (a barge-in) at the current position."""
        if not self._queued or self._began is None:
            return
        self._finished(min(asyncio.get_running_loop().time() - self._began, self._queued), True)

    def _finished(self, position: float, interrupted: bool) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._queued, self._began, self._timer = 0.0, None, None
        self.on_playback_finished(playback_position=position, interrupted=interrupted, synchronized_transcript=None)


class _Transcript(io.TextOutput):
    """Where the synchronized transcript goes (nowhere)."""

    def __init__(self) -> None:
        super().__init__(label="offline-transcript", next_in_chain=None)

    async def capture_text(self, text: str) -> None:
        """Drops the text."""

    def flush(self) -> None:
        """Nothing to flush."""


class LiveKitCaller(DropCarrying):
    """Runs ``session`` with ``agent`` recorded into ``call`` and speaks to it as a caller would.

    ``async with LiveKitCaller(session, agent, call) as caller``: gives the session an
    :class:`OfflineSpeaker` (behind LiveKit's transcript synchronizer) unless it has an audio output,
    attaches calltape (:func:`calltape.adapters.livekit.attach`), starts the session, and makes
    :func:`calltape.testing.explore.explore` land its barge-ins as the caller cutting in. With a
    :class:`ScriptedSTT` (the session's or the agent's) the caller speaks through it and LiveKit's
    turn detection and interruption by audio activity do the rest; without one, a turn is
    ``generate_reply(user_input=...)`` and a barge-in ``session.interrupt()`` followed by the caller's
    words as a new turn. On exit the session closes.
    """

    def __init__(
        self,
        session: AgentSession[Any],
        agent: Agent,
        call: CallSession,
        *,
        rebuild: Callable[[], tuple[AgentSession[Any], Agent]] | None = None,
    ) -> None:
        super().__init__()
        self.session = session
        self.agent = agent
        self.call = call
        self.rebuild = rebuild
        """After a drop, the new session and agent (default: a session on the same STT, LLM, TTS, VAD
        and turn handling, and the same agent object, its chat context seeded from the resume)."""
        self.tap: LiveKitTap | None = None
        self._sync: TranscriptSynchronizer | None = None

    async def __aenter__(self) -> LiveKitCaller:
        await self._open()
        set_barge_in(self.call, self.barge_in)
        set_drop_carrier(self.call, self)
        return self

    async def _open(self) -> None:
        if self.session.output.audio is None:
            self._sync = TranscriptSynchronizer(
                next_in_chain_audio=OfflineSpeaker(), next_in_chain_text=_Transcript(), speed=1.0
            )
            self.session.output.audio = self._sync.audio_output
            self.session.output.transcription = self._sync.text_output
        self.tap = attach(self.session, self.call)
        await self.session.start(self.agent)
        self._running = True

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._leave()
        await self._close(self.session, self.tap, self._sync)

    @staticmethod
    async def _close(session: AgentSession[Any], tap: LiveKitTap | None, sync: TranscriptSynchronizer | None) -> None:
        await session.aclose()
        if tap is not None:
            await tap.drain()
        if sync is not None:
            with contextlib.suppress(Exception):
                await sync.aclose()

    # -- a drop (exploration's drop runs): the session is lost, a new one carries the call on ----

    def lose(self) -> None:
        """The agent's process is lost: the session is cut off from the call (nothing it does is
        recorded any more) and closed; the caller waits for :meth:`carry_on` before speaking again."""
        tap, self.tap = self.tap, None
        if tap is not None:
            tap.detach()
        self._cut_off(self._close(self.session, None, self._sync))
        self._sync = None

    async def carry_on(self, plan: ResumePlan) -> None:
        """The call was resumed: a new session (:attr:`rebuild`) takes it on at the new epoch, its
        agent seeded with the plan's context, and the agent speaks first, as a resumed agent does."""
        try:
            await self._closed()
            session, agent = self.rebuild() if self.rebuild is not None else self._same_again()
            await rehydrate(agent, plan)
            self.session, self.agent = session, agent
            await self._open()
            self.session.generate_reply()
        finally:
            self._carried.set()

    def _same_again(self) -> tuple[AgentSession[Any], Agent]:
        old = self.session
        services: dict[str, Any] = {"stt": old.stt, "llm": old.llm, "tts": old.tts}
        options: dict[str, Any] = {name: service for name, service in services.items() if service is not None}
        with contextlib.suppress(ValueError):  # userdata raises when the session has none
            options["userdata"] = old.userdata
        session: AgentSession[Any] = AgentSession(
            vad=old.vad, turn_handling=old.options.turn_handling, aec_warmup_duration=None, **options
        )
        return session, self.agent

    @property
    def stt(self) -> ScriptedSTT | None:
        """The :class:`ScriptedSTT` the caller speaks through (the agent's, else the session's), if any."""
        for candidate in (getattr(self.agent, "stt", None), self.session.stt):
            if isinstance(candidate, ScriptedSTT):
                return candidate
        return None

    async def says(self, text: str) -> None:
        """A user turn: LiveKit commits ``text`` and the agent replies (not waited for: see
        :meth:`settled`)."""
        await self._carried.wait()
        scripted = self.stt
        if scripted is not None:
            scripted.hear(text, interim=False)
        else:
            self.session.generate_reply(user_input=text)

    async def barge_in(self, text: str | None = "wait") -> None:
        """The caller cuts in: speaks ``text`` over the agent through the :class:`ScriptedSTT` (LiveKit
        interrupts the agent on the interim transcript), else ``session.interrupt()`` and ``text`` as
        the caller's turn."""
        if not self._running:
            return
        scripted = self.stt
        if scripted is not None:
            scripted.hear(text or "wait")
            return
        self.session.interrupt()
        if text:
            self.session.generate_reply(user_input=text)
