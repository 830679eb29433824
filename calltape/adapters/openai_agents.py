"""OpenAI Agents SDK realtime adapter (``pip install 'calltape[openai-agents]'``).

Attach in one call: ``tap = await attach(session, ct, "call-1")`` on the ``RealtimeSession`` that
``RealtimeRunner.run()`` returned, before entering it (``ct = calltape.connect(url)``).

Where the tap looks, and why:

* **The model listener** (``session.model.add_listener``), put ahead of the session's own listener so
  every fact is in the call before the session acts on it (a tool body runs after its call is known).
  The OpenAI transport forwards every Realtime server event (``raw_server_event``); those go through
  calltape's one Realtime mapping (:class:`calltape.adapters.realtime.RealtimeTap`): VAD edges, input
  transcripts, replies, a function call recorded once its response completed, and the server's
  ``conversation.item.truncated`` (the point where the SDK cut the audio the user heard). A model
  without raw events (the SDK's ``ScriptedRealtimeModel``, a custom transport) is mapped from its
  normalized events into the same server events: ``turn_started``/``turn_ended`` open and complete a
  response, ``audio_interrupted`` becomes a truncation at the playback position (the playback
  tracker's when one is given to :func:`attach`, else the time since the item's first audio: the SDK's
  own "played at once, in real time" assumption).
* **Item updates** carry what no server event of the mapping says: a user's typed message
  (``user.text``) and the output the SDK sent for an unguarded tool (``tool.result``, by call id,
  which the session's ``tool_end`` event lacks).
* **The session's own events**: a handoff (``agent.handoff`` with the new agent's instructions).
"""

from __future__ import annotations

import base64
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from agents.realtime import RealtimeAgent, RealtimeSession
from agents.realtime import model_events as me
from agents.realtime.events import RealtimeHandoffEvent
from agents.realtime.items import InputText, RealtimeToolCallItem, UserMessageItem
from agents.realtime.model import RealtimeModelListener, RealtimePlaybackTracker
from agents.realtime.model_events import RealtimeModelEvent, RealtimeModelToolCallEvent

from calltape.adapters.realtime import RealtimeTap
from calltape.events import now_ms
from calltape.runtime.protocol import CallStarter, EventSink, LiveCall
from calltape.runtime.toolspec import ToolSpec

__all__ = ["SUPPORTED_VERSIONS", "OpenAIAgentsTap", "attach", "tap_of"]

SUPPORTED_VERSIONS = ">=0.24"
"""The openai-agents releases this adapter is tested against (CI: the newest; 0.24.0 is the lowest,
the first with the SDK's ``agents.realtime.testing.ScriptedRealtimeModel``)."""

FRAMEWORK = "openai-agents"

# Sessions the tap is attached to, so restore/renew and guarded tools find it.
_TAPS: weakref.WeakKeyDictionary[RealtimeSession, OpenAIAgentsTap] = weakref.WeakKeyDictionary()


def tap_of(session: RealtimeSession) -> OpenAIAgentsTap | None:
    """The tap attached to ``session``, if any."""
    return _TAPS.get(session)


def _agent_of(session: RealtimeSession) -> RealtimeAgent[Any]:
    # The session keeps its current agent private; the runner's starting agent is the same object.
    agent: RealtimeAgent[Any] = session._current_agent
    return agent


class OpenAIAgentsTap(RealtimeModelListener):  # type: ignore[misc,unused-ignore]  # Any without the SDK
    """Records one ``RealtimeSession`` into a calltape call (see the module docstring).

    ``call``: a :class:`~calltape.runtime.LiveCall` (normally a :class:`calltape.runtime.CallSession`;
    guarded tools, restore and renew need one) or a recording-only :class:`~calltape.runtime.EventSink`.
    """

    def __init__(
        self,
        call: EventSink,
        *,
        playback: RealtimePlaybackTracker | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.call = call
        self.playback = playback
        self._clock = clock
        self.session: RealtimeSession | None = None
        self.realtime = RealtimeTap(call, clock=clock)
        self._raw = False  # the model forwards Realtime server events: they are the source
        self._response: str | None = None  # normalized events: the response being generated
        self._first_audio: dict[str, int] = {}  # normalized events: item -> when its audio began
        self._items: set[str] = set()  # user items recorded (or seeded by a restore)
        self._calls: dict[str, RealtimeModelToolCallEvent] = {}  # every function call the model made
        self._early: dict[str, Any] = {}  # outputs that came before their call was recorded
        self.ended: str | None = None
        """Why the provider ended the session (``end_of_stream``, ``disconnected``, a server error
        code), or None while it is live."""

    @property
    def live(self) -> LiveCall | None:
        """The call as a :class:`~calltape.runtime.LiveCall`, or None for a recording-only sink."""
        return self.call if isinstance(self.call, LiveCall) else None

    # -- binding to a session ---------------------------------------------------------------

    def bind(self, session: RealtimeSession) -> None:
        """Starts listening to ``session``'s model (ahead of the session itself) and to its handoffs."""
        model = session.model
        model.remove_listener(session)  # re-added after the tap: the tap hears each event first
        model.add_listener(self)
        model.add_listener(session)
        self.session = session
        _TAPS[session] = self
        self._watch_session_events(session)

    def _watch_session_events(self, session: RealtimeSession) -> None:
        # The session's events go to a queue its consumer drains; the tap reads the ones it needs
        # (handoffs) as they are put there.
        put = session._put_event
        tap = weakref.ref(self)

        async def put_event(event: Any) -> bool:
            owner = tap()
            if owner is not None and isinstance(event, RealtimeHandoffEvent):
                await owner._on_handoff(event)
            queued: bool = await put(event)
            return queued

        session._put_event = put_event  # type: ignore[method-assign,unused-ignore]

    # -- the model listener -----------------------------------------------------------------

    async def on_event(self, event: RealtimeModelEvent) -> None:
        """One model event (the SDK calls this for every event, before the session's own handling)."""
        if isinstance(event, me.RealtimeModelRawServerEvent):
            data = event.data
            if isinstance(data, Mapping) and isinstance(data.get("type"), str):
                self._raw = True
                self._server(dict(data))
                if data["type"] == "error":
                    self._error(data.get("error"))
            return
        if isinstance(event, me.RealtimeModelItemUpdatedEvent):
            self._on_item(event.item)
            return
        if isinstance(event, me.RealtimeModelToolCallEvent):
            self._calls[event.call_id] = event
        elif isinstance(event, me.RealtimeModelEndOfStreamEvent):
            self._end("end_of_stream")
        elif isinstance(event, me.RealtimeModelConnectionStatusEvent) and event.status == "disconnected":
            self._end("disconnected")
        elif isinstance(event, me.RealtimeModelExceptionEvent) and _connection_lost(event.exception):
            self._end("connection_lost")
        if not self._raw:
            self._normalized(event)

    def _server(self, data: dict[str, Any]) -> None:
        """One Realtime server event through calltape's Realtime mapping."""
        runnable = self.realtime.server_event(data)
        for fc in runnable:
            early = self._early.pop(fc.call_id, _MISSING)
            if early is not _MISSING:
                self.call.emit("tool.result", {"call": fc.call_id, "output": early})

    def _normalized(self, event: RealtimeModelEvent) -> None:
        """A normalized model event, as the Realtime server event it stands for."""
        if isinstance(event, me.RealtimeModelTurnStartedEvent):
            self._response = event.response_id or f"resp_{uuid.uuid4().hex[:16]}"
            self._server({"type": "response.created", "response": {"id": self._response}})
        elif isinstance(event, me.RealtimeModelTranscriptDeltaEvent | me.RealtimeModelOutputTextDeltaEvent):
            self._response = event.response_id or self._ensure_response()
            audio = isinstance(event, me.RealtimeModelTranscriptDeltaEvent)
            kind = "response.output_audio_transcript.delta" if audio else "response.output_text.delta"
            self._server({"type": kind, "response_id": self._response, "item_id": event.item_id, "delta": event.delta})
        elif isinstance(event, me.RealtimeModelAudioEvent):
            self._first_audio.setdefault(event.item_id, self._clock())
            rid = event.response_id or self._ensure_response()
            delta = base64.b64encode(event.data).decode()
            self._server(
                {"type": "response.output_audio.delta", "response_id": rid, "item_id": event.item_id, "delta": delta}
            )
        elif isinstance(event, me.RealtimeModelAudioInterruptedEvent):
            ms = self._played_ms(event.item_id)
            self._server({"type": "conversation.item.truncated", "item_id": event.item_id, "audio_end_ms": ms})
        elif isinstance(event, me.RealtimeModelToolCallEvent):
            self._server(
                {
                    "type": "response.function_call_arguments.done",
                    "response_id": self._ensure_response(),
                    "item_id": event.id,
                    "call_id": event.call_id,
                    "name": event.name,
                    "arguments": event.arguments,
                }
            )
        elif isinstance(event, me.RealtimeModelTurnEndedEvent):
            done = event.response_id or self._response
            if done is not None:
                self._server({"type": "response.done", "response": {"id": done, "status": "completed"}})
            self._response = None
        elif isinstance(event, me.RealtimeModelInputAudioTranscriptionCompletedEvent):
            self._server(
                {
                    "type": "conversation.item.input_audio_transcription.completed",
                    "item_id": event.item_id,
                    "transcript": event.transcript,
                }
            )
        elif isinstance(event, me.RealtimeModelErrorEvent):
            self._error(event.error)

    def _ensure_response(self) -> str:
        if self._response is None:
            self._response = f"resp_{uuid.uuid4().hex[:16]}"
            self._server({"type": "response.created", "response": {"id": self._response}})
        return self._response

    def _played_ms(self, item_id: str) -> int:
        """How much of the item's audio the user heard when it was cut."""
        if self.playback is not None:
            state = self.playback.get_state()
            if state["current_item_id"] == item_id and state["elapsed_ms"] is not None:
                return max(int(state["elapsed_ms"]), 0)
        began = self._first_audio.get(item_id)
        return max(self._clock() - began, 0) if began is not None else 0

    def _on_item(self, item: Any) -> None:
        if isinstance(item, UserMessageItem):
            if item.item_id in self._items:
                return
            self._items.add(item.item_id)
            texts = [c.text for c in item.content if isinstance(c, InputText) and c.text]
            if texts:
                content = [{"type": "input_text", "text": t} for t in texts]
                self.realtime.client_event(
                    {
                        "type": "conversation.item.create",
                        "item": {"type": "message", "role": "user", "content": content},
                    }
                )
        elif isinstance(item, RealtimeToolCallItem) and item.call_id and item.output is not None:
            self._output(item.call_id, _parse(item.output))

    def _output(self, call_id: str, output: Any) -> None:
        """The output the SDK gave the model for a call: recorded unless the log has the call settled."""
        state = self.realtime.replies.fold.tool_call(call_id)
        if state is None:
            self._early[call_id] = output  # the call is recorded once its response completes
        elif state.status == "in_progress":
            self.call.emit("tool.result", {"call": call_id, "output": output})

    def _error(self, error: Any) -> None:
        """A server error: its code and type go to the log (never its message: it may quote content)."""
        fields = error if isinstance(error, Mapping) else getattr(error, "__dict__", {})
        data = {k: str(fields[k]) for k in ("type", "code") if isinstance(fields, Mapping) and fields.get(k)}
        self.call.emit("x.openai_agents.error", data)
        if data.get("code") in SESSION_ENDING_CODES:
            self._end(data["code"])

    def _end(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason
            self.realtime.flush()

    async def _on_handoff(self, event: RealtimeHandoffEvent) -> None:
        to = event.to_agent
        instructions = await to.get_system_prompt(event.info.context)
        live = self.live
        if live is not None:
            await live.handoff(to.name, instructions=instructions)
        else:
            data: dict[str, Any] = {"from": event.from_agent.name, "to": to.name}
            if instructions:
                data["instructions"] = instructions
            self.call.emit("agent.handoff", data)


SESSION_ENDING_CODES = frozenset({"session_expired", "session_timeout"})
"""Server error codes after which the Realtime server closes the session (its duration limit)."""

_MISSING = object()


def _parse(output: str) -> Any:
    try:
        return orjson.loads(output)
    except orjson.JSONDecodeError:
        return output


def _connection_lost(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError | OSError) or type(exc).__name__.startswith("ConnectionClosed")


# ---------------------------------------------------------------------------------------------
# Attaching


async def attach(
    session: RealtimeSession,
    tape: CallStarter | EventSink,
    call_id: str | None = None,
    *,
    tools: Mapping[str, ToolSpec] | None = None,
    playback: RealtimePlaybackTracker | None = None,
) -> OpenAIAgentsTap:
    """Records ``session`` into a call: ``tap = await attach(session, ct, "call-1")``, before entering it.

    ``tape`` is a :func:`calltape.connect` object (a new call ``call_id`` is started with the agent's
    name and instructions) or a call already open (a :class:`~calltape.runtime.LiveCall`, or a
    recording-only :class:`~calltape.runtime.EventSink`). ``tools`` are the call's tool specs.
    ``playback`` is the ``RealtimePlaybackTracker`` given to the session, if any.
    """
    if isinstance(tape, EventSink):
        call: EventSink = tape
    else:
        agent = _agent_of(session)
        call = await tape.start_call(
            call_id or f"openai-agents-{uuid.uuid4().hex[:12]}",
            agent=agent.name,
            instructions=await agent.get_system_prompt(session._context_wrapper),
            modality="voice",
            framework=FRAMEWORK,
            tools=tools,
        )
    tap = OpenAIAgentsTap(call, playback=playback)
    tap.bind(session)
    return tap
