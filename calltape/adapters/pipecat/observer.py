"""Recording a Pipecat pipeline: :class:`CalltapeObserver`.

It reads frames where they really happen: a reply's text where the LLM pushes it, the words the user
heard where the output transport releases them (a ``TTSTextFrame`` leaves the transport only after
the audio before it was written), tool calls where the LLM service announces them, user input where
the user aggregator takes it (:mod:`.user`). Pipecat runs observers off the pipeline on their own
queue, and the observer only calls the synchronous ``call.emit``, so recording never holds a frame
back.

Reply state (generating, interrupted, speech started, heard) is read from the call's live fold through
the shared :class:`~calltape.adapters.replies.ReplyTracker`; the observer only keeps what Pipecat
alone knows: which frame and TTS context belong to which reply, and how far the playout cursor moved
through the generated text.
"""

from __future__ import annotations

import inspect
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    CancelFrame,
    EndFrame,
    Frame,
    FunctionCallCancelFrame,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    FunctionCallsStartedFrame,
    InputTextRawFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMMessagesAppendFrame,
    LLMMessagesTransformFrame,
    LLMMessagesUpdateFrame,
    LLMTextFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSTextFrame,
)
from pipecat.observers.base_observer import BaseObserver, FrameProcessed, FramePushed
from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator, LLMUserAggregator
from pipecat.processors.frame_processor import FrameDirection
from pipecat.transports.base_output import BaseOutputTransport

from calltape.adapters.pipecat._percall import PipecatCall, jsonable
from calltape.adapters.pipecat.live import fix_after_aggregator
from calltape.adapters.pipecat.messages import MessageRecorder
from calltape.adapters.pipecat.user import MUTE_FRAMES, USER_INPUT, UserInput
from calltape.adapters.replies import ReplyTracker
from calltape.runtime.protocol import EventSink, FoldedSink, LiveCall

log = logging.getLogger("calltape.adapters.pipecat")

# Pipecat >= 1.11 tells observers about every hop only when asked; 1.10 always does.
_EVERY_PUSH = "observe_every_push" in inspect.signature(BaseObserver.__init__).parameters

_INJECTED = (LLMMessagesAppendFrame, LLMMessagesUpdateFrame, LLMMessagesTransformFrame)


@dataclass
class _Playout:
    """What only Pipecat knows about one reply: its playout cursor through the generated text."""

    rid: str
    voiced: bool
    end_played: bool = False  # the reply's LLMFullResponseEndFrame left the output transport
    cursor: int = 0
    extra: str = ""  # spoken text not found in the generated text (e.g. a TTSSpeakFrame)

    def heard(self, generated: str) -> str:
        return generated[: self.cursor] + self.extra


class CalltapeObserver(BaseObserver):
    """Records a Pipecat pipeline into a calltape :class:`~calltape.runtime.LiveCall` (a
    :class:`~calltape.runtime.CallSession`); a plain :class:`~calltape.runtime.EventSink` only records.

    Attach with one line: ``PipelineWorker(pipeline, observers=[CalltapeObserver(call)])`` (or let
    :func:`calltape.adapters.pipecat.attach` do it).

    ``on_end`` / ``on_cancel`` say what the end of the pipeline means for the session: by default an
    ``EndFrame`` ends the session and a ``CancelFrame`` marks it dropped (resumable). Pass ``"none"``
    when the session continues elsewhere (handoff to another pipeline).
    """

    def __init__(
        self,
        call: EventSink,
        *,
        on_end: Literal["end", "none"] = "end",
        on_cancel: Literal["drop", "end", "none"] = "drop",
    ) -> None:
        # Every push, not only the first: the output transport passes on TTSTextFrames it did not
        # create, and that hop is the moment the user heard them.
        super().__init__(**({"observe_every_push": True} if _EVERY_PUSH else {}))
        self.call = call
        self.live: LiveCall | None = call if isinstance(call, LiveCall) else None
        """The call as a :class:`~calltape.runtime.LiveCall`, or None when it only records."""
        self.replies = ReplyTracker(call)
        self._percall = PipecatCall.of(call)
        self._percall.observer = self  # the call's one object: the guard waits for what this announces
        self._on_end = on_end
        self._on_cancel = on_cancel
        self._siblings: deque[int] = deque(maxlen=512)
        self._pushed: dict[int, None] = {}
        self._taken: deque[int] = deque(maxlen=512)
        self._playouts: dict[str, _Playout] = {}
        self._frame_reply: dict[int, str] = {}
        self._generating: str | None = None
        self._playing: str | None = None  # the reply the output transport is playing out
        self._tts_reply: dict[str, str] = {}  # TTS context id -> reply
        self._pending_speak: deque[str] = deque()
        self._bot_speaking = False
        self._voiced = False  # an output transport is in the pipeline
        self._user_aggregators: set[int] = set()
        self._context_aggregators: set[int] = set()
        self.user = UserInput(self._emit)
        self.messages = MessageRecorder(self.replies)
        self._started_calls: set[str] = set()
        self._finished: Literal["end", "cancel"] | None = None
        self._finish_reason: str | None = None
        self._settled = False
        self._detached = False

    def detach(self) -> None:
        """Cuts the observer off from the call (its agent's process was lost, the call goes on
        elsewhere): nothing its pipeline does is recorded any more, and the pipeline's end neither
        ends nor drops the session."""
        self._detached = self._settled = True

    # -- the pipecat hooks ---------------------------------------------------------------------

    async def on_process_frame(self, data: FrameProcessed) -> None:
        """Learns the pipeline's shape, and records what the context aggregators take."""
        if self._detached:
            return
        try:
            processor, frame = data.processor, data.frame
            if isinstance(processor, BaseOutputTransport):
                self._voiced = True
            if isinstance(processor, LLMUserAggregator):
                self._user_aggregators.add(id(processor))
                self._context_aggregators.add(id(processor))
                if isinstance(frame, USER_INPUT) and self._take_once(frame):
                    if self.user.is_muted(processor):
                        self.user.dropped(frame)
                    else:
                        self.user.take(frame)
            elif isinstance(processor, LLMAssistantAggregator):
                if id(processor) not in self._context_aggregators:
                    self._context_aggregators.add(id(processor))
                    if isinstance(self.call, FoldedSink):
                        fix_after_aggregator(processor, self._percall)
            if id(processor) in self._context_aggregators and isinstance(frame, _INJECTED) and self._take_once(frame):
                self._injected(frame)
        except Exception:  # a recording bug must never break a live call
            log.exception("calltape: failed to record %s", getattr(data.frame, "name", data.frame))

    async def on_push_frame(self, data: FramePushed) -> None:
        """Maps one frame push; never raises into the pipeline and never awaits I/O."""
        if self._detached:
            return
        try:
            frame = data.frame
            if isinstance(data.source, BaseOutputTransport) and data.direction == FrameDirection.DOWNSTREAM:
                self._voiced = True
                self._on_transport_push(frame)
            if MUTE_FRAMES and isinstance(frame, MUTE_FRAMES) and isinstance(data.source, LLMUserAggregator):
                self.user.mute_changed(data.source, frame)
            if self._first_push(data) and not self._is_sibling(frame):
                self._on_frame(frame)
        except Exception:  # a recording bug must never break a live call
            log.exception("calltape: failed to record %s", getattr(data.frame, "name", data.frame))

    async def cleanup(self) -> None:
        """The pipeline is gone: settle the session as the last frame said (EndFrame / CancelFrame)."""
        await super().cleanup()  # type: ignore[no-untyped-call]
        await self.settle()

    async def settle(self) -> None:
        """Ends or drops the session once, as configured; safe to call again."""
        if self._settled or self._finished is None:
            return
        self._settled = True
        try:
            action = self._on_end if self._finished == "end" else self._on_cancel
            reason = self._finish_reason if action == "end" else self._finish_reason or "pipeline cancelled"
            if action == "none":
                return
            if self.live is None:  # a recording-only sink: the session's end is one more event
                kind = "session.ended" if action == "end" else "session.dropped"
                self._emit(kind, {"reason": reason} if reason else {})
            elif action == "end":
                await self.live.end(reason)
            else:
                await self.live.drop(reason)
        except Exception:
            log.exception("calltape: could not settle the session")

    # -- dedupe --------------------------------------------------------------------------------

    def _first_push(self, data: FramePushed) -> bool:
        """Pipecat >= 1.11 says whether a push is a frame's first hop; before, every hop looks alike."""
        first = getattr(data, "first_push", None)
        if first is not None:
            return bool(first)
        frame_id = data.frame.id
        if frame_id in self._pushed:
            return False
        self._pushed[frame_id] = None
        if len(self._pushed) > 4096:
            self._pushed.pop(next(iter(self._pushed)))
        return True

    def _is_sibling(self, frame: Frame) -> bool:
        """A broadcast frame comes as two instances (one each way); record it once."""
        sibling = getattr(frame, "broadcast_sibling_id", None)
        if sibling is None:
            return False
        if sibling in self._siblings:
            return True
        self._siblings.append(frame.id)
        return False

    def _take_once(self, frame: Frame) -> bool:
        """A frame (or its broadcast sibling) is taken by the first aggregator that processes it."""
        if frame.id in self._taken:
            return False
        sibling = getattr(frame, "broadcast_sibling_id", None)
        if sibling is not None and sibling in self._taken:
            return False
        self._taken.append(frame.id)
        return True

    # -- emitting ------------------------------------------------------------------------------

    def _emit(self, event_type: str, data: Mapping[str, Any]) -> None:
        try:
            self.replies.emit(event_type, data)
        except Exception:
            log.exception("calltape: could not record %s", event_type)

    # -- first pushes: what happened -----------------------------------------------------------

    def _on_frame(self, frame: Frame) -> None:
        if isinstance(frame, USER_INPUT):
            if not self._user_aggregators:  # no user aggregator: the input counts where it appears
                self.user.take(frame)
        elif isinstance(frame, _INJECTED):
            if not self._context_aggregators and self._take_once(frame):
                self._injected(frame)
        elif isinstance(frame, InputTextRawFrame):
            if frame.text.strip():
                self.user.spoke = True
                self._emit("user.text", {"text": frame.text})
        elif isinstance(frame, LLMTextFrame):
            self._agent_text(frame.text)
        elif isinstance(frame, InterruptionFrame):
            self._interruption()
        elif isinstance(frame, _RECORDED):
            for kind, record in _RECORDERS:
                if isinstance(frame, kind):
                    record(self, frame)
                    break
        elif isinstance(frame, BotStartedSpeakingFrame):
            self._bot_speaking = True
            if self._playing is not None:
                self.replies.speech_started(self._playing)
        elif isinstance(frame, BotStoppedSpeakingFrame):
            self._bot_speaking = False
            playing = self._playouts.get(self._playing or "")
            if playing is not None and playing.end_played:
                self._speech_ended(playing.rid)
            self._cut_speech_ended()
        elif isinstance(frame, EndFrame):
            self._finished = self._finished or "end"
            self._finish_reason = _reason(frame.reason)
        elif isinstance(frame, CancelFrame):
            self._finished = "cancel"
            self._finish_reason = _reason(frame.reason)

    def _injected(self, frame: Frame) -> None:
        if isinstance(frame, LLMMessagesAppendFrame):
            self.messages.append(frame.messages)
        elif isinstance(frame, LLMMessagesUpdateFrame):
            self.messages.update(frame.messages)
        elif isinstance(frame, LLMMessagesTransformFrame):
            self.messages.transform(frame.transform)

    # replies

    def _new_reply(self) -> str:
        rid = self.replies.begin()
        self._playouts[rid] = _Playout(rid, voiced=self._voiced)
        if len(self._playouts) > 64:  # old replies are settled; keep the bookkeeping small
            self._playouts.pop(next(iter(self._playouts)))
        self.user.spoke = False
        return rid

    def _reply_started(self, frame: LLMFullResponseStartFrame) -> None:
        rid = self._new_reply()
        self._frame_reply[frame.id] = rid
        self._generating = rid

    def _agent_text(self, text: str) -> None:
        if self._generating is not None:
            self.replies.text(self._generating, text)

    def _reply_done(self, frame: LLMFullResponseEndFrame) -> None:
        rid = self._generating
        if rid is None:
            return
        self._frame_reply[frame.id] = rid
        self._generating = None
        self.replies.done(rid)
        self._settle_unvoiced(rid)

    def _settle_unvoiced(self, rid: str) -> None:
        """No output transport: the text is seen as it streams; nothing is left waiting to be heard."""
        playout = self._playouts.get(rid)
        st = self.replies.state(rid)
        if playout is None or playout.voiced or st is None or not st.awaiting_playout:
            return
        self.replies.speech_started(rid)
        self.replies.speech_ended(rid, interrupted=False, heard=st.generated)

    def _speak(self, frame: TTSSpeakFrame) -> None:
        """Text spoken outside the LLM (greetings, fillers) is a reply of its own when it joins the context."""
        if not getattr(frame, "append_to_context", True) or not frame.text.strip():
            return
        rid = self._new_reply()
        self.replies.text(rid, frame.text)
        self.replies.done(rid)
        self._pending_speak.append(rid)
        self._settle_unvoiced(rid)

    # tools

    def _tool_calls(self, frame: FunctionCallsStartedFrame) -> None:
        rid = self._generating or self.replies.current
        for fc in frame.function_calls:
            call_id = fc.tool_call_id
            self._percall.call_reply[call_id] = rid
            data: dict[str, Any] = {
                "call": call_id,
                "name": fc.function_name,
                "arguments": jsonable(dict(fc.arguments or {})),
            }
            if rid:
                data["reply"] = rid
            self._emit("tool.call", data)
            self._percall.seen(call_id).set()

    def _guarded(self, name: str) -> bool:
        return name in self._percall.guarded_names

    def _tool_started(self, frame: FunctionCallInProgressFrame) -> None:
        if self._guarded(frame.function_name):
            return  # the guard commits tool.started itself, and only if the body really runs
        self._started_calls.add(frame.tool_call_id)
        if self.replies.view().tool_call(frame.tool_call_id) is None:
            # Announced without a FunctionCallsStartedFrame (an app or a service pushing the in-progress
            # frame itself): the call is what the in-progress frame says.
            rid = self._generating or self.replies.current
            data: dict[str, Any] = {
                "call": frame.tool_call_id,
                "name": frame.function_name,
                "arguments": jsonable(dict(frame.arguments or {})),
            }
            if rid:
                data["reply"] = rid
            self._emit("tool.call", data)
        self._emit("tool.started", {"call": frame.tool_call_id})

    def _tool_result(self, frame: FunctionCallResultFrame) -> None:
        if self._guarded(frame.function_name):
            return
        output = jsonable(frame.result)
        if frame.properties is not None and not frame.properties.is_final:
            self._emit("tool.progress", {"call": frame.tool_call_id, "state": output})
            return
        data: dict[str, Any] = {"call": frame.tool_call_id, "output": output}
        if getattr(frame, "error", None):
            data["error"] = True
        self._emit("tool.result", data)

    def _tool_cancelled(self, frame: FunctionCallCancelFrame) -> None:
        call_id = frame.tool_call_id
        # Pipecat sets run_llm on a cancel only when the call's own timeout fired.
        reason = "timeout" if getattr(frame, "run_llm", False) else "interrupted"
        if self._guarded(frame.function_name):
            if call_id in self._percall.guard_entered:
                return  # the guard records how it ended
            outcome = "not_run"  # cancelled before the guarded handler was entered
        else:
            outcome = "unknown" if call_id in self._started_calls else "not_run"
            if reason == "interrupted" and outcome == "unknown":
                outcome = ""  # cancelled on purpose; the context says "cancelled"
        data: dict[str, Any] = {"call": call_id, "reason": reason}
        if outcome:
            data["outcome"] = outcome
        self._emit("tool.cancelled", data)

    # interruption and speech

    def _active(self, rid: str) -> bool:
        """The fold's own test (:meth:`ReplyTracker.active`): generating, unheard, or with an
        included call still running."""
        return self.replies.active(rid)

    def _interruption(self) -> None:
        # The user's when they spoke since the reply began (the VAD edge may well be over by the time
        # a transcript-based turn strategy interrupts); else the app's or the pipeline's.
        cause = "user_speech" if (self.user.speaking or self.user.spoke) else "system"
        for rid in [r for r in self._playouts if self._active(r)]:
            st = self.replies.state(rid)
            playout = self._playouts[rid]
            heard = playout.heard(st.generated) if st is not None and st.speech_started else None
            try:
                self.replies.interrupt(rid, cause=cause, heard=heard)
            except Exception:
                log.exception("calltape: could not record the interruption")
        if self._generating is not None and not self._active(self._generating):
            self._generating = None
        self._pending_speak.clear()

    def _on_transport_push(self, frame: Frame) -> None:
        """Frames leaving the output transport: playout order, after the audio before them."""
        if isinstance(frame, LLMFullResponseStartFrame):
            self._playing = self._frame_reply.get(frame.id, self._playing)
        elif isinstance(frame, TTSStartedFrame):
            self._playing = self._reply_for_tts(frame.context_id)
        elif isinstance(frame, TTSTextFrame):
            rid = self._tts_reply.get(frame.context_id or "", self._playing)
            if rid is not None and getattr(frame, "append_to_context", True):
                self._heard(rid, frame.text)
        elif isinstance(frame, LLMFullResponseEndFrame):
            rid = self._frame_reply.pop(frame.id, None)
            playout = self._playouts.get(rid or "")
            if playout is not None:
                playout.end_played = True
                if not self._bot_speaking:
                    self._speech_ended(playout.rid)

    def _reply_for_tts(self, context_id: str | None) -> str | None:
        key = context_id or ""
        rid = self._tts_reply.get(key)
        if rid is None:
            playing = self._playouts.get(self._playing or "")
            in_llm_reply = playing is not None and not playing.end_played
            if self._pending_speak and not in_llm_reply:
                rid = self._pending_speak.popleft()
                self._playouts[rid].end_played = True  # a spoken utterance ends when its audio does
            else:
                rid = self._playing
            if rid is not None:
                self._tts_reply[key] = rid
                if len(self._tts_reply) > 128:
                    self._tts_reply.pop(next(iter(self._tts_reply)))
        return rid

    def _heard(self, rid: str, text: str) -> None:
        """Moves the reply's playout cursor past ``text`` (kept as a prefix of the generated text)."""
        playout, st = self._playouts.get(rid), self.replies.state(rid)
        piece = text.strip()
        if playout is None or st is None or st.interrupted or not piece:
            return
        generated = st.generated
        index = generated.find(piece, playout.cursor)
        if index >= 0 and not playout.extra:
            playout.cursor = index + len(piece)
        else:
            playout.extra += (" " if playout.heard(generated) else "") + piece
        self.replies.speech_started(rid)
        self.replies.heard(rid, playout.heard(generated))

    def _cut_speech_ended(self) -> None:
        """The bot went quiet: an interrupted reply that was playing stopped here (Pipecat drops its
        end frame on the interruption, so this is the only sign that the talking over ended)."""
        for rid in list(self._playouts):
            st = self.replies.state(rid)
            if st is not None and st.interrupted and st.speech_started and not st.speech_ended:
                self.replies.speech_ended(rid, interrupted=True)

    def _speech_ended(self, rid: str) -> None:
        st = self.replies.state(rid)
        if st is None or st.speech_ended or st.interrupted or not st.speech_started:
            return
        # Played to the end: the user heard all of it, whitespace included.
        self.replies.speech_ended(rid, interrupted=False, heard=st.generated)


_RECORDERS: tuple[tuple[type[Frame], Callable[[CalltapeObserver, Any], None]], ...] = (
    (LLMFullResponseStartFrame, CalltapeObserver._reply_started),
    (LLMFullResponseEndFrame, CalltapeObserver._reply_done),
    (TTSSpeakFrame, CalltapeObserver._speak),
    (FunctionCallsStartedFrame, CalltapeObserver._tool_calls),
    (FunctionCallInProgressFrame, CalltapeObserver._tool_started),
    (FunctionCallResultFrame, CalltapeObserver._tool_result),
    (FunctionCallCancelFrame, CalltapeObserver._tool_cancelled),
)
"""The frames a first push records by handing them whole to one method (the first kind that matches)."""
_RECORDED = tuple(kind for kind, _ in _RECORDERS)


def _reason(value: Any) -> str | None:
    return None if value is None else str(value)
