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

Guarded tools (SPEC section 3): :func:`attach` guards every function tool of the session's agent (and
of the agents it hands off to) with :func:`guard`. A guarded call waits until its response completed
(the Realtime API also sends the arguments of a response it then cancels: such a call never runs),
then runs under ``call.run_tool``: ``tool.started`` durable before the body, a call id the log already
answered returns the stored output, the tool's timeout, its interruption policy. When the session
closes, the SDK cancels the tools still running: a guarded one records ``tool.cancelled``, an
unguarded one is settled by the tap (``tool.cancelled``, ``reason: session_closed``, outcome
unknown). When the *provider* ended the session (:attr:`OpenAIAgentsTap.ended`), a guarded body
keeps running instead, and :meth:`OpenAIAgentsTap.renew` delivers its result into the new session.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson
from agents import FunctionTool
from agents.realtime import RealtimeAgent, RealtimeRunner, RealtimeSession
from agents.realtime import model_events as me
from agents.realtime.events import RealtimeHandoffEvent
from agents.realtime.items import InputText, RealtimeToolCallItem, UserMessageItem
from agents.realtime.model import RealtimeModelListener, RealtimePlaybackTracker
from agents.realtime.model_events import RealtimeModelEvent, RealtimeModelToolCallEvent
from agents.realtime.model_inputs import (
    RealtimeModelRawClientMessage,
    RealtimeModelSendRawMessage,
    RealtimeModelSendToolOutput,
)
from agents.tool_context import ToolContext
from pydantic import BaseModel

from calltape.adapters.outcomes import outcome_message
from calltape.adapters.realtime import RealtimeTap, seed_events
from calltape.client import Calltape
from calltape.events import now_ms
from calltape.projections import output_text
from calltape.runtime.effects import guarded_call
from calltape.runtime.protocol import CallStarter, EventSink, LiveCall
from calltape.runtime.resume import cut_replies
from calltape.runtime.toolspec import ToolOutcome, ToolSpec

__all__ = ["REANCHOR", "RENEW_ANCHOR", "SUPPORTED_VERSIONS", "OpenAIAgentsTap", "attach", "guard", "restore", "tap_of"]

SUPPORTED_VERSIONS = ">=0.21.1"
"""The openai-agents releases this adapter is tested against (CI: 0.21.1 and the newest). 0.21.1 is the
first with both the SDK's scripted realtime model (``agents.realtime.testing``, the tests' network) and
the end-of-stream model event (how the tap learns the provider closed the session)."""

REANCHOR = (
    "This conversation was restored after the connection was lost. The items above are what was said, "
    "what the user actually heard of each reply, and the tool results. Continue from there: do not greet "
    "the user again, do not repeat what they already heard, and do not run again a tool whose outcome is "
    "unknown (ask the user instead)."
)
"""The system message that ends a restored conversation (re-anchors the model on where the call is)."""

RENEW_ANCHOR = (
    "The voice session was renewed; the conversation goes on. The items above are what was said, what the "
    "user actually heard of each reply, and the tool results. A tool call still running has its result "
    "delivered when it lands. Continue from there without greeting the user again or repeating yourself."
)
"""The system message that ends a renewed session's seeded conversation."""

FRAMEWORK = "openai-agents"

_TAP_ATTR = "_calltape_tap"
"""Set on the ``RealtimeSession`` a tap records, so restore/renew find it: the session carries its tap."""
_HANDLING: contextvars.ContextVar[OpenAIAgentsTap | None] = contextvars.ContextVar("calltape_openai_tap", default=None)
"""The tap of the session now handling a model event (or an approval): a guarded tool finds its call
through it, since a ``ToolContext`` names no session. The SDK starts a tool's task (or awaits its body)
while the session handles the tool call event, so the task inherits the value; the tap sets it just
before the session's own listener and clears it just after (:class:`_AfterSession`). A value, not a
registry: it lives in the contexts of one run's tasks and goes with them."""


def tap_of(session: RealtimeSession) -> OpenAIAgentsTap | None:
    """The tap attached to ``session``, if any."""
    tap = getattr(session, _TAP_ATTR, None)
    return tap if isinstance(tap, OpenAIAgentsTap) else None


def _agent_of(session: RealtimeSession) -> RealtimeAgent[Any]:
    # The session keeps its current agent private; the runner's starting agent is the same object.
    agent: RealtimeAgent[Any] = session._current_agent
    return agent


class _AfterSession(RealtimeModelListener):  # type: ignore[misc,unused-ignore]  # Any without the SDK
    """The model listener after the session's own: the session is done handling the event, so no tool
    it starts later (from another event of another session in the same task) sees this tap."""

    async def on_event(self, event: RealtimeModelEvent) -> None:
        """Clears the tap handling the event (see ``_HANDLING``)."""
        _HANDLING.set(None)


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
        self.realtime = RealtimeTap(call, clock=clock, playout="client")
        self._raw = False  # the model forwards Realtime server events: they are the source
        self._response: str | None = None  # normalized events: the response being generated
        self._first_audio: dict[str, int] = {}  # normalized events: item -> when its audio began
        self._items: set[str] = set()  # user items recorded (or seeded by a restore)
        self._calls: dict[str, RealtimeModelToolCallEvent] = {}  # every function call the model made
        self._early: dict[str, Any] = {}  # outputs that came before their call was recorded
        self._call_response: dict[str, str] = {}  # call id -> the response that made it
        self._gates: dict[str, asyncio.Future[bool]] = {}  # guarded calls waiting for their response
        self._unrunnable: set[str] = set()  # calls whose response ended without them: never run
        self._running: dict[str, asyncio.Future[ToolOutcome]] = {}  # guarded bodies under way
        self._outlived: dict[str, ToolOutcome] = {}  # results of calls that outlived their session
        self._seeded_outputs: set[str] = set()  # calls whose output the last seed put in
        self._accepting = True  # the bound session takes results (False between a provider end and renew)
        self._tasks: set[asyncio.Task[None]] = set()
        self._playouts: set[asyncio.Task[None]] = set()  # replies whose audio is still playing (no player)
        self._playing: dict[str, tuple[RealtimeTap, str, float]] = {}  # last audio item -> its reply, length
        self._after = _AfterSession()
        if playback is not None:
            self._watch_player(playback)
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
        model.add_listener(self._after)
        self.session = session
        setattr(session, _TAP_ATTR, self)
        self._watch_session_events(session)
        self._watch_close(session)
        self._watch_approvals(session)

    def unbind(self, session: RealtimeSession) -> None:
        """Stops listening to ``session``'s model (a renewal moves the tap to a new session)."""
        session.model.remove_listener(self)
        session.model.remove_listener(self._after)

    def _watch_approvals(self, session: RealtimeSession) -> None:
        # An approved call's tool starts from the approving task, not from the model's listener: the
        # approval runs with this tap as the one handling, so a guarded tool finds it there too.
        approve = getattr(session, "approve_tool_call", None)
        if approve is None:
            return
        tap = weakref.ref(self)

        async def approve_tool_call(call_id: str, *args: Any, **kwargs: Any) -> None:
            token = _HANDLING.set(tap())
            try:
                await approve(call_id, *args, **kwargs)
            finally:
                _HANDLING.reset(token)

        session.approve_tool_call = approve_tool_call  # type: ignore[method-assign,unused-ignore]

    def _watch_close(self, session: RealtimeSession) -> None:
        close = session.close
        tap = weakref.ref(self)

        closed = weakref.ref(session)

        async def closing() -> None:
            await close()
            owner = tap()
            if owner is not None and owner.session is closed():  # not a session renewed since
                owner._closed()

        session.close = closing  # type: ignore[method-assign,unused-ignore]

    def _closed(self) -> None:
        """The session closed: the SDK cancelled the tools it was running. An unguarded one is settled
        here (its outcome is unknown); a guarded one settles itself, or lives on for a renewal."""
        self.realtime.flush()
        for task in list(self._playouts):  # the caller hung up: what was still playing was not heard out
            task.cancel()
        self._playing.clear()
        for state in self.realtime.replies.fold.tool_calls():
            if state.included and state.status == "in_progress" and state.call_id not in self._running:
                data = {"call": state.call_id, "reason": "session_closed", "outcome": "unknown"}
                self.call.emit("tool.cancelled", data)

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
        if isinstance(event, me.RealtimeModelAudioEvent):
            self._first_audio.setdefault(event.item_id, self._clock())
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
            _HANDLING.set(self)  # for the tool the session starts next (cleared by _AfterSession)
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
        kind = data["type"]
        if kind == "response.function_call_arguments.done" and data.get("call_id"):
            self._call_response[str(data["call_id"])] = str(data.get("response_id"))
        runnable = self.realtime.server_event(data)
        for fc in runnable:
            early = self._early.pop(fc.call_id, _MISSING)
            if early is not _MISSING:
                self.call.emit("tool.result", {"call": fc.call_id, "output": early})
            self._open_gate(fc.call_id, True)
        if kind == "response.done":  # its calls that did not become runnable never will
            rid = str((data.get("response") or {}).get("id"))
            self._watch_playout(rid)
            for call_id, response in list(self._call_response.items()):
                if response == rid:
                    del self._call_response[call_id]
                    recorded = self.realtime.replies.fold.tool_call(call_id) is not None
                    if not recorded:  # a guarded call that starts later (an approval) need not wait
                        self._unrunnable.add(call_id)
                    self._open_gate(call_id, recorded)

    # -- playout: when the caller heard a reply out ---------------------------------------------

    def _watch_playout(self, rid: str) -> None:
        """Reports the reply heard once its audio has played out (not when the model finished it): the
        SDK says when audio was cut, never when it ended, and a heard-first effect waits for this."""
        realtime = self.realtime
        items = realtime.playout_items(rid)
        if items is None:
            return
        if not items:  # nothing to play (text only): heard as it completes
            self._played(realtime, rid)
        elif self.playback is not None:  # the app's player says: checked at each position it reports
            item, length = items[-1]
            self._playing[item] = (realtime, rid, length)
            self._on_played()
        else:  # the SDK's own assumption: played at once, in real time
            item, length = items[-1]
            end = self._first_audio.get(item, self._clock()) + length
            task = asyncio.get_running_loop().create_task(self._play_for(realtime, rid, end))
            self._playouts.add(task)
            task.add_done_callback(self._playouts.discard)

    async def _play_for(self, realtime: RealtimeTap, rid: str, end: float) -> None:
        await asyncio.sleep(max(end - self._clock(), 0) / 1000)
        self._played(realtime, rid)

    def _played(self, realtime: RealtimeTap, rid: str) -> None:
        state = realtime.replies.state(rid)
        if state is not None and not state.interrupted:
            realtime.playout_finished(rid)

    def _watch_player(self, playback: RealtimePlaybackTracker) -> None:
        """Hears each position the app's player reports (``on_play_bytes`` goes through ``on_play_ms``)."""
        report = playback.on_play_ms
        tap = weakref.ref(self)

        def on_play_ms(item_id: str, item_content_index: int, ms: float) -> None:
            report(item_id, item_content_index, ms)
            owner = tap()
            if owner is not None:
                owner._on_played()

        playback.on_play_ms = on_play_ms  # type: ignore[method-assign,unused-ignore]

    def _on_played(self) -> None:
        for item, (realtime, rid, length) in list(self._playing.items()):
            if self._played_out(item, length):
                del self._playing[item]
                self._played(realtime, rid)

    def _played_out(self, item: str, length: float) -> bool:
        """Whether the app's player has played ``item`` to its end, or moved on to later audio."""
        assert self.playback is not None
        state = self.playback.get_state()
        current, elapsed = state["current_item_id"], state["elapsed_ms"]
        if current == item:
            return elapsed is not None and elapsed >= length - 1
        order = list(self._first_audio)
        return current in self._first_audio and item in self._first_audio and order.index(current) > order.index(item)

    def _open_gate(self, call_id: str, runnable: bool) -> None:
        gate = self._gates.pop(call_id, None)
        if gate is not None and not gate.done():
            gate.set_result(runnable)

    # -- guarded tools -------------------------------------------------------------------------

    async def run_guarded(
        self, call_id: str, name: str, arguments: str, body: Callable[[], Any], spec: ToolSpec | None = None
    ) -> Any:
        """Runs one function call of the session under ``call.run_tool`` (see the module docstring).

        Returns what the SDK sends the model: the tool's output, or a sentence saying why there is none."""
        live = self.live
        if live is None:
            raise RuntimeError("guarded tools need a live calltape call (a CallSession) as the tap's call")
        spec = spec or live.tools.get(name) or ToolSpec()
        if not await self._runnable(call_id, spec):
            return NOT_RUN
        state = live.call_state(call_id)

        async def run() -> Any:
            output = await body()
            guarded = guarded_call()
            if guarded is not None and guarded.refused:
                # the SDK turned calltape.effect()'s refusal into an error text: the runner settles the
                # call instead (not_run after a barge-in, unknown for an effect it must not run again)
                raise guarded.refused[-1]
            return _jsonable(output)

        inner = asyncio.ensure_future(
            live.run_tool(
                call_id, name, _parse(arguments or "{}"), run, reply=state.reply if state else None, spec=spec
            )
        )
        self._running[call_id] = inner
        inner.add_done_callback(lambda _: self._running.pop(call_id, None))
        try:
            outcome = await asyncio.shield(inner)
        except asyncio.CancelledError:
            if self.ended is None:
                inner.cancel()  # the session closed: the runner records tool.cancelled
            else:  # the provider ended the session: the body goes on, renew() hands its result over
                inner.add_done_callback(functools.partial(self._landed, call_id))
            raise
        return outcome.output if outcome.status == "completed" else outcome_message(outcome)

    async def _runnable(self, call_id: str, spec: ToolSpec) -> bool:
        """Waits until the call's response completed (True) or ended otherwise (False)."""
        if self.realtime.replies.fold.tool_call(call_id) is not None:
            return True
        if call_id in self._unrunnable:
            return False
        gate = self._gates.get(call_id)
        if gate is None:
            gate = self._gates[call_id] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(spec.timeout):
                return await asyncio.shield(gate)
        except TimeoutError:
            self._gates.pop(call_id, None)
            return False

    # -- seeding a session from the log ---------------------------------------------------------

    async def seed(self, context: Mapping[str, Any], *, reanchor: str | None = None) -> None:
        """Puts a native calltape context into the session's conversation, before its first response.

        Each item becomes a ``conversation.item.create`` (calltape's ``realtime`` format: what the user
        heard of each reply, every included call with its one output) with a stable id, so the server's
        echo of a seeded user message is not recorded again. Outputs still ``in_progress`` are left out:
        the tool's result goes in when it lands. ``reanchor`` ends the seed as a system message."""
        session = self.session
        if session is None:
            raise RuntimeError("the tap is not bound to a session")
        items = [
            i
            for i in context.get("items", [])
            if not (i.get("type") == "function_call_output" and i.get("status") == "in_progress")
        ]
        self._seeded_outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
        created = [e.item.model_dump(mode="json", exclude_none=True) for e in seed_events({**context, "items": items})]
        if reanchor:
            created.append({"type": "message", "role": "system", "content": [{"type": "input_text", "text": reanchor}]})
        anchor = f"{context.get('session')}:{context.get('seq')}"
        for n, item in enumerate(created):
            item["id"] = "ct_" + hashlib.sha256(f"{anchor}:{n}".encode()).hexdigest()[:24]  # at most 32 chars
            if item.get("role") == "user":
                self._items.add(item["id"])
            message: RealtimeModelRawClientMessage = {"type": "conversation.item.create", "other_data": {"item": item}}
            await session.model.send_event(RealtimeModelSendRawMessage(message=message))

    def _landed(self, call_id: str, task: asyncio.Future[ToolOutcome]) -> None:
        """A guarded call outlived the session the provider ended: its result goes to the next one."""
        if task.cancelled() or task.exception() is not None:
            return  # the runner recorded how it ended
        self._outlived[call_id] = task.result()
        if self._accepting:
            self._spawn(self._deliver())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self) -> None:
        """Hands the results of calls that outlived their session to the session now bound."""
        session = self.session
        for call_id in list(self._outlived):
            outcome = self._outlived.pop(call_id)
            fc = self._calls.get(call_id)
            if session is None or fc is None or call_id in self._seeded_outputs:
                continue  # its output was seeded already (it landed before the renewal)
            text = output_text(outcome.output) if outcome.status == "completed" else outcome_message(outcome)
            await session.model.send_event(RealtimeModelSendToolOutput(tool_call=fc, output=text, start_response=True))

    # -- renewing a session the provider ended -------------------------------------------------

    async def renew(
        self,
        runner: RealtimeRunner,
        *,
        context: Any = None,
        model_config: Any = None,
        reanchor: str | None = RENEW_ANCHOR,
    ) -> RealtimeSession:
        """Continues the call in a new session of ``runner`` (entered; returned) once the provider ended
        the current one (:attr:`ended`: its session limit, a server error, a lost connection), or now.

        The same calltape call goes on (same writer, same epoch): the replies the end cut are settled
        (what was heard is kept), the new conversation is seeded from the log (:meth:`seed`), and the
        result of a guarded call still running when the old session ended is delivered into it when it
        lands (``function_call_output`` and a new response). ``x.openai_agents.renewed`` marks the place
        in the log."""
        live = self.live
        if live is None:
            raise RuntimeError("renewing needs a live calltape call (a CallSession) as the tap's call")
        reason = self.ended or "requested"
        self.ended = reason  # closing the old session must not cancel the guarded calls still running
        self._accepting = False
        old = self.session
        if old is not None:
            await old.close()
            self.unbind(old)
        self.realtime.flush()
        for event_type, data in cut_replies(live.fold):
            live.emit(event_type, data)
        live.emit("x.openai_agents.renewed", {"reason": reason})
        for call_id in list(self._gates):  # calls of responses that never completed: never run
            self._open_gate(call_id, False)
        session = await runner.run(context=context, model_config=model_config)
        self.realtime = RealtimeTap(self.call, clock=self._clock, playout="client")
        self._raw, self._response = False, None
        self._first_audio.clear()
        self._call_response.clear()
        self.ended = None
        self.bind(session)
        _guard_agent(_agent_of(session), set())
        await session.enter()
        await self.seed(live.context(), reanchor=reanchor)
        self._accepting = True
        await self._deliver()
        return session

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


NOT_RUN = "this tool call was not run: the response that made it did not complete"
"""What the model is told for a guarded call of a response that was cancelled (or never completed)."""


def _jsonable(value: Any) -> Any:
    """A tool's return value as JSON values (it goes into the log), as the SDK serializes it."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    try:
        orjson.dumps(value)
    except TypeError:
        return str(value)
    return value


def guard(tool: FunctionTool, *, spec: ToolSpec | None = None) -> FunctionTool:
    """Guards a function tool (in place; returns it): in a session with a tap, its calls run under
    ``call.run_tool``; in a session without one, it runs as before.

    ``spec`` overrides the call's ``tools={name: ToolSpec}`` entry (else the defaults: 10 s, ``finish``)."""
    invoke = tool.on_invoke_tool
    if getattr(invoke, "__calltape_guarded__", False):
        return tool

    async def guarded(ctx: ToolContext[Any], arguments: str) -> Any:
        tap = _HANDLING.get()
        if tap is None or tap.live is None or ctx.tool_call_id not in tap._calls:
            return await invoke(ctx, arguments)
        return await tap.run_guarded(ctx.tool_call_id, ctx.tool_name, arguments, lambda: invoke(ctx, arguments), spec)

    guarded.__calltape_guarded__ = True  # type: ignore[attr-defined]
    tool.on_invoke_tool = guarded
    return tool


def _guard_agent(agent: RealtimeAgent[Any], seen: set[int]) -> None:
    """Guards the function tools of ``agent`` and of the agents it hands off to directly."""
    if id(agent) in seen:
        return
    seen.add(id(agent))
    for tool in agent.tools:
        if isinstance(tool, FunctionTool):
            guard(tool)
    for handoff in agent.handoffs:
        if isinstance(handoff, RealtimeAgent):
            _guard_agent(handoff, seen)


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
    ``playback`` is the ``RealtimePlaybackTracker`` given to the session, if any. The function tools of
    the session's agent (and of the agents it hands off to) are guarded (:func:`guard`).
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
    _guard_agent(_agent_of(session), set())
    return tap


@contextlib.asynccontextmanager
async def restore(
    runner: RealtimeRunner,
    tape: Calltape,
    call_id: str,
    *,
    agent: str | None = None,
    tools: Mapping[str, ToolSpec] | None = None,
    context: Any = None,
    model_config: Any = None,
    playback: RealtimePlaybackTracker | None = None,
    reanchor: str | None = REANCHOR,
) -> AsyncIterator[RealtimeSession]:
    """A dropped call, restored into a new session: ``async with restore(runner, ct, "call-1") as session``.

    Resumes the call in the log (:meth:`calltape.Calltape.resume_call`: what the drop left open is
    settled, the old writer fenced) on ``agent`` (default: the runner's agent), opens a session from
    ``runner`` (``context`` and ``model_config`` go to ``runner.run``), attaches the tap, and seeds the
    session's conversation with the call's context before anything else is sent (:meth:`OpenAIAgentsTap.seed`):
    the turns, the heard text of interrupted replies, the settled tool outputs, then ``reanchor``.
    The session is closed when the block exits.
    """
    session = await runner.run(context=context, model_config=model_config)
    resumed = await tape.resume_call(call_id, agent=agent or _agent_of(session).name, tools=tools)
    tap = OpenAIAgentsTap(resumed.call, playback=playback)
    tap.bind(session)
    _guard_agent(_agent_of(session), set())
    await session.enter()
    try:
        await tap.seed(resumed.call.context(), reanchor=reanchor)
        yield session
    finally:
        await session.close()
