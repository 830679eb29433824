"""The tap: one ``AgentSession``'s public events mapped to calltape events.

Mapping notes (why the tap looks where it looks):

* One calltape ``reply`` is one LLM generation: a ``SpeechHandle`` step, named
  ``"{speech_id}_{step}"`` like LiveKit's own generation ids. A turn with tools has two steps.
* Emit order is not context order. The assistant ``ChatMessage`` reaches ``conversation_item_added``
  only after its playout, after its tools started and after a barge-in's transcript; so the reply is
  opened (``agent.reply.started``) at the first earlier sign of it: the agent starting to speak it or
  one of its tools starting.
* Reply state (done, speaking, interrupted, what was heard) is never kept here: the
  :class:`~calltape.adapters.replies.ReplyTracker` reads it from the call's fold and writes each fact once.
* Function calls never come through ``conversation_item_added``: ``tool_execution_updated`` gives the
  start (before the body runs), each ``ctx.update()`` (recorded as ``tool.progress``) and the end of
  each call; ``function_tools_executed`` carries the output LiveKit puts into its own context for the
  call (a handoff cut by a barge-in becomes an error there), and the calls that failed before
  reaching the executor (unknown tool, bad arguments).
* A call that reported progress (``ctx.update()``, or LiveKit releasing it at its interruption cap)
  answers the LLM twice in LiveKit's context: the update under the call id, the real result under a
  second call LiveKit adds later. calltape keeps one call with one output: the update is
  ``tool.progress``, the later real result is the ``tool.result``.
* A guarded call of an interrupted turn: LiveKit 1.6/1.7 keep neither the call nor its output, so
  once it lands the tap inserts both into the agent's live context (:meth:`LiveKitTap.land`).
  An unguarded call of an interrupted turn that had ended is dropped the same way there (and a
  handoff it returned does not happen): the tap records the output 1.8 keeps for it (the tool's
  return; for a handoff, an error saying it did not happen) and inserts the call and that output
  into the live context (:meth:`LiveKitTap._settle_dropped`).
* User turns are the ones LiveKit commits to its context (``conversation_item_added`` with a user
  message), recorded with LiveKit's text; STT results before that are only the pending interim.
  Speech LiveKit discards (over a reply that cannot be interrupted) never becomes a calltape user
  turn, and a transcript LiveKit splits over two turns (a slow ``on_user_turn_completed`` while the
  user keeps talking) is recorded once.
* The assistant message carries ``interrupted`` and, when interrupted, the synchronized transcript:
  what the user heard. That is recorded as ``agent.speech.ended.heard``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from livekit.agents import Agent, AgentSession, llm
from livekit.agents.voice import SpeechHandle
from livekit.agents.voice.events import (
    AgentStateChangedEvent,
    CloseEvent,
    ConversationItemAddedEvent,
    FunctionToolsExecutedEvent,
    SpeechCreatedEvent,
    ToolCallEnded,
    ToolCallStarted,
    ToolCallUpdated,
    ToolExecutionUpdatedEvent,
    UserInputTranscribedEvent,
    UserStateChangedEvent,
)

from calltape.adapters.livekit.context import instructions_of
from calltape.adapters.replies import ReplyTracker
from calltape.runtime.protocol import EventSink, LiveCall

log = logging.getLogger("calltape.adapters.livekit")

__all__ = ["CallSink", "LiveKitTap", "attach", "tap_of"]


CallSink = EventSink
"""The old name of what the tap records into: an :class:`~calltape.runtime.EventSink` (recording
only) or a :class:`~calltape.runtime.LiveCall` (barge-in, end and guarded tools too)."""


_TAP_ATTR = "_calltape_tap"
"""Set on the ``AgentSession`` a tap records, so guarded tools find their call from the RunContext
alone: the session carries its tap (no registry outside it maps sessions to taps)."""

_DROP_REASONS = frozenset({"error", "participant_disconnected", "job_shutdown"})
HANDOFF_INTERRUPTED = "the agent handoff was interrupted and did not happen"
"""The output calltape records for a handoff tool whose turn was interrupted (the handoff never happens)."""


@dataclass(slots=True)
class _Speech:
    """A LiveKit speech and the calltape reply of its current step (state lives in the fold)."""

    handle: SpeechHandle
    step: int = 0
    reply: str | None = None


class LiveKitTap:
    """Maps one ``AgentSession``'s events to calltape events. Create it with :func:`attach`."""

    def __init__(self, session: AgentSession[Any], call: EventSink) -> None:
        self.session = session
        self.call = call
        self.live: LiveCall | None = call if isinstance(call, LiveCall) else None
        """The call as a :class:`~calltape.runtime.LiveCall`, or None when it only records."""
        self.start_result: Any = None
        """What ``session.start`` returned when :func:`~calltape.adapters.livekit.start` started the
        session: the ``RunResult`` of ``capture_run=True``, else None."""
        self.replies = ReplyTracker(call)
        self._speeches: dict[str, _Speech] = {}
        self._last: _Speech | None = None
        self._cut: list[_Speech] = []
        """Interrupted speeches whose message (what was heard) LiveKit has not delivered yet."""
        self._guarded_calls: set[str] = set()
        self._put: set[str] = set()
        """Calls the tap inserted into the live context itself (each once)."""
        self._unguarded: dict[str, llm.FunctionCall] = {}
        """Unguarded calls that started, until they settle."""
        self._deferred: set[str] = set()
        """Calls that reported progress: their real result comes with their end, not before."""
        self._ended: dict[str, ToolCallEnded] = {}
        """Calls that ended before LiveKit reported the output it keeps for them."""
        self._user_finals: list[str] = []
        """Final transcripts of the user turn LiveKit has not committed yet."""
        self._interim = ""
        """The pending user text last recorded (an interim ``user.transcript``)."""
        self._heard_user = False
        """STT gave something since the agent's last reply began: a committed turn is spoken."""
        self._user_speaking = False
        self._user_spoke = False
        """The user's VAD said speech started since the agent's last reply began."""
        self._agent: str | None = None
        self._speaking: str | None = None
        """The reply whose speech the agent state last reported playing."""
        self._tasks: set[asyncio.Future[Any]] = set()
        self._calls: set[asyncio.Future[Any]] = set()
        """Guarded tool calls under way: the user's tools, which :meth:`detach` must not cancel."""
        self._handlers: list[tuple[str, Callable[[Any], None]]] = [
            ("user_input_transcribed", self._on_transcribed),
            ("user_state_changed", self._on_user_state),
            ("agent_state_changed", self._on_agent_state),
            ("speech_created", self._on_speech_created),
            ("conversation_item_added", self._on_item_added),
            ("tool_execution_updated", self._on_tool_update),
            ("function_tools_executed", self._on_tools_executed),
            ("close", self._on_close),
        ]
        self._handlers = [(name, _contained(name, handler)) for name, handler in self._handlers]
        for name, handler in self._handlers:
            session.on(name, handler)  # type: ignore[arg-type]
        setattr(session, _TAP_ATTR, self)

    # -- public ---------------------------------------------------------------------------------

    def detach(self) -> None:
        """Stops recording (the call itself stays open)."""
        for name, handler in self._handlers:
            self.session.off(name, handler)  # type: ignore[arg-type]
        for task in self._tasks:
            task.cancel()
        if tap_of(self.session) is self:
            setattr(self.session, _TAP_ATTR, None)

    async def drain(self) -> None:
        """Waits for the tap's background work (speech watchers, the close of the call)."""
        while pending := [t for t in (*self._tasks, *self._calls) if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    def interruption_cause(self) -> str:
        """The ``cause`` of an interruption happening now, from what calltape itself observed.

        ``user_speech`` when the user is speaking or started to (VAD) or was transcribed since the
        agent's reply began, else ``api`` (the app interrupted). LiveKit's own interruption source is
        private, so it is not read."""
        return "user_speech" if self._user_speaking or self._user_spoke or self._heard_user else "api"

    def reply_of(self, call_id: str) -> str | None:
        """The calltape reply a function call belongs to (None before the tap saw the call)."""
        state = self.replies.fold.tool_call(call_id)
        return state.reply if state is not None else None

    def reply_of_handle(self, handle: SpeechHandle) -> str | None:
        """The calltape reply of a speech's current step (None when nothing of it was recorded)."""
        sp = self._speeches.get(handle.id)
        return sp.reply if sp is not None else None

    # -- emit helpers ---------------------------------------------------------------------------

    def _emit(self, type_: str, data: dict[str, Any]) -> None:
        self.replies.emit(type_, data)

    def _spawn(self, aw: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(aw)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _speech(self, handle: SpeechHandle | None) -> _Speech | None:
        if handle is None:
            return None
        sp = self._speeches.get(handle.id)
        if sp is None:
            # a handle created before attach, or by a path that emits no speech_created
            sp = self._track(handle)
        return sp

    def _open_step(self, sp: _Speech) -> str:
        """Opens the reply of the handle's current step (closing the previous step's)."""
        step = sp.handle.num_steps
        if sp.reply is not None and sp.step == step:
            return sp.reply
        self._close_reply(sp)
        sp.step, sp.reply = step, f"{sp.handle.id}_{step}"
        self._last = sp
        self._heard_user = self._user_spoke = False
        self._emit("agent.reply.started", {"reply": sp.reply, "speech_id": sp.handle.id, "step": step})
        return sp.reply

    def _close_reply(self, sp: _Speech) -> None:
        if sp.reply is None:
            return
        self.replies.done(sp.reply)
        st = self.replies.state(sp.reply)
        if st is not None and st.speech_started:
            self.replies.speech_ended(sp.reply, interrupted=st.interrupted)

    # -- speeches -------------------------------------------------------------------------------

    def _track(self, handle: SpeechHandle) -> _Speech:
        sp = _Speech(handle)
        self._speeches[handle.id] = sp
        self._spawn(self._watch(sp))
        return sp

    async def _watch(self, sp: _Speech) -> None:
        """Records the interruption the moment it happens, then closes the reply when the speech ends.

        ``wait_if_not_interrupted`` is the public way to learn about an interruption without waiting
        for the speech to be done (which, with a tool still running, takes up to 5 s).
        """
        handle = sp.handle
        done = _speech_done(handle)
        await handle.wait_if_not_interrupted([done])
        if handle.interrupted:
            self._on_interrupted(sp)
        await done
        if handle.interrupted:
            self._settle_dropped(handle)
        self._close_reply(sp)
        self._speeches.pop(handle.id, None)
        if sp in self._cut:
            self._cut.remove(sp)  # cut before its first words: no message will come

    def _on_interrupted(self, sp: _Speech) -> None:
        if sp.reply is None:
            return  # nothing of it reached calltape: a queued speech is cancelled, not interrupted
        st = self.replies.state(sp.reply)
        if st is None or st.interrupted:
            return
        self._cut.append(sp)
        cause = self.interruption_cause()
        if self.live is not None and not self.replies.holding:
            self.live.interrupt(reply=sp.reply, cause=cause)
        else:
            self.replies.interrupt(sp.reply, cause=cause)

    def _on_speech_created(self, ev: SpeechCreatedEvent) -> None:
        if ev.speech_handle.id not in self._speeches:
            self._track(ev.speech_handle)

    def _on_agent_state(self, ev: AgentStateChangedEvent) -> None:
        if ev.old_state == "speaking" and ev.new_state != "speaking":
            self._end_interrupted_speech()
        if ev.new_state == "listening" and ev.old_state == "speaking" and not self._user_speaking:
            if self._user_finals:
                # the user spoke while the agent did and LiveKit took no turn of it
                self._drop_pending_user()
            return
        if ev.new_state != "speaking":
            return
        sp = self._speech(self.session.current_speech)
        if sp is None:
            return
        self._speaking = self._open_step(sp)
        self.replies.speech_started(self._speaking)

    def _end_interrupted_speech(self) -> None:
        """The agent stopped speaking: an interrupted reply's speech ends here, when its audio stopped.

        LiveKit adds an interrupted reply's message (which carries what was heard, and ends the speech
        in :meth:`_on_assistant_message`) only when some of its text was forwarded; cut before its first
        words, the speech would otherwise end only when the speech handle is done, after the reply's
        tools (up to LiveKit's 5 s interruption timeout)."""
        reply, self._speaking = self._speaking, None
        st = self.replies.state(reply) if reply is not None else None
        if reply is not None and st is not None and st.interrupted and st.speech_started:
            self.replies.speech_ended(reply, interrupted=True)

    def _owner_of(self, call_id: str) -> _Speech | None:
        for sp in self._speeches.values():
            if any(getattr(item, "call_id", None) == call_id for item in sp.handle.chat_items):
                return sp
        return self._speech(self.session.current_speech)

    # -- user -----------------------------------------------------------------------------------

    def _on_transcribed(self, ev: UserInputTranscribedEvent) -> None:
        """STT results are what the user is saying, not yet a turn: recorded as the pending interim
        (finals so far plus the latest interim). The turn is recorded when LiveKit commits it."""
        text = ev.transcript.strip()
        self._heard_user = self._heard_user or bool(text)
        if ev.is_final:
            if text:
                self._user_finals.append(text)
            pending = " ".join(self._user_finals)
        else:
            pending = " ".join([*self._user_finals, text]) if text else ""
        if pending or self._interim:
            self._set_interim(pending)

    def _set_interim(self, text: str) -> None:
        if text != self._interim:
            self._interim = text
            self._emit("user.transcript", {"text": text, "final": False})

    def _drop_pending_user(self) -> None:
        """LiveKit did not take what the user said as a turn (speech over a reply that cannot be
        interrupted, scheduling paused): it was never a turn, so it stops being pending."""
        self._user_finals = []
        self._set_interim("")

    def _on_user_state(self, ev: UserStateChangedEvent) -> None:
        if ev.new_state == "speaking" and not self._user_speaking:
            self._user_speaking = self._user_spoke = True
            self._emit("user.speech.started", {"source": "vad"})
        elif ev.new_state != "speaking" and self._user_speaking:
            self._user_speaking = False
            self._emit("user.speech.stopped", {})

    # -- conversation items ---------------------------------------------------------------------

    def _on_item_added(self, ev: ConversationItemAddedEvent) -> None:
        item = ev.item
        if isinstance(item, llm.ChatMessage):
            if item.role == "user":
                self._on_user_message(item)
            elif item.role == "assistant":
                self._on_assistant_message(item)
        elif isinstance(item, llm.AgentHandoff):
            self._on_handoff(item)

    def _on_user_message(self, msg: llm.ChatMessage) -> None:
        """A user turn LiveKit committed to its context: recorded once, as LiveKit keeps it.

        A spoken turn is the final transcript (LiveKit's text: what it joined, what
        ``on_user_turn_completed`` left), a typed or injected one ``user.text``."""
        text = (msg.text_content or "").strip()
        spoken = self._heard_user
        self._user_finals, self._interim = [], ""
        if spoken:
            self._emit("user.transcript", {"text": text, "final": True})
        elif text:
            self._emit("user.text", {"text": text})

    def _on_assistant_message(self, msg: llm.ChatMessage) -> None:
        """The reply's message, added after its playout: its text, and for an interrupted reply what
        was heard.

        An interrupted reply's message comes after LiveKit has stopped its audio and, when typed
        input or a realtime model interrupted it, after the next user turn and the next speech
        began: it belongs to the oldest interrupted speech still waiting for it, not to the
        current one; and its speech may have been ended already (when the agent stopped speaking),
        so what was heard is then recorded as the speech's last progress."""
        sp = self._cut.pop(0) if msg.interrupted and self._cut else None
        sp = sp or self._speech(self.session.current_speech) or self._last
        if sp is None:
            return
        if sp in self._cut:
            self._cut.remove(sp)
        reply = self._open_step(sp) if sp.reply is None or not msg.interrupted else sp.reply
        text = msg.text_content or ""
        if text:
            self.replies.text(reply, text)
            self.replies.speech_started(reply)
        self.replies.done(reply)
        st = self.replies.state(reply)
        if st is not None and (st.speech_started or (text and st.interrupted)):
            ended = self.replies.speech_ended(reply, interrupted=msg.interrupted, heard=text)
            if not ended and text and msg.interrupted:
                self.replies.heard(reply, text)

    def _current_agent(self) -> str | None:
        fold = self.replies.fold
        return fold.agent if fold.agent is not None else self._agent

    def _on_handoff(self, item: llm.AgentHandoff) -> None:
        if item.old_agent_id is None:
            self._agent = item.new_agent_id
            return  # the session's first agent: session.started already names it
        if self._current_agent() == item.new_agent_id:
            self._agent = item.new_agent_id
            return  # already recorded (e.g. by CallSession.handoff)
        data: dict[str, Any] = {"from": item.old_agent_id, "to": item.new_agent_id}
        with contextlib.suppress(RuntimeError):
            agent = self.session.current_agent
            if agent.id == item.new_agent_id and (text := instructions_of(agent, self.session)) is not None:
                data["instructions"] = text
        self._agent = item.new_agent_id
        self._emit("agent.handoff", data)

    # -- tools ----------------------------------------------------------------------------------

    def _tool(self, name: str) -> Any:
        tools: list[Any] = list(self.session.tools)
        with contextlib.suppress(RuntimeError):
            tools += self.session.current_agent.tools
        for tool in llm.ToolContext(tools).function_tools.values():
            if tool.info.name == name:
                return tool
        return None

    def _is_guarded(self, name: str) -> bool:
        return bool(getattr(self._tool(name), "__calltape_guarded__", False))

    def _returns_agent(self, name: str) -> bool:
        """The tool is a handoff: its return annotation names an ``Agent`` (LiveKit 1.6/1.7 say so nowhere else)."""
        tool = self._tool(name)
        try:
            hints = typing.get_type_hints(tool) if tool is not None else {}
        except Exception:  # an annotation that does not resolve: not known to be a handoff
            return False
        return _mentions_agent(hints.get("return"))

    def _settled(self, call_id: str) -> bool:
        state = self.replies.fold.tool_call(call_id)
        return state is not None and state.status != "in_progress"

    def _record_call(self, fc: llm.FunctionCall, sp: _Speech | None) -> None:
        if self.replies.fold.tool_call(fc.call_id) is not None:
            return
        reply = self._open_step(sp) if sp is not None else None
        data: dict[str, Any] = {"call": fc.call_id, "name": fc.name, "arguments": fc.arguments or "{}"}
        if reply is not None:
            data["reply"] = reply
        self._emit("tool.call", data)

    def _on_tool_update(self, ev: ToolExecutionUpdatedEvent) -> None:
        update = ev.update
        if isinstance(update, ToolCallStarted):
            fc = update.function_call
            self._record_call(fc, self._owner_of(fc.call_id))
            if self._is_guarded(fc.name):
                self._guarded_calls.add(fc.call_id)
            else:
                self._unguarded[fc.call_id] = fc
                self._emit("tool.started", {"call": fc.call_id})
        elif isinstance(update, ToolCallUpdated):
            # ctx.update(), or LiveKit releasing a tool its interrupted turn stopped waiting for:
            # progress of a call still running, never its result
            self._deferred.add(update.call_id)
            self._emit("tool.progress", {"call": update.call_id, "state": update.message, "message": update.message})
        elif isinstance(update, ToolCallEnded):
            self._on_tool_ended(update)

    def _on_tool_ended(self, update: ToolCallEnded) -> None:
        call_id = update.call_id
        if call_id in self._guarded_calls:
            if update.id != call_id:
                self._reconcile_released(call_id)
            return  # run_tool records guarded calls itself
        if self._settled(call_id):
            return
        if update.status == "cancelled":
            self._unguarded.pop(call_id, None)
            self._emit("tool.cancelled", {"call": call_id, "reason": "cancelled", "outcome": "unknown"})
            return
        if call_id in self._deferred or update.id != call_id:
            # the real end of a call that reported progress: LiveKit adds its output under a call
            # of its own (update.id) to the history before saying the call ended
            output, error = self._history_output(update.id, update)
            self._record_result(call_id, output, error)
            return
        # LiveKit's own output for the call (function_tools_executed) follows; it differs from the
        # tool's return when LiveKit overrides it (a handoff cut by a barge-in is an error there)
        self._ended[call_id] = update

    def _history_output(self, item_call_id: str, update: ToolCallEnded) -> tuple[Any, bool]:
        for item in reversed(self.session.history.items):
            if isinstance(item, llm.FunctionCallOutput) and item.call_id == item_call_id:
                return item.output, item.is_error
        return (update.message if update.message is not None else ""), update.status == "error"

    def _record_result(self, call_id: str, output: Any, error: bool) -> None:
        self._ended.pop(call_id, None)
        self._unguarded.pop(call_id, None)
        data: dict[str, Any] = {"call": call_id, "output": output}
        if error:
            data["error"] = True
        self._emit("tool.result", data)

    def _on_tools_executed(self, ev: FunctionToolsExecutedEvent) -> None:
        self._reconcile_late(ev)
        replies: set[str] = set()
        for fc, out in ev.zipped():
            self._record_call(fc, self._owner_of(fc.call_id))
            reply = self.reply_of(fc.call_id)
            if reply is not None:
                replies.add(reply)
            if fc.call_id in self._guarded_calls or self._settled(fc.call_id):
                continue
            if fc.call_id in self._deferred:
                continue  # the output is the call's progress update: its real end comes later
            self._record_result(fc.call_id, out.output, out.is_error)
        for sp in list(self._speeches.values()):
            if sp.reply in replies:
                self.replies.done(sp.reply)

    # -- live reconciliation of guarded calls ---------------------------------------------------

    def _reconcile_late(self, ev: FunctionToolsExecutedEvent) -> None:
        """Guarded calls that landed after a barge-in: their outputs go right after their calls.

        LiveKit inserts the items of this event into the agent's live ``ChatContext`` by creation
        time right after emitting it; an output made after the user spoke again would land after
        the user's new message, separated from its call. Giving each output the time just after the
        batch's last call puts it where calltape's context has it, before the next inference."""
        pairs = [(fc, out) for fc, out in ev.zipped() if fc.call_id in self._guarded_calls]
        if not pairs:
            return
        anchor = max(fc.created_at for fc, _ in pairs)
        first_out = min(out.created_at for _, out in pairs)
        batch = {id(x) for pair in pairs for x in pair}
        try:
            live = self.session.current_agent.chat_ctx.items
        except RuntimeError:
            return
        if not any(anchor < item.created_at < first_out and id(item) not in batch for item in live):
            return
        for i, (_, out) in enumerate(pairs, start=1):
            out.created_at = anchor + i * 1e-6

    def _reconcile_released(self, call_id: str) -> None:
        """A guarded call LiveKit released at its interruption cap has landed: the output LiveKit
        gave it when it stopped waiting (its placeholder) becomes the real one, in the agent's live
        context and the session history, before the reply that reports it is generated."""
        state = self.replies.fold.tool_call(call_id)
        if state is None or state.status in ("in_progress",):
            return
        output = state.output if isinstance(state.output, str) else json.dumps(state.output)
        contexts: list[llm.ChatContext] = [self.session.history]
        with contextlib.suppress(RuntimeError):
            contexts.append(self.session.current_agent.chat_ctx)  # a view of the live items
        for chat_ctx in contexts:
            for item in chat_ctx.items:
                if isinstance(item, llm.FunctionCallOutput) and item.call_id == call_id:
                    item.output = output
                    item.is_error = state.status == "error"

    def _settle_dropped(self, handle: SpeechHandle) -> None:
        """The interrupted speech is done and LiveKit gave no output for calls of it that had ended.

        LiveKit 1.6/1.7 drop an interrupted turn's calls (1.8 reports them before the speech is
        done, so nothing is left here): each is recorded with the output 1.8 keeps for it, the
        tool's return or, for a handoff (which does not happen), an error saying so, never an empty
        success; the call and that output go into the agent's live context and the history, so
        LiveKit's context and calltape's say the same before the next inference."""
        prefix = f"{handle.id}_"
        for call_id, update in list(self._ended.items()):
            state = self.replies.fold.tool_call(call_id)
            fc = self._unguarded.get(call_id)
            if fc is None or state is None or not (state.reply or "").startswith(prefix) or self._settled(call_id):
                continue
            if self._returns_agent(fc.name):
                output, error = HANDOFF_INTERRUPTED, True
            else:
                output, error = update.message or "", update.status == "error"
            self._record_result(call_id, output, error)
            self._spawn(self._put_live(fc, output, error))

    def hold(self, task: asyncio.Future[Any]) -> None:
        """Keeps a guarded call's task for :meth:`drain` to wait for (:meth:`detach` leaves it running:
        it stops recording, not the user's tool)."""
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    def land(self, fc: llm.FunctionCall, handle: SpeechHandle) -> None:
        """A guarded call has its outcome: once its speech is done, if the speech was interrupted
        (before or after the call returned), a call LiveKit left out of the agent's live context
        (1.6/1.7 add neither the calls nor the outputs of an interrupted turn) goes in with its one
        output, before the next inference."""
        if handle.done() and not handle.interrupted:
            return
        self._spawn(self._land_when_done(fc, handle))

    async def _land_when_done(self, fc: llm.FunctionCall, handle: SpeechHandle) -> None:
        await _speech_done(handle)
        if not handle.interrupted:
            return
        await asyncio.sleep(0)  # LiveKit adds what it keeps right after the speech ends
        state = self.replies.fold.tool_call(fc.call_id)
        if state is None or state.status == "in_progress":
            return
        output = state.output if isinstance(state.output, str) else json.dumps(state.output)
        await self._put_live(fc, output, state.status != "completed")

    async def _put_live(self, fc: llm.FunctionCall, output: str, is_error: bool) -> None:
        """Inserts a call LiveKit left out, with its one output, into the live context and the history."""
        try:
            agent = self.session.current_agent
        except RuntimeError:
            return
        if fc.call_id in self._put or any(
            getattr(item, "call_id", None) == fc.call_id for item in agent.chat_ctx.items
        ):
            return  # LiveKit kept the call (1.8), or it is in already: the other reconciliations apply
        self._put.add(fc.call_id)
        call = llm.FunctionCall(
            call_id=fc.call_id, name=fc.name, arguments=fc.arguments or "{}", created_at=fc.created_at
        )
        result = llm.FunctionCallOutput(
            call_id=fc.call_id,
            name=fc.name,
            output=output,
            is_error=is_error,
            created_at=fc.created_at + 1e-6,  # right after its call, not after what was said since
        )
        self.session.history.insert([call, result])
        chat_ctx = agent.chat_ctx.copy()
        chat_ctx.insert([call, result])
        await agent.update_chat_ctx(chat_ctx, exclude_invalid_function_calls=False)

    def _flush_ended(self) -> None:
        """Calls that ended but whose LiveKit output never came (the session closed first)."""
        for call_id, update in list(self._ended.items()):
            if not self._settled(call_id) and call_id not in self._guarded_calls:
                self._record_result(call_id, update.message or "", update.status == "error")
        self._ended.clear()
        self._unguarded.clear()

    # -- end of the call ------------------------------------------------------------------------

    def _on_close(self, ev: CloseEvent) -> None:
        self._flush_ended()
        if self._interim:
            self._drop_pending_user()
        reason = ev.reason.value if hasattr(ev.reason, "value") else str(ev.reason)
        dropped = ev.error is not None or reason in _DROP_REASONS
        if self.live is not None:
            self._spawn(self.live.drop(reason=reason) if dropped else self.live.end(reason=reason))
        else:
            self._emit("session.dropped" if dropped else "session.ended", {"reason": reason})


def _speech_done(handle: SpeechHandle) -> asyncio.Future[None]:
    """A future set when ``handle`` is done (unlike ``handle.wait_for_playout()``, usable anywhere)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _done(_: SpeechHandle) -> None:
        if not done.done():
            done.set_result(None)

    handle.add_done_callback(_done)
    return done


def _mentions_agent(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, Agent):
        return True
    return any(_mentions_agent(arg) for arg in typing.get_args(annotation))


def attach(session: AgentSession[Any], call: EventSink) -> LiveKitTap:
    """Records ``session`` into ``call`` from now on; returns the tap (``tap.detach()`` stops it)."""
    existing = tap_of(session)
    if existing is not None:
        existing.detach()
    return LiveKitTap(session, call)


def tap_of(session: AgentSession[Any]) -> LiveKitTap | None:
    """The tap attached to ``session``, if any."""
    tap = getattr(session, _TAP_ATTR, None)
    return tap if isinstance(tap, LiveKitTap) else None


def _contained(name: str, handler: Callable[[Any], None]) -> Callable[[Any], None]:
    """A handler whose failure stays in the tap: LiveKit's event emitter re-raises a listener's
    ``TypeError`` into the task that emitted the event, where it skipped LiveKit's own bookkeeping (an
    interrupted reply's generation never marked done: ``ctx.wait_for_playout()`` hung until the session
    closed). Logged by type only: the event may hold what the caller said."""

    @functools.wraps(handler)
    def contained(ev: Any) -> None:
        try:
            handler(ev)
        except Exception as exc:
            log.error("calltape: the LiveKit tap failed on %s (%s); the call goes on", name, type(exc).__name__)

    return contained
