"""Offline building blocks for tests that run a real LiveKit ``AgentSession``.

:class:`ScriptedLLM` subclasses the real ``llm.LLM`` / ``llm.LLMStream``: each ``chat()`` answers with
the next :class:`Step` (text chunks, then or before tool calls), so tool execution, interruption,
the speech queue and the chat context are LiveKit's own. ``session.run()``/``generate_reply()`` work
with no room, no server and no keys (text output only). Every chat context the LLM received is kept
in ``seen``, so a test can check what the model was actually given.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import pytest
from livekit import rtc
from livekit.agents import AgentSession, llm, stt, tts, vad
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, APIConnectOptions, NotGivenOr
from livekit.agents.utils import aio, shortuuid
from livekit.agents.voice import io
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer

from calltape.events import Event, make_event
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.runtime import CallSession, ToolSpec
from calltape.testing.livekit import OfflineSpeaker


def _release() -> tuple[int, int]:
    from livekit.agents import __version__

    major, minor = __version__.split(".")[:2]
    return int(major), int(minor)


LIVEKIT = _release()
"""The installed livekit-agents release as (major, minor)."""

before_1_8 = pytest.mark.skipif(
    LIVEKIT < (1, 8),
    reason="before 1.8 LiveKit neither releases a tool at its interruption cap nor reports an interrupted turn's calls",
)
"""Scenarios about what LiveKit 1.8 does with the calls of an interrupted turn (release at the cap,
the error of an interrupted handoff)."""


@dataclass
class Step:
    text: str = ""
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    """(call_id, name, arguments)"""
    calls_first: bool = False
    word_delay: float = 0.0


class ScriptedLLM(llm.LLM[Any]):
    def __init__(self, steps: list[Step]) -> None:
        super().__init__()
        self.steps = list(steps)
        self.seen: list[llm.ChatContext] = []

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
        self.seen.append(chat_ctx.copy())
        step = self.steps.pop(0) if self.steps else Step()
        return _ScriptedStream(self, step, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


class _ScriptedStream(llm.LLMStream):
    def __init__(self, owner: ScriptedLLM, step: Step, **kwargs: Any) -> None:
        super().__init__(owner, **kwargs)
        self._step = step

    async def _run(self) -> None:
        rid = f"resp_{id(self):x}"
        if self._step.calls_first:
            self._send_calls(rid)
        for word in self._step.text.split(" ") if self._step.text else []:
            if self._step.word_delay:
                await asyncio.sleep(self._step.word_delay)
            self._event_ch.send_nowait(
                llm.ChatChunk(id=rid, delta=llm.ChoiceDelta(role="assistant", content=word + " "))
            )
        if not self._step.calls_first:
            self._send_calls(rid)

    def _send_calls(self, rid: str) -> None:
        if not self._step.calls:
            return
        calls = [
            llm.FunctionToolCall(name=name, arguments=json.dumps(args), call_id=cid)
            for cid, name, args in self._step.calls
        ]
        self._event_ch.send_nowait(llm.ChatChunk(id=rid, delta=llm.ChoiceDelta(role="assistant", tool_calls=calls)))


class Sink:
    """A bare ``emit(type, data) -> Event`` recorder, for the pure mapping tests only."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, type: str, data: Any) -> Event:
        self.events.append((type, dict(data)))
        return make_event("sink", type, data)

    def types(self) -> list[str]:
        return [t for t, _ in self.events]

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [d for t, d in self.events if t == type_]


async def start_call(
    store: EventStore,
    session_id: str,
    *,
    agent: str,
    instructions: str = "",
    modality: str = "text",
    tools: dict[str, ToolSpec] | None = None,
) -> tuple[Recorder, CallSession]:
    recorder = Recorder(store)
    await recorder.start()
    call = await CallSession.start(
        recorder,
        session_id,
        agent=agent,
        instructions=instructions,
        modality=modality,
        framework="livekit",
        tools=tools,
    )
    return recorder, call


def items(chat_ctx: llm.ChatContext) -> list[tuple[str, str]]:
    """A chat context as (kind, text) pairs, leaving out config updates."""
    out: list[tuple[str, str]] = []
    for item in chat_ctx.items:
        if isinstance(item, llm.ChatMessage):
            out.append((item.role, item.text_content or ""))
        elif isinstance(item, llm.FunctionCall):
            out.append(("function_call", item.call_id))
        elif isinstance(item, llm.FunctionCallOutput):
            out.append(("function_call_output", f"{item.call_id}={item.output}"))
    return out


# -------------------------------------------------------------------------------------------------
# A voice call without a room: a scripted caller (VAD edges and STT results on a timeline), a TTS
# that renders silence as long as the words take to say, and a speaker that plays it in real time.
# Everything between them (turn detection, interruptions, transcript sync, the speech queue) is
# LiveKit's own.


@dataclass
class Utterance:
    """What the caller says, in seconds from the start of the call's audio."""

    start: float
    end: float
    text: str
    stt_delay: float = 0.15
    """How long after the end of speech STT gives its final (an interim comes halfway)."""


class CallerVAD(vad.VAD):
    """Speech edges at the script's times (plus LiveKit's usual min speech / silence durations)."""

    def __init__(self, script: list[Utterance], *, min_speech: float = 0.05, min_silence: float = 0.2) -> None:
        super().__init__(capabilities=vad.VADCapabilities(update_interval=0.05))
        self.script, self.min_speech, self.min_silence = script, min_speech, min_silence

    def stream(self) -> vad.VADStream:
        return _CallerVADStream(self)


class _CallerVADStream(vad.VADStream):
    async def _main_task(self) -> None:
        owner = cast(CallerVAD, self._vad)
        t0 = await _first_frame(self._input_ch)
        if t0 is None:
            return
        for u in owner.script:
            await _sleep_until(t0, u.start + owner.min_speech)
            self._send(vad.VADEventType.START_OF_SPEECH, u, t0)
            while time.perf_counter() - t0 < u.end + owner.min_silence - 0.1:
                await asyncio.sleep(0.05)
                self._send(vad.VADEventType.INFERENCE_DONE, u, t0)
            await _sleep_until(t0, u.end + owner.min_silence)
            self._send(vad.VADEventType.END_OF_SPEECH, u, t0)
        async for _ in self._input_ch:
            pass

    def _send(self, kind: vad.VADEventType, u: Utterance, t0: float) -> None:
        now = time.perf_counter() - t0
        speaking = now <= u.end
        self._event_ch.send_nowait(
            vad.VADEvent(
                type=kind,
                samples_index=0,
                timestamp=now,
                speech_duration=min(now, u.end) - u.start,
                silence_duration=max(0.0, now - u.end),
                raw_accumulated_speech=now - u.start if speaking else 0.0,
                raw_accumulated_silence=0.0 if speaking else now - u.end,
            )
        )


class CallerSTT(stt.STT):
    """A streaming STT giving, per utterance, an interim of its first words and then its final."""

    def __init__(self, script: list[Utterance]) -> None:
        super().__init__(capabilities=stt.STTCapabilities(streaming=True, interim_results=True))
        self.script = script

    async def _recognize_impl(self, buffer: Any, *, language: Any, conn_options: APIConnectOptions) -> Any:
        raise NotImplementedError("streaming only")

    def stream(
        self, *, language: Any = NOT_GIVEN, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> Any:
        return _CallerSTTStream(stt=self, conn_options=conn_options)


class _CallerSTTStream(stt.RecognizeStream):
    async def _run(self) -> None:
        owner = cast(CallerSTT, self._stt)
        t0 = await _first_frame(self._input_ch)
        if t0 is None:
            return
        for u in owner.script:
            await _sleep_until(t0, u.end + u.stt_delay / 2)
            self._say(" ".join(u.text.split()[:2]), final=False)
            await _sleep_until(t0, u.end + u.stt_delay)
            self._say(u.text, final=True)
        async for _ in self._input_ch:
            pass

    def _say(self, text: str, *, final: bool) -> None:
        kind = stt.SpeechEventType.FINAL_TRANSCRIPT if final else stt.SpeechEventType.INTERIM_TRANSCRIPT
        self._event_ch.send_nowait(stt.SpeechEvent(type=kind, alternatives=[stt.SpeechData(text=text, language="en")]))


async def _first_frame(ch: Any) -> float | None:
    async for frame in ch:
        if isinstance(frame, rtc.AudioFrame):
            return time.perf_counter()
    return None


async def _sleep_until(t0: float, at: float) -> None:
    delay = t0 + at - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


class SilenceTTS(tts.TTS):
    """Renders ``seconds_per_word`` of silence per word (a non-streaming TTS: LiveKit splits sentences)."""

    def __init__(self, seconds_per_word: float = 0.12) -> None:
        super().__init__(capabilities=tts.TTSCapabilities(streaming=False), sample_rate=16000, num_channels=1)
        self.seconds_per_word = seconds_per_word

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> tts.ChunkedStream:
        return _Silence(tts=self, input_text=text, conn_options=conn_options)


class _Silence(tts.ChunkedStream):
    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        owner = cast(SilenceTTS, self._tts)
        output_emitter.initialize(request_id="silence", sample_rate=16000, num_channels=1, mime_type="audio/pcm")
        samples = int(16000 * owner.seconds_per_word * len(self.input_text.split()))
        chunk = 160  # 10 ms
        for i in range(0, samples, chunk):
            output_emitter.push(b"\x00\x00" * min(chunk, samples - i))
            await asyncio.sleep(0)
        output_emitter.flush()


class Phone(io.AudioInput):
    """The caller's microphone: a tenth of a second of silence starts the VAD and STT timelines."""

    def __init__(self) -> None:
        super().__init__(label="phone")
        self._frames: asyncio.Queue[rtc.AudioFrame] = asyncio.Queue()

    async def __anext__(self) -> rtc.AudioFrame:
        return await self._frames.get()

    def ring(self) -> None:
        n = 1600
        self._frames.put_nowait(
            rtc.AudioFrame(b"\x00\x00" * n, sample_rate=16000, num_channels=1, samples_per_channel=n)
        )


class Screen(io.TextOutput):
    """Where the synchronized transcript goes (kept, for the tests to look at)."""

    def __init__(self) -> None:
        super().__init__(label="screen", next_in_chain=None)
        self.text = ""

    async def capture_text(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def voice_session(
    script: list[Utterance], llm_: llm.LLM[Any] | None, *, seconds_per_word: float = 0.12, **options: Any
) -> tuple[AgentSession[Any], Phone]:
    """A real ``AgentSession`` wired to the scripted caller; ``options`` go to ``AgentSession``.

    Endpointing and interruption thresholds are shortened so a scenario takes seconds."""
    turn: dict[str, Any] = {
        "turn_detection": "vad",
        "endpointing": {"min_delay": 0.2, "max_delay": 2.0},
        "interruption": {"min_duration": 0.2, "false_interruption_timeout": None},
    }
    for key, value in options.pop("turn_handling", {}).items():
        turn[key] = {**turn.get(key, {}), **value} if isinstance(value, dict) else value
    session: AgentSession[Any] = AgentSession(
        vad=CallerVAD(script),
        stt=CallerSTT(script),
        llm=llm_,
        tts=SilenceTTS(seconds_per_word),
        turn_handling=cast(Any, turn),
        aec_warmup_duration=None,
        **options,
    )
    phone, speaker = Phone(), OfflineSpeaker()
    sync = TranscriptSynchronizer(next_in_chain_audio=speaker, next_in_chain_text=Screen(), speed=1.0)
    session.input.audio = phone
    session.output.audio = sync.audio_output
    session.output.transcription = sync.text_output
    return session, phone


def _merged(turns: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Consecutive user messages as one (calltape's rule: user content accumulates until a reply)."""
    out: list[tuple[str, str]] = []
    for role, text in turns:
        if out and role == "user" and out[-1][0] == "user":
            out[-1] = ("user", f"{out[-1][1]} {text}")
        else:
            out.append((role, text))
    return out


def livekit_turns(chat_ctx: llm.ChatContext) -> list[tuple[str, str]]:
    """LiveKit's user and assistant messages, in order, text stripped (empty ones left out)."""
    turns = [
        (item.role, (item.text_content or "").strip())
        for item in chat_ctx.items
        if isinstance(item, llm.ChatMessage) and item.role in ("user", "assistant")
    ]
    return _merged([(r, t) for r, t in turns if t])


def calltape_turns(native: dict[str, Any]) -> list[tuple[str, str]]:
    """calltape's user and assistant messages, in order, text stripped (empty ones left out)."""
    turns = [
        (item["role"], str(item["content"]).strip())
        for item in native["items"]
        if item["type"] == "message" and item["role"] in ("user", "assistant")
    ]
    return _merged([(r, t) for r, t in turns if t])


def livekit_calls(chat_ctx: llm.ChatContext, later_ids: dict[str, str] | None = None) -> dict[str, tuple[str, Any]]:
    """LiveKit's function calls as ``call_id -> (name, output)``.

    ``later_ids`` maps the id of a call LiveKit adds for a result that came after a progress update
    (the ``id`` its ``ToolCallEnded`` names) to the original call: that output is the call's result."""
    later_ids = later_ids or {}
    names: dict[str, str] = {}
    outputs: dict[str, Any] = {}
    for item in chat_ctx.items:
        if isinstance(item, llm.FunctionCall) and item.call_id not in later_ids:
            names[item.call_id] = item.name
        elif isinstance(item, llm.FunctionCallOutput):
            cid = later_ids.get(item.call_id, item.call_id)
            if item.call_id in later_ids or cid not in outputs:
                outputs[cid] = item.output
    return {cid: (name, outputs.get(cid)) for cid, name in names.items()}


def calltape_calls(native: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """calltape's function calls as ``call_id -> (name, output)``; checks each has exactly one output."""
    names = {i["call_id"]: i["name"] for i in native["items"] if i["type"] == "function_call"}
    outputs = [i for i in native["items"] if i["type"] == "function_call_output"]
    assert sorted(o["call_id"] for o in outputs) == sorted(names), "every call has exactly one output"
    return {o["call_id"]: (names[o["call_id"]], o["output"]) for o in outputs}


# -------------------------------------------------------------------------------------------------
# A realtime model: LiveKit's realtime path without a provider.


REALTIME_RATE = 24000
"""The sample rate of :class:`ScriptedRealtime`'s audio."""


class ScriptedRealtime(llm.RealtimeModel):
    """A realtime (speech-to-speech) model answering each ``generate_reply`` with the next scripted
    text, streamed with ``seconds_per_word`` of silent audio per word (no tools, no server-side turn
    detection): LiveKit's realtime path (playout, interruption, what was heard) runs as with a
    provider's model."""

    def __init__(self, replies: list[str], seconds_per_word: float = 0.12) -> None:
        super().__init__(
            capabilities=llm.RealtimeCapabilities(
                message_truncation=False,
                turn_detection=False,
                user_transcription=False,
                auto_tool_reply_generation=False,
                audio_output=True,
                manual_function_calls=True,
            )
        )
        self.replies = list(replies)
        self.seconds_per_word = seconds_per_word

    def session(self, *args: Any, **kwargs: Any) -> llm.RealtimeSession:
        return _RealtimeSession(self)

    async def aclose(self) -> None:
        pass


class _RealtimeSession(llm.RealtimeSession):
    def __init__(self, model: ScriptedRealtime) -> None:
        super().__init__(model)
        self._model = model
        self._chat_ctx = llm.ChatContext.empty()
        self._tools = llm.ToolContext.empty()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def chat_ctx(self) -> llm.ChatContext:
        return self._chat_ctx.copy()

    @property
    def tools(self) -> llm.ToolContext:
        return self._tools.copy()

    async def update_instructions(self, instructions: str) -> None:
        pass

    async def update_chat_ctx(self, chat_ctx: llm.ChatContext, *args: Any, **kwargs: Any) -> None:
        self._chat_ctx = chat_ctx.copy()

    async def update_tools(self, tools: list[Any]) -> None:
        self._tools = llm.ToolContext(tools)

    def update_options(self, *, tool_choice: Any = NOT_GIVEN, **kwargs: Any) -> None:
        pass

    def push_audio(self, frame: rtc.AudioFrame) -> None:
        pass

    def push_video(self, frame: rtc.VideoFrame) -> None:
        pass

    def generate_reply(self, *args: Any, **kwargs: Any) -> asyncio.Future[llm.GenerationCreatedEvent]:
        fut: asyncio.Future[llm.GenerationCreatedEvent] = asyncio.get_running_loop().create_future()
        text = self._model.replies.pop(0) if self._model.replies else "Ok."
        text_ch: aio.Chan[str] = aio.Chan()
        audio_ch: aio.Chan[rtc.AudioFrame] = aio.Chan()
        msg_ch: aio.Chan[llm.MessageGeneration] = aio.Chan()
        fn_ch: aio.Chan[llm.FunctionCall] = aio.Chan()
        modalities: asyncio.Future[list[Literal["text", "audio"]]] = asyncio.get_running_loop().create_future()
        modalities.set_result(["audio", "text"])
        msg_ch.send_nowait(
            llm.MessageGeneration(
                message_id=shortuuid("msg_"), text_stream=text_ch, audio_stream=audio_ch, modalities=modalities
            )
        )
        msg_ch.close()
        fn_ch.close()

        async def stream() -> None:
            per_word = int(REALTIME_RATE * self._model.seconds_per_word)
            for word in text.split(" "):
                text_ch.send_nowait(word + " ")
                for i in range(0, per_word, REALTIME_RATE // 100):
                    n = min(REALTIME_RATE // 100, per_word - i)
                    audio_ch.send_nowait(
                        rtc.AudioFrame(
                            b"\x00\x00" * n, sample_rate=REALTIME_RATE, num_channels=1, samples_per_channel=n
                        )
                    )
                await asyncio.sleep(0)
            text_ch.close()
            audio_ch.close()

        task = asyncio.ensure_future(stream())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        fut.set_result(llm.GenerationCreatedEvent(message_stream=msg_ch, function_stream=fn_ch, user_initiated=True))
        return fut

    def commit_audio(self) -> None:
        pass

    def clear_audio(self) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def truncate(self, **kwargs: Any) -> None:
        pass

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
