"""OpenAI Realtime API tap (and Inworld's Realtime API, which speaks the same events).

The application keeps its own Realtime connection; it hands every server event it receives and every
client event it sends to :class:`RealtimeTap`, which records calltape events into a live call (a
:class:`calltape.runtime.LiveCall`, such as :class:`calltape.runtime.CallSession`; recording alone needs
only an :class:`calltape.runtime.EventSink`).

Three protocol facts shape the mapping:

* ``response.function_call_arguments.done`` is also emitted for a response that is then cancelled, so a
  function call is only recorded (``tool.call``) once its ``response.done`` says ``completed``. Calls of a
  cancelled/failed/incomplete response are never offered to the application to run; they are kept as an
  ``x.realtime.discarded_calls`` note for audits.
* ``conversation.item.truncate`` (``audio_end_ms``) is the authority on what the user heard: the server
  drops the unheard transcript from its own context, so calltape does the same. The heard text is cut
  from the item's transcript in proportion to ``audio_end_ms`` over the item's audio duration (counted
  from the ``response.output_audio.delta`` bytes the tap saw; estimated from the text at ~15 characters
  per second when the audio does not travel over this connection, as with WebRTC), backed off to a word
  boundary so a half-spoken word is never claimed as heard.
* Input transcription runs asynchronously and often completes *after* the model's response was created.
  To keep the user turn before the reply it answers, the tap holds the reply's events back (up to
  ``transcript_hold_ms``) while a committed user item is still being transcribed.

Live reconciliation (``send=``): the Realtime *server* keeps its own conversation, and the model
reads it at every response. A guarded call still running when the user speaks would be seen there
without an output, and a result that lands after a barge-in would be lost to the live model. Given
``send`` (the coroutine that writes one client event to the connection), the tap keeps every function
call of the live conversation with exactly one ``function_call_output``, the one calltape's context
shows: when the user starts speaking (VAD) while a call runs, it puts the call's current calltape output
(``{"status": "in_progress"}``) in; when the tool lands, :meth:`RealtimeTap.run_tool` replaces it by
the real output (``conversation.item.delete`` then ``conversation.item.create`` after the call's item)
before it returns, so a ``response.create`` sent after it sees the result.

Both the GA event names (``response.output_audio_transcript.delta``) and the beta ones
(``response.audio_transcript.delta``) are understood.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import orjson

from calltape.adapters.replies import ReplyTracker
from calltape.canonical_json import json_text
from calltape.errors import InvalidEvent
from calltape.events import now_ms
from calltape.projections import output_text, to_realtime
from calltape.runtime.protocol import EventSink, LiveCall
from calltape.runtime.toolspec import ToolOutcome, ToolSpec

if TYPE_CHECKING:
    from openai.types.realtime import ConversationItemCreateEvent

__all__ = [
    "INWORLD_REALTIME_URL",
    "EventSink",
    "FunctionCall",
    "InworldEndpoint",
    "RealtimeTap",
    "heard_text",
    "seed_events",
]

Playout = Literal["response", "client", "output_audio_buffer"]

CHARS_PER_SECOND = 15.0
"""Speaking-rate estimate used only when the tap never saw the item's audio bytes."""

_TEXT_DELTAS = frozenset(
    {
        "response.output_audio_transcript.delta",  # GA
        "response.audio_transcript.delta",  # beta
        "response.output_text.delta",  # GA, text modality
        "response.text.delta",  # beta, text modality
    }
)
_AUDIO_DELTAS = frozenset({"response.output_audio.delta", "response.audio.delta"})
_BYTES_PER_MS = {
    "audio/pcm": 48.0,  # pcm16 mono at 24 kHz
    "pcm16": 48.0,
    "audio/pcmu": 8.0,  # G.711 at 8 kHz, one byte a sample
    "audio/pcma": 8.0,
    "g711_ulaw": 8.0,
    "g711_alaw": 8.0,
}


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """A function call whose response completed: safe to run."""

    call_id: str
    name: str
    arguments: str
    response_id: str
    item_id: str | None = None

    def parsed_arguments(self) -> Any:
        """The arguments as JSON values (the server sends a JSON string; an empty one means none)."""
        return orjson.loads(self.arguments) if self.arguments.strip() else {}


@dataclass(slots=True)
class _Response:
    """What only the Realtime protocol knows about a response; its reply lifecycle is in the fold."""

    id: str
    audio_bytes: dict[str, int] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    item_order: list[str] = field(default_factory=list)
    pending_calls: dict[str, FunctionCall] = field(default_factory=dict)
    cancel_requested: bool = False
    audio_started_ms: int | None = None
    """When its first audio arrived (a WebSocket client plays it as it arrives)."""
    playing: asyncio.TimerHandle | None = None
    """``playout="response"``: the end of its audio, when it is still playing at ``response.done``."""


def _as_dict(event: Any) -> dict[str, Any]:
    """Typed ``openai.types.realtime`` model, dict, or JSON text → a plain dict."""
    if isinstance(event, (str, bytes, bytearray)):
        try:
            event = orjson.loads(event)
        except orjson.JSONDecodeError as exc:
            raise InvalidEvent("a Realtime event must be a JSON object") from exc
    elif hasattr(event, "model_dump"):
        event = event.model_dump(mode="json", exclude_none=True)
    if not isinstance(event, Mapping) or not isinstance(event.get("type"), str):
        raise InvalidEvent("a Realtime event must be a JSON object with a 'type'")
    return dict(event)


def _b64_len(data: str) -> int:
    """Decoded length of base64 text without decoding it (audio deltas are large)."""
    n = len(data)
    if n == 0:
        return 0
    pad = 2 if data.endswith("==") else 1 if data.endswith("=") else 0
    return n * 3 // 4 - pad


def heard_text(text: str, audio_end_ms: int, audio_ms: float | None) -> str:
    """The part of ``text`` spoken in the first ``audio_end_ms`` of ``audio_ms`` of audio.

    Proportional to the audio position, then cut back to the last whole word: calltape never claims the
    user heard a word the audio stopped in the middle of.
    """
    if not text:
        return ""
    total = audio_ms if audio_ms and audio_ms > 0 else len(text) / CHARS_PER_SECOND * 1000.0
    if audio_end_ms >= total:
        return text
    cut = int(len(text) * max(audio_end_ms, 0) / total)
    if cut <= 0:
        return ""
    if cut < len(text) and not text[cut].isspace():
        space = text.rfind(" ", 0, cut + 1)
        cut = space if space > 0 else 0
    return text[:cut].rstrip()


class RealtimeTap:
    """Records one Realtime session into a live calltape call.

    Feed it with :meth:`server_event` (what the API sends) and :meth:`client_event` (what the app sends).
    ``server_event`` returns the function calls that became safe to run; run them with :meth:`run_tool`
    (guarded execution) and send :meth:`output_item` back.

    ``send``: the coroutine that writes a client event (a dict) to the Realtime connection; given it, the
    tap reconciles the live conversation with calltape's context (module docstring) and :meth:`run_tool`
    sends the tool's output itself.

    ``playout`` says who knows when the user finished hearing a reply: ``"response"`` (default, WebSocket:
    the reply is heard in full once its audio has played, counted from its first audio delta at the
    audio's length, or at ``response.done`` when that is later; a ``conversation.item.truncate`` before
    then cuts it; a text-only reply is heard at ``response.done``), ``"client"``
    (the app calls :meth:`playout_finished`), or ``"output_audio_buffer"`` (WebRTC/SIP: the server's
    ``output_audio_buffer.*`` events).
    """

    def __init__(
        self,
        call: EventSink,
        *,
        playout: Playout = "response",
        input_transcription: bool = True,
        transcript_hold_ms: int = 1500,
        clock: Callable[[], int] = now_ms,
        send: Callable[[dict[str, Any]], Awaitable[Any]] | None = None,
    ) -> None:
        self.call = call
        self.send = send
        self._outbox: list[dict[str, Any]] = []
        self._sending = asyncio.Lock()
        self._drain: asyncio.Task[None] | None = None
        self._running: dict[str, FunctionCall] = {}  # guarded calls whose body is running
        self._live_outputs: dict[str, str] = {}  # call id -> its output item in the live conversation
        self.replies = ReplyTracker(call)
        self.playout: Playout = playout
        self.input_transcription = input_transcription
        self.transcript_hold_ms = transcript_hold_ms
        self._clock = clock
        self._bytes_per_ms = 48.0
        self._responses: dict[str, _Response] = {}
        self._item_response: dict[str, str] = {}
        self._interim: dict[str, str] = {}
        self._awaiting: dict[str, int] = {}  # user item -> commit time, transcription not finished
        self._held_since: int | None = None
        self._truncations: set[tuple[str, int]] = set()
        self._results: set[str] = set()
        self._calls: dict[str, FunctionCall] = {}

    # -- public API -----------------------------------------------------------------------------

    def server_event(self, event: Any) -> list[FunctionCall]:
        """Records one server event; returns the calls that just became runnable (usually none)."""
        ev = _as_dict(event)
        self._release_if_stale()
        runnable = self._on_server(ev)
        if runnable:
            self._release()  # a call must be in the log, in order, before it runs
        return runnable

    def client_event(self, event: Any) -> None:
        """Records one client event the application sent (truncate, user text, tool output, cancel)."""
        ev = _as_dict(event)
        self._release_if_stale()
        kind = ev["type"]
        if kind == "conversation.item.truncate":
            self._on_truncate(str(ev.get("item_id", "")), int(ev.get("audio_end_ms", 0)))
        elif kind == "conversation.item.create":
            self._on_item_create(ev.get("item") or {})
        elif kind == "response.cancel":
            rid = ev.get("response_id")
            for resp in self._responses.values():
                if (rid is None and not self._done(resp)) or resp.id == rid:
                    resp.cancel_requested = True

    def playout_finished(self, response_id: str, *, interrupted: bool = False) -> None:
        """The app's player finished (or stopped) playing this response's audio."""
        resp = self._responses.get(response_id)
        if resp is not None:
            self._start_speech(resp)
            self.replies.speech_ended(resp.id, interrupted=interrupted)

    def playout_items(self, response_id: str) -> list[tuple[str, float]] | None:
        """The response's audio items and their length in ms, in order, for an app (or adapter) that
        reports playout itself (``playout="client"``); None when the response has nothing to hear (no text).
        """
        resp = self._responses.get(response_id)
        if resp is None or not any(resp.text.values()):
            return None
        items = resp.item_order + [item for item in resp.audio_bytes if item not in resp.item_order]
        return [(item, resp.audio_bytes[item] / self._bytes_per_ms) for item in items if resp.audio_bytes.get(item)]

    def flush(self) -> None:
        """Releases reply events still held back for a transcription (e.g. when the session ends), and
        ends the playout of replies whose audio is still counted as playing (heard in full: no truncate
        came)."""
        for resp in self._responses.values():
            if resp.playing is not None:
                resp.playing.cancel()
                self._audio_played(resp)
        self._release()

    async def run_tool(
        self,
        fc: FunctionCall,
        body: Callable[..., Awaitable[Any]],
        *,
        spec: ToolSpec | None = None,
    ) -> ToolOutcome:
        """Runs a completed call under calltape's guarded execution (:meth:`LiveCall.run_tool`)."""
        call = self.call
        if not isinstance(call, LiveCall):
            raise TypeError("guarded execution needs a live calltape call (a LiveCall) as the tap's call")
        self._running[fc.call_id] = fc
        try:
            outcome = await call.run_tool(
                fc.call_id, fc.name, fc.parsed_arguments(), body, reply=fc.response_id, spec=spec
            )
        finally:
            self._running.pop(fc.call_id, None)
        self._results.add(fc.call_id)
        if self.send is not None:
            await self._put_output(fc, outcome.output)
        return outcome

    async def reconcile(self) -> None:
        """Sends the reconciliation items due now (see the module docstring), in order.

        The tap schedules this itself when the user starts speaking; await it before a
        ``response.create`` your application sends while guarded calls may be running."""
        if self.send is None:
            return
        for fc in list(self._running.values()):
            if fc.call_id not in self._live_outputs:
                self._queue_output(fc, self._calltape_output(fc))
        async with self._sending:
            while self._outbox:
                await self.send(self._outbox.pop(0))

    def live_output_item(self, call_id: str) -> str | None:
        """The id of the ``function_call_output`` item the tap put in the live conversation for a call."""
        return self._live_outputs.get(call_id)

    def _calltape_output(self, fc: FunctionCall) -> Any:
        """The call's output as calltape's context shows it now (``{"status": "in_progress"}`` while it runs)."""
        state = self.replies.fold.tool_call(fc.call_id)
        return {"status": "in_progress"} if state is None else state.output

    def _queue_output(self, fc: FunctionCall, output: Any) -> None:
        """Queues the events that make ``output`` the call's one output in the live conversation."""
        old = self._live_outputs.get(fc.call_id)
        if old is not None:
            self._outbox.append({"type": "conversation.item.delete", "item_id": old})
        n = hashlib.sha256(f"{fc.call_id}:{old}".encode()).hexdigest()[:28]
        item_id = f"ct_{n}"
        event: dict[str, Any] = {
            "type": "conversation.item.create",
            "item": {
                "id": item_id,
                "type": "function_call_output",
                "call_id": fc.call_id,
                "output": output_text(output),
            },
        }
        if fc.item_id:
            event["previous_item_id"] = fc.item_id
        self._outbox.append(event)
        self._live_outputs[fc.call_id] = item_id

    async def _put_output(self, fc: FunctionCall, output: Any) -> None:
        self._queue_output(fc, self._calltape_output(fc) if self.replies.fold.tool_call(fc.call_id) else output)
        await self.reconcile()

    def _schedule_reconcile(self) -> None:
        if self.send is None or not self._running:
            return
        if self._drain is None or self._drain.done():
            self._drain = asyncio.get_running_loop().create_task(self.reconcile())

    def output_item(self, fc: FunctionCall | str, output: Any) -> ConversationItemCreateEvent:
        """The ``conversation.item.create`` that hands a tool output back to the model.

        ``output`` may be a ``ToolOutcome`` (its ``output``/``status`` are used) or any JSON value.
        """
        from openai.types.realtime import ConversationItemCreateEvent

        call_id = fc.call_id if isinstance(fc, FunctionCall) else fc
        value = getattr(output, "output", output)
        status = getattr(output, "status", None)
        if value is None and status is not None:
            value = {"status": status}
        text = json_text(value)
        self._results.add(call_id)
        return ConversationItemCreateEvent.model_validate(
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": call_id, "output": text},
            }
        )

    # -- emission with hold-back (the buffer is the reply tracker's) ---------------------------------

    def _out(self, type: str, data: dict[str, Any], *, jump: bool = False) -> None:
        self.replies.emit(type, data, jump=jump)

    def _hold(self) -> None:
        if self._awaiting and self._held_since is None:
            self._held_since = self._clock()
            self.replies.hold()

    def _release(self) -> None:
        self._held_since = None
        self.replies.release()

    def _done(self, resp: _Response) -> bool:
        st = self.replies.state(resp.id)
        return st is not None and st.done

    def _interrupted(self, resp: _Response) -> bool:
        st = self.replies.state(resp.id)
        return st is not None and st.interrupted

    def _release_if_stale(self) -> None:
        if self._held_since is not None and self._clock() - self._held_since >= self.transcript_hold_ms:
            self._awaiting.clear()
            self._release()

    def _transcription_finished(self, item_id: str) -> None:
        self._awaiting.pop(item_id, None)
        if not self._awaiting and self._held_since is not None:
            self._release()

    # -- server events ------------------------------------------------------------------------------

    def _resp(self, response_id: Any) -> _Response:
        rid = str(response_id)
        resp = self._responses.get(rid)
        if resp is None:
            resp = self._responses[rid] = _Response(rid)
            self._hold()
            self.replies.begin(rid)
        return resp

    def _on_server(self, ev: dict[str, Any]) -> list[FunctionCall]:
        kind: str = ev["type"]
        if kind in ("session.created", "session.updated"):
            self._on_session(ev.get("session") or {})
        elif kind == "input_audio_buffer.speech_started":
            self._out("user.speech.started", {"source": "vad"}, jump=True)
            # the server answers this turn on its own: running calls must have their output in by then
            self._schedule_reconcile()
        elif kind == "input_audio_buffer.speech_stopped":
            self._out("user.speech.stopped", {}, jump=True)
        elif kind == "input_audio_buffer.committed":
            if self.input_transcription and ev.get("item_id"):
                self._awaiting[str(ev["item_id"])] = self._clock()
        elif kind == "conversation.item.input_audio_transcription.delta":
            item = str(ev.get("item_id", ""))
            text = self._interim.get(item, "") + str(ev.get("delta") or "")
            self._interim[item] = text
            if text.strip():
                self._out("user.transcript", {"text": text, "final": False}, jump=True)
        elif kind == "conversation.item.input_audio_transcription.completed":
            item = str(ev.get("item_id", ""))
            self._interim.pop(item, None)
            text = str(ev.get("transcript") or "").strip()
            if text:
                self._out("user.transcript", {"text": text, "final": True}, jump=True)
            self._transcription_finished(item)
        elif kind == "conversation.item.input_audio_transcription.failed":
            self._interim.pop(str(ev.get("item_id", "")), None)
            self._transcription_finished(str(ev.get("item_id", "")))
        elif kind == "response.created":
            self._resp((ev.get("response") or {}).get("id"))
            self._schedule_reconcile()  # a turn the VAD start did not announce (e.g. semantic VAD)
        elif kind in ("response.output_item.added", "response.output_item.done"):
            conv_item = ev.get("item") or {}
            if conv_item.get("id") and ev.get("response_id"):
                self._item_response[str(conv_item["id"])] = str(ev["response_id"])
        elif kind in _TEXT_DELTAS:
            self._on_text_delta(ev)
        elif kind in _AUDIO_DELTAS:
            resp = self._resp(ev.get("response_id"))
            item = str(ev.get("item_id", ""))
            self._item_response[item] = resp.id
            resp.audio_bytes[item] = resp.audio_bytes.get(item, 0) + _b64_len(str(ev.get("delta") or ""))
            if resp.audio_started_ms is None:
                resp.audio_started_ms = self._clock()
            if self.playout != "output_audio_buffer":
                self._start_speech(resp)
        elif kind == "response.function_call_arguments.done":
            resp = self._resp(ev.get("response_id"))
            fc = FunctionCall(
                call_id=str(ev["call_id"]),
                name=str(ev["name"]),
                arguments=str(ev.get("arguments") or ""),
                response_id=resp.id,
                item_id=ev.get("item_id"),
            )
            resp.pending_calls[fc.call_id] = fc
        elif kind == "response.done":
            return self._on_response_done(ev.get("response") or {})
        elif kind == "output_audio_buffer.started":
            self._start_speech(self._resp(ev.get("response_id")))
        elif kind == "output_audio_buffer.stopped":
            resp = self._resp(ev.get("response_id"))
            self._start_speech(resp)
            self.replies.speech_ended(resp.id, interrupted=self._interrupted(resp))
        elif kind == "output_audio_buffer.cleared":
            resp = self._resp(ev.get("response_id"))
            self.replies.interrupt(resp.id, cause="user_speech")
            st = self.replies.state(resp.id)
            if st is not None and st.speech_started:
                self.replies.speech_ended(resp.id, interrupted=True)
        elif kind == "conversation.item.truncated":
            self._on_truncate(str(ev.get("item_id", "")), int(ev.get("audio_end_ms", 0)))
        return []

    def _on_session(self, session: Mapping[str, Any]) -> None:
        fmt: Any = None
        audio = session.get("audio")
        if isinstance(audio, Mapping):  # GA
            output = audio.get("output") or {}
            fmt = (output.get("format") or {}).get("type") if isinstance(output, Mapping) else None
            inp = audio.get("input") or {}
            if isinstance(inp, Mapping) and "transcription" in inp:
                self.input_transcription = inp.get("transcription") is not None
        else:  # beta
            fmt = session.get("output_audio_format")
            if "input_audio_transcription" in session:
                self.input_transcription = session.get("input_audio_transcription") is not None
        if isinstance(fmt, str) and fmt in _BYTES_PER_MS:
            self._bytes_per_ms = _BYTES_PER_MS[fmt]

    def _on_text_delta(self, ev: Mapping[str, Any]) -> None:
        resp = self._resp(ev.get("response_id"))
        item = str(ev.get("item_id", ""))
        self._item_response[item] = resp.id
        if item not in resp.text:
            resp.text[item] = ""
            resp.item_order.append(item)
        delta = str(ev.get("delta") or "")
        resp.text[item] += delta
        self.replies.text(resp.id, delta)

    def _start_speech(self, resp: _Response) -> None:
        self.replies.speech_started(resp.id)

    def _on_response_done(self, response: Mapping[str, Any]) -> list[FunctionCall]:
        resp = self._resp(response.get("id"))
        if self._done(resp):
            return []
        status = response.get("status")
        calls = dict(resp.pending_calls)
        for item in response.get("output") or []:  # response.done lists the authoritative items
            if isinstance(item, Mapping) and item.get("type") == "function_call" and item.get("call_id"):
                cid = str(item["call_id"])
                calls[cid] = FunctionCall(
                    cid, str(item.get("name", "")), str(item.get("arguments") or ""), resp.id, item.get("id")
                )
        runnable: list[FunctionCall] = []
        if status == "completed":
            for fc in calls.values():
                if fc.call_id in self._calls:
                    continue
                self._calls[fc.call_id] = fc
                data = {"call": fc.call_id, "name": fc.name, "arguments": fc.arguments or "{}", "reply": resp.id}
                self._out("tool.call", data)
                runnable.append(fc)
        else:
            if status in ("cancelled", "failed") and not self._interrupted(resp):
                reason = (response.get("status_details") or {}).get("reason")
                cause = (
                    "system"
                    if status == "failed"
                    else "user_speech"
                    if reason == "turn_detected"
                    else "api"
                    if resp.cancel_requested or reason == "client_cancelled"
                    else "user_speech"
                )
                self.replies.interrupt(resp.id, cause=cause)
            if calls:
                self._out(
                    "x.realtime.discarded_calls",
                    {
                        "reply": resp.id,
                        "status": status,
                        "calls": [{"call": c.call_id, "name": c.name} for c in calls.values()],
                    },
                )
        self.replies.done(resp.id)
        st = self.replies.state(resp.id)
        if self.playout == "response" and st is not None and not st.interrupted and resp.text:
            if st.speech_started or resp.audio_bytes:
                self._end_playout_with_audio(resp)
        return runnable

    def _end_playout_with_audio(self, resp: _Response) -> None:
        """``playout="response"``: the reply is heard in full when its audio has played, counted from its
        first audio at the audio's length (the server sends audio faster than it plays), unless a truncate
        or a cleared buffer cuts it first. A heard-first effect waits for this, not for ``response.done``."""
        audio_ms = sum(resp.audio_bytes.values()) / self._bytes_per_ms
        left = resp.audio_started_ms + audio_ms - self._clock() if resp.audio_started_ms is not None else 0.0
        if left > 0:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # fed outside an event loop: nothing can wait for it either
                loop = None
            if loop is not None:
                resp.playing = loop.call_later(left / 1000, self._audio_played, resp)
                return
        self._audio_played(resp)

    def _audio_played(self, resp: _Response) -> None:
        resp.playing = None
        st = self.replies.state(resp.id)
        if st is not None and not st.interrupted and not st.speech_ended:
            self.replies.speech_ended(resp.id)

    # -- truncation: the authority on what was heard ---------------------------------------------

    def _on_truncate(self, item_id: str, audio_end_ms: int) -> None:
        key = (item_id, audio_end_ms)
        rid = self._item_response.get(item_id)
        if key in self._truncations or rid is None:
            return
        self._truncations.add(key)
        resp = self._responses[rid]
        if resp.playing is not None:  # cut before its audio was counted as played
            resp.playing.cancel()
            resp.playing = None
        heard_parts: list[str] = []
        for item in resp.item_order:
            text = resp.text.get(item, "")
            if item == item_id:
                nbytes = resp.audio_bytes.get(item)
                audio_ms = nbytes / self._bytes_per_ms if nbytes else None
                heard_parts.append(heard_text(text, audio_end_ms, audio_ms))
                break
            heard_parts.append(text)
        heard = " ".join(p.strip() for p in heard_parts if p.strip())
        self.replies.interrupt(resp.id, cause="user_speech", heard=heard)
        # always also close playout with the heard text: it applies even when the reply had already
        # finished (playout "response" assumed it heard in full at response.done)
        self._out("agent.speech.ended", {"reply": resp.id, "interrupted": True, "heard": heard})

    def _on_item_create(self, item: Mapping[str, Any]) -> None:
        kind = item.get("type")
        if kind == "message" and item.get("role") == "user":
            text = " ".join(
                str(c.get("text") or "")
                for c in item.get("content") or []
                if isinstance(c, Mapping) and c.get("type") == "input_text"
            ).strip()
            if text:
                self._out("user.text", {"text": text}, jump=True)
        elif kind == "function_call_output":
            cid = str(item.get("call_id", ""))
            if cid and cid not in self._results:
                # The app ran the tool without run_tool: record its output so the log stays complete.
                self._results.add(cid)
                raw = item.get("output")
                try:
                    output = orjson.loads(raw) if isinstance(raw, str) else raw
                except orjson.JSONDecodeError:
                    output = raw
                self._out("tool.result", {"call": cid, "output": output})


# ---------------------------------------------------------------------------------------------
# Seeding a new Realtime session from a calltape context.


def seed_events(context: Mapping[str, Any]) -> list[ConversationItemCreateEvent]:
    """The ``conversation.item.create`` events that restore a native calltape context (``call.context()``,
    a resume plan's context) into a new Realtime session, as the SDK's typed client events.

    The items are calltape's ``realtime`` format (one implementation, in ``calltape.projections``):
    assistant turns become ``output_text`` (the API cannot recreate assistant audio); handoffs and pending
    interim text are left out. Send the system prompt with ``session.update`` instructions.
    """
    from openai.types.realtime import ConversationItemCreateEvent

    return [ConversationItemCreateEvent.model_validate(e) for e in to_realtime(dict(context))]


def instructions_of(context: Mapping[str, Any]) -> str | None:
    """The system prompt of a native context, for ``session.update``."""
    for it in context.get("items", []):
        if it.get("type") == "message" and it.get("role") == "system":
            content = it.get("content")
            return content if isinstance(content, str) else None
    return None


# ---------------------------------------------------------------------------------------------
# Inworld: same events, another endpoint.

INWORLD_REALTIME_URL = "wss://api.inworld.ai/api/v1/realtime/session"


@dataclass(frozen=True, slots=True)
class InworldEndpoint:
    """Connection settings for Inworld's Realtime API (OpenAI-compatible events).

    ``api_key`` is the Base64 key from the Inworld portal (sent as HTTP Basic); ``session_key`` names the
    session (the ``key`` query parameter). Connect with any WebSocket client and feed the same tap.
    """

    api_key: str
    session_key: str
    base_url: str = INWORLD_REALTIME_URL

    @property
    def url(self) -> str:
        """The WebSocket URL of the Inworld realtime session (key and protocol in the query)."""
        from urllib.parse import urlencode

        return f"{self.base_url}?{urlencode({'key': self.session_key, 'protocol': 'realtime'})}"

    @property
    def headers(self) -> dict[str, str]:
        """The ``Authorization: Basic`` header Inworld expects (a raw ``id:secret`` is encoded)."""
        key = self.api_key
        try:  # the portal key is already Base64; encode a raw "id:secret" pair if given one
            base64.b64decode(key, validate=True)
        except (binascii.Error, ValueError):
            key = base64.b64encode(key.encode()).decode()
        return {"Authorization": f"Basic {key}"}
