"""calltape for Pipecat (pipecat-ai >=1.14,<1.15): record, guard tools, seed new pipelines.

Three pieces, each usable alone:

* :class:`CalltapeObserver` — ``PipelineWorker(pipeline, observers=[CalltapeObserver(call)])`` records
  the call. It reads frames where they really happen: a reply's text where the LLM pushes it, the words
  the user heard where the output transport releases them (a ``TTSTextFrame`` leaves the transport only
  after the audio before it was written), tool calls where the LLM service announces them. Pipecat
  already runs observers off the pipeline on their own queue, and the observer only calls the
  synchronous ``call.emit``, so recording never holds a frame back.
* :func:`register_function` — a drop-in for ``llm.register_function`` that runs the handler under
  ``call.run_tool``: ``tool.started`` is committed before the handler runs, every call has a timeout,
  a call id that already has a result is not run again, and a call of an interrupted generation that
  has not started yet is never started (pipecat-ai#4997).
* :func:`context_messages` / :func:`seed_llm_context` — turn calltape's context into the messages of a
  new ``LLMContext`` for a resumed or handed-off call; every tool call has exactly one settled output,
  so nothing is left ``IN_PROGRESS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

try:
    from pipecat.frames.frames import (
        BotStartedSpeakingFrame,
        BotStoppedSpeakingFrame,
        CancelFrame,
        EndFrame,
        Frame,
        FunctionCallCancelFrame,
        FunctionCallInProgressFrame,
        FunctionCallResultFrame,
        FunctionCallResultProperties,
        FunctionCallsStartedFrame,
        InputTextRawFrame,
        InterimTranscriptionFrame,
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TranscriptionFrame,
        TTSSpeakFrame,
        TTSStartedFrame,
        TTSTextFrame,
        UserStartedSpeakingFrame,
        UserStoppedSpeakingFrame,
        VADUserStartedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.observers.base_observer import BaseObserver, FramePushed
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.frame_processor import FrameDirection
    from pipecat.services.llm_service import FunctionCallParams, LLMService
    from pipecat.transports.base_output import BaseOutputTransport
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "calltape.adapters.pipecat needs Pipecat: pip install 'calltape[pipecat]' (pipecat-ai>=1.14,<1.15)"
    ) from exc

from calltape.events import new_event_id
from calltape.runtime import CallSession, ToolOutcome, ToolSpec

__all__ = [
    "CalltapeObserver",
    "context_messages",
    "register_function",
    "seed_llm_context",
]

log = logging.getLogger("calltape.adapters.pipecat")

SUPPORTED_PIPECAT = ">=1.14,<1.15"

Handler = Callable[[FunctionCallParams], Awaitable[None]]


# ---------------------------------------------------------------------------------------------
# State shared by the observer and the guarded functions of one CallSession.


@dataclass
class _Shared:
    """What the guard needs from the observer: which reply asked for a call, and which names it owns."""

    guarded_names: set[str] = field(default_factory=set)
    call_reply: dict[str, str | None] = field(default_factory=dict)
    call_seen: dict[str, asyncio.Event] = field(default_factory=dict)
    guard_entered: set[str] = field(default_factory=set)
    background: set[asyncio.Future[Any]] = field(default_factory=set)
    observed: bool = False

    def seen(self, call_id: str) -> asyncio.Event:
        event = self.call_seen.get(call_id)
        if event is None:
            event = self.call_seen[call_id] = asyncio.Event()
        return event


_SHARED: weakref.WeakKeyDictionary[Any, _Shared] = weakref.WeakKeyDictionary()
_SHARED_BY_ID: dict[int, _Shared] = {}


def _shared(call: Any) -> _Shared:
    try:
        state = _SHARED.get(call)
        if state is None:
            state = _SHARED[call] = _Shared()
        return state
    except TypeError:  # a CallSession without __weakref__: keep it for the process lifetime
        return _SHARED_BY_ID.setdefault(id(call), _Shared())


def _jsonable(value: Any) -> Any:
    """A tool result as JSON (pipecat results are arbitrary Python; the log stores JSON)."""
    try:
        return orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))
    except (TypeError, orjson.JSONEncodeError):
        return str(value)


# ---------------------------------------------------------------------------------------------
# Recording


@dataclass
class _Reply:
    rid: str
    generated: str = ""
    done: bool = False
    interrupted: bool = False
    speech_started: bool = False
    speech_ended: bool = False
    end_played: bool = False  # the reply's LLMFullResponseEndFrame left the output transport
    heard_cursor: int = 0
    heard_extra: str = ""  # spoken text not found in the generated text (e.g. a TTSSpeakFrame)
    voiced: bool = False  # an output transport will play it (else nothing is "waiting to be heard")

    @property
    def heard(self) -> str:
        return self.generated[: self.heard_cursor] + self.heard_extra

    @property
    def waiting(self) -> bool:
        """Generating, or generated text whose playout has not ended."""
        if self.interrupted or self.speech_ended:
            return False
        return not self.done or (self.voiced and bool(self.generated.strip()))


class CalltapeObserver(BaseObserver):
    """Records a Pipecat pipeline into a calltape :class:`~calltape.runtime.CallSession`.

    Attach with one line: ``PipelineWorker(pipeline, observers=[CalltapeObserver(call)])``.

    ``on_end`` / ``on_cancel`` say what the end of the pipeline means for the session: by default an
    ``EndFrame`` ends the session and a ``CancelFrame`` marks it dropped (resumable). Pass ``"none"``
    when the session continues elsewhere (handoff to another pipeline).
    """

    def __init__(
        self,
        call: CallSession,
        *,
        on_end: Literal["end", "none"] = "end",
        on_cancel: Literal["drop", "end", "none"] = "drop",
    ) -> None:
        # Every push, not only the first: the output transport passes on TTSTextFrames it did not
        # create, and that hop is the moment the user heard them.
        super().__init__(observe_every_push=True)
        self.call = call
        self._shared = _shared(call)
        self._shared.observed = True
        self._on_end = on_end
        self._on_cancel = on_cancel
        self._siblings: deque[int] = deque(maxlen=512)
        self._replies: dict[str, _Reply] = {}
        self._order: list[_Reply] = []
        self._frame_reply: dict[int, _Reply] = {}
        self._generating: _Reply | None = None
        self._playing: _Reply | None = None  # the reply the output transport is playing out
        self._tts_reply: dict[str, _Reply] = {}  # TTS context id -> reply
        self._pending_speak: deque[_Reply] = deque()
        self._bot_speaking = False
        self._transport_seen = False
        self._vad_seen = False
        self._user_speaking = False
        self._started_calls: set[str] = set()
        self._finished: Literal["end", "cancel"] | None = None
        self._finish_reason: str | None = None
        self._settled = False

    # -- the pipecat hook ----------------------------------------------------------------------

    async def on_push_frame(self, data: FramePushed) -> None:
        """Maps one frame push; never raises into the pipeline and never awaits I/O."""
        try:
            frame = data.frame
            if isinstance(data.source, BaseOutputTransport) and data.direction == FrameDirection.DOWNSTREAM:
                self._transport_seen = True
                self._on_transport_push(frame)
            if data.first_push and not self._is_sibling(frame):
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
            if action == "end":
                await self.call.end(self._finish_reason)
            elif action == "drop":
                await self.call.drop(self._finish_reason or "pipeline cancelled")
        except Exception:
            log.exception("calltape: could not settle the session")

    # -- dedupe --------------------------------------------------------------------------------

    def _is_sibling(self, frame: Frame) -> bool:
        """A broadcast frame comes as two instances (one each way); record it once."""
        sibling = frame.broadcast_sibling_id
        if sibling is None:
            return False
        if sibling in self._siblings:
            return True
        self._siblings.append(frame.id)
        return False

    # -- emitting ------------------------------------------------------------------------------

    def _emit(self, event_type: str, data: Mapping[str, Any]) -> None:
        try:
            self.call.emit(event_type, data)
        except Exception:
            log.exception("calltape: could not record %s", event_type)

    # -- first pushes: what happened -----------------------------------------------------------

    def _on_frame(self, frame: Frame) -> None:
        if isinstance(frame, VADUserStartedSpeakingFrame):
            self._vad_seen = True
            self._user_started("vad")
        elif isinstance(frame, VADUserStoppedSpeakingFrame):
            self._vad_seen = True
            self._user_stopped()
        elif isinstance(frame, UserStartedSpeakingFrame):
            if not self._vad_seen:
                self._user_started(None)
        elif isinstance(frame, UserStoppedSpeakingFrame):
            if not self._vad_seen:
                self._user_stopped()
        elif isinstance(frame, InterimTranscriptionFrame):
            if frame.text.strip():
                self._emit("user.transcript", {"text": frame.text, "final": False})
        elif isinstance(frame, TranscriptionFrame):
            if frame.text.strip():
                self._emit("user.transcript", {"text": frame.text, "final": True})
        elif isinstance(frame, InputTextRawFrame):
            if frame.text.strip():
                self._emit("user.text", {"text": frame.text})
        elif isinstance(frame, LLMFullResponseStartFrame):
            self._reply_started(frame)
        elif isinstance(frame, LLMTextFrame):
            self._agent_text(frame.text)
        elif isinstance(frame, LLMFullResponseEndFrame):
            self._reply_done(frame)
        elif isinstance(frame, TTSSpeakFrame):
            self._speak(frame)
        elif isinstance(frame, FunctionCallsStartedFrame):
            self._tool_calls(frame)
        elif isinstance(frame, FunctionCallInProgressFrame):
            self._tool_started(frame)
        elif isinstance(frame, FunctionCallResultFrame):
            self._tool_result(frame)
        elif isinstance(frame, FunctionCallCancelFrame):
            self._tool_cancelled(frame)
        elif isinstance(frame, InterruptionFrame):
            self._interruption()
        elif isinstance(frame, BotStartedSpeakingFrame):
            self._bot_speaking = True
            if self._playing is not None:
                self._speech_started(self._playing)
        elif isinstance(frame, BotStoppedSpeakingFrame):
            self._bot_speaking = False
            if self._playing is not None and self._playing.end_played:
                self._speech_ended(self._playing)
        elif isinstance(frame, EndFrame):
            self._finished = self._finished or "end"
            self._finish_reason = _reason(frame.reason)
        elif isinstance(frame, CancelFrame):
            self._finished = "cancel"
            self._finish_reason = _reason(frame.reason)

    def _user_started(self, source: str | None) -> None:
        if self._user_speaking:
            return
        self._user_speaking = True
        self._emit("user.speech.started", {"source": source} if source else {})

    def _user_stopped(self) -> None:
        if not self._user_speaking:
            return
        self._user_speaking = False
        self._emit("user.speech.stopped", {})

    def _new_reply(self) -> _Reply:
        reply = _Reply(rid=new_event_id(), voiced=self._transport_seen)
        self._replies[reply.rid] = reply
        self._order.append(reply)
        if len(self._order) > 64:  # old replies are settled; keep the bookkeeping small
            old = self._order.pop(0)
            self._replies.pop(old.rid, None)
        self._emit("agent.reply.started", {"reply": reply.rid})
        return reply

    def _reply_started(self, frame: LLMFullResponseStartFrame) -> None:
        reply = self._new_reply()
        self._frame_reply[frame.id] = reply
        self._generating = reply

    def _agent_text(self, text: str) -> None:
        reply = self._generating
        if reply is None or not text:
            return
        reply.generated += text
        self._emit("agent.text", {"reply": reply.rid, "text": text})

    def _reply_done(self, frame: LLMFullResponseEndFrame) -> None:
        reply = self._generating
        if reply is None:
            return
        self._frame_reply[frame.id] = reply
        reply.done = True
        self._generating = None
        self._emit("agent.reply.done", {"reply": reply.rid})

    def _speak(self, frame: TTSSpeakFrame) -> None:
        """Text spoken outside the LLM (greetings, fillers) is a reply of its own when it joins the context."""
        if not frame.append_to_context or not frame.text.strip():
            return
        reply = self._new_reply()
        reply.generated = frame.text
        self._emit("agent.text", {"reply": reply.rid, "text": frame.text})
        reply.done = True
        self._emit("agent.reply.done", {"reply": reply.rid})
        self._pending_speak.append(reply)

    # tools

    def _tool_calls(self, frame: FunctionCallsStartedFrame) -> None:
        reply = self._generating or (self._order[-1] if self._order else None)
        for fc in frame.function_calls:
            call_id = fc.tool_call_id
            rid = reply.rid if reply else None
            self._shared.call_reply[call_id] = rid
            data: dict[str, Any] = {
                "call": call_id,
                "name": fc.function_name,
                "arguments": _jsonable(dict(fc.arguments or {})),
            }
            if rid:
                data["reply"] = rid
            self._emit("tool.call", data)
            self._shared.seen(call_id).set()

    def _guarded(self, name: str) -> bool:
        return name in self._shared.guarded_names

    def _tool_started(self, frame: FunctionCallInProgressFrame) -> None:
        if self._guarded(frame.function_name):
            return  # the guard commits tool.started itself, and only if the body really runs
        self._started_calls.add(frame.tool_call_id)
        self._emit("tool.started", {"call": frame.tool_call_id})

    def _tool_result(self, frame: FunctionCallResultFrame) -> None:
        if self._guarded(frame.function_name):
            return
        output = _jsonable(frame.result)
        if frame.properties is not None and not frame.properties.is_final:
            self._emit("tool.progress", {"call": frame.tool_call_id, "state": output})
            return
        data: dict[str, Any] = {"call": frame.tool_call_id, "output": output}
        if frame.error:
            data["error"] = True
        self._emit("tool.result", data)

    def _tool_cancelled(self, frame: FunctionCallCancelFrame) -> None:
        call_id = frame.tool_call_id
        # Pipecat sets run_llm on a cancel only when the call's own timeout fired.
        reason = "timeout" if frame.run_llm else "interrupted"
        if self._guarded(frame.function_name):
            if call_id in self._shared.guard_entered:
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

    def _interruption(self) -> None:
        cause = "user_speech" if self._user_speaking else "system"
        for reply in [r for r in self._order if r.waiting]:
            heard = reply.heard if reply.speech_started else None
            reply.interrupted = True
            reply.speech_ended = True
            try:
                self.call.interrupt(reply=reply.rid, cause=cause, heard=heard)
            except Exception:
                log.exception("calltape: could not record the interruption")
        if self._generating is not None and self._generating.interrupted:
            self._generating = None
        self._pending_speak.clear()

    def _on_transport_push(self, frame: Frame) -> None:
        """Frames leaving the output transport: playout order, after the audio before them."""
        if isinstance(frame, LLMFullResponseStartFrame):
            self._playing = self._frame_reply.get(frame.id, self._playing)
        elif isinstance(frame, TTSStartedFrame):
            self._playing = self._reply_for_tts(frame.context_id)
        elif isinstance(frame, TTSTextFrame):
            reply = self._tts_reply.get(frame.context_id or "", self._playing)
            if reply is not None and frame.append_to_context and not reply.interrupted:
                self._heard(reply, frame.text)
        elif isinstance(frame, LLMFullResponseEndFrame):
            reply = self._frame_reply.pop(frame.id, None)
            if reply is not None:
                reply.end_played = True
                if not self._bot_speaking:
                    self._speech_ended(reply)

    def _reply_for_tts(self, context_id: str | None) -> _Reply | None:
        key = context_id or ""
        reply = self._tts_reply.get(key)
        if reply is None:
            playing = self._playing
            in_llm_reply = playing is not None and not playing.end_played
            if self._pending_speak and not in_llm_reply:
                reply = self._pending_speak.popleft()
                reply.end_played = True  # a spoken utterance ends when its audio does
            else:
                reply = playing
            if reply is not None:
                self._tts_reply[key] = reply
                if len(self._tts_reply) > 128:
                    self._tts_reply.pop(next(iter(self._tts_reply)))
        return reply

    def _heard(self, reply: _Reply, text: str) -> None:
        """Moves the reply's playout cursor past ``text`` (kept as a prefix of the generated text)."""
        piece = text.strip()
        if not piece:
            return
        index = reply.generated.find(piece, reply.heard_cursor)
        if index >= 0 and not reply.heard_extra:
            reply.heard_cursor = index + len(piece)
        else:
            reply.heard_extra += (" " if reply.heard else "") + piece
        self._speech_started(reply)
        self._emit("agent.speech.progress", {"reply": reply.rid, "heard": reply.heard})

    def _speech_started(self, reply: _Reply) -> None:
        if reply.speech_started or reply.interrupted:
            return
        reply.speech_started = True
        self._emit("agent.speech.started", {"reply": reply.rid})

    def _speech_ended(self, reply: _Reply) -> None:
        if reply.speech_ended or reply.interrupted or not reply.speech_started:
            return
        reply.speech_ended = True
        # Played to the end: the user heard all of it, whitespace included.
        self._emit("agent.speech.ended", {"reply": reply.rid, "interrupted": False, "heard": reply.generated})


def _reason(value: Any) -> str | None:
    return None if value is None else str(value)


# ---------------------------------------------------------------------------------------------
# Guarded functions


def register_function(
    llm: LLMService,
    call: CallSession,
    function_name: str,
    handler: Handler,
    *,
    spec: ToolSpec | None = None,
    timeout_secs: float | None = None,
    cancel_on_interruption: bool | None = None,
    cancellable_by_llm: bool | None = None,
) -> None:
    """Drop-in for ``llm.register_function(name, handler)`` that runs ``handler`` under calltape.

    The handler keeps its Pipecat signature (``async def handler(params)`` and
    ``await params.result_callback(result)``). ``spec`` (a :class:`~calltape.runtime.ToolSpec`) sets the
    timeout (``timeout_secs`` overrides it), the interruption policy, idempotency and reuse; the
    timeout is calltape's, so Pipecat's own ``timeout_secs`` is left unset. With
    ``on_interrupt="finish"`` (the default) a call Pipecat cancels on a barge-in keeps running and its
    result lands in calltape's context; with ``"cancel"`` the cancellation reaches the handler.
    """
    shared = _shared(call)
    shared.guarded_names.add(function_name)
    tool_spec = spec or call.tools.get(function_name) or ToolSpec()
    if timeout_secs is not None:
        tool_spec = dataclasses.replace(tool_spec, timeout=timeout_secs)
    guarded = _GuardedFunction(call, shared, function_name, handler, tool_spec)
    llm.register_function(
        function_name,
        guarded,
        cancel_on_interruption=cancel_on_interruption,
        cancellable_by_llm=cancellable_by_llm,
    )


class _GuardedFunction:
    """The Pipecat handler that wraps the user's handler in ``call.run_tool``."""

    # How long to wait for the observer to announce a call before recording it without its reply.
    ANNOUNCE_WAIT = 0.5

    def __init__(self, call: Any, shared: _Shared, name: str, handler: Handler, spec: Any) -> None:
        self.call = call
        self.shared = shared
        self.name = name
        self.handler = handler
        self.spec = spec
        self.__name__ = getattr(handler, "__name__", name)
        self.__doc__ = handler.__doc__
        # Pipecat's @tool_options decorations stay visible to register_function.
        for attr in ("_pipecat_cancel_on_interruption", "_pipecat_timeout_secs", "_pipecat_cancellable_by_llm"):
            if hasattr(handler, attr):
                setattr(self, attr, getattr(handler, attr))

    async def __call__(self, params: FunctionCallParams) -> None:
        call_id = params.tool_call_id
        reply = await self._announced(params)
        self.shared.guard_entered.add(call_id)
        arguments = _jsonable(dict(params.arguments or {}))
        body = self._body(params)
        inner = asyncio.ensure_future(
            self.call.run_tool(call_id, self.name, arguments, body, reply=reply, spec=self.spec)
        )
        try:
            outcome: ToolOutcome = await asyncio.shield(inner)
        except asyncio.CancelledError:
            # Pipecat gave up on the call (barge-in with cancel_on_interruption, teardown). calltape's
            # ToolSpec decides what happens to the tool: "cancel" stops it when the interruption is
            # recorded, "finish" lets it run, and either way it ends under its timeout, in the log.
            self.shared.background.add(inner)
            inner.add_done_callback(_forget(self.shared.background))
            raise
        properties = None
        if not outcome.ran and outcome.status == "cancelled":
            # A call of an interrupted generation: settle it in Pipecat's context without a new inference.
            properties = FunctionCallResultProperties(run_llm=False)
        with contextlib.suppress(Exception):
            await params.result_callback(outcome.output, properties=properties)

    async def _announced(self, params: FunctionCallParams) -> str | None:
        """The reply that asked for this call, once the observer has recorded ``tool.call``."""
        call_id = params.tool_call_id
        if call_id not in self.shared.call_reply and self.shared.observed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.shared.seen(call_id).wait(), self.ANNOUNCE_WAIT)
        # Let the observer take in what was pushed before this call ran (an interruption, say).
        await asyncio.sleep(0)
        # Unannounced (no observer): run_tool records tool.call itself, without a reply.
        self.shared.call_seen.pop(call_id, None)
        return self.shared.call_reply.get(call_id)

    def _body(self, params: FunctionCallParams) -> Callable[[Any], Awaitable[Any]]:
        handler = self.handler

        async def body(progress: Callable[..., Any]) -> Any:
            result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

            async def result_callback(value: Any, *, properties: FunctionCallResultProperties | None = None) -> None:
                if properties is not None and not properties.is_final:
                    done = progress(_jsonable(value))
                    if inspect.isawaitable(done):
                        await done
                    return
                if not result.done():
                    result.set_result(value)

            own = _copy_params(params, result_callback)
            task = asyncio.ensure_future(handler(own))
            try:
                await asyncio.wait({task, result}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                task.cancel()  # calltape's timeout or an interruption with on_interrupt="cancel"
                raise
            try:
                if not result.done():
                    task.result()  # raises the handler's exception, if any
                    return None  # returned without a result: Pipecat would say "COMPLETED"
                return _jsonable(result.result())
            finally:
                if not task.done():
                    # Pipecat handlers may go on after reporting (cleanup, fillers); let them.
                    task.add_done_callback(_consume)
                if task.done() and not task.cancelled():
                    _consume(task)

        return body


def _forget(tasks: set[asyncio.Future[Any]]) -> Callable[[asyncio.Future[Any]], None]:
    def done(task: asyncio.Future[Any]) -> None:
        tasks.discard(task)
        _consume(task)

    return done


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _copy_params(params: FunctionCallParams, result_callback: Any) -> FunctionCallParams:
    return dataclasses.replace(params, result_callback=result_callback)


# ---------------------------------------------------------------------------------------------
# Seeding a new pipeline


def context_messages(source: CallSession | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of a new ``LLMContext``: calltape's ``openai`` context, settled.

    ``source`` is a :class:`~calltape.runtime.CallSession` (e.g. attached after ``resume``) or an
    already projected ``openai`` messages list (e.g. a resume plan's context in that format). Each tool
    call keeps exactly one output, so a new pipeline never inherits an ``IN_PROGRESS`` placeholder.
    """
    if hasattr(source, "context"):
        messages = source.context("openai")
    else:
        messages = source
    out: list[dict[str, Any]] = []
    for message in messages:
        item = dict(message)
        if item.get("role") == "assistant" and item.get("tool_calls"):
            item["tool_calls"] = [dict(tc) for tc in item["tool_calls"]]
        out.append(item)
    return out


def seed_llm_context(
    source: CallSession | Iterable[Mapping[str, Any]],
    *,
    tools: Any = None,
    tool_choice: Any = None,
) -> LLMContext:
    """A new ``LLMContext`` holding calltape's settled context (resume or handoff into a new pipeline)."""
    kwargs: dict[str, Any] = {}
    if tools is not None:
        kwargs["tools"] = tools
    if tool_choice is not None:
        kwargs["tool_choice"] = tool_choice
    messages: list[Any] = context_messages(source)
    return LLMContext(messages=messages, **kwargs)
