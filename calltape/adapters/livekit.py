"""LiveKit Agents adapter (``pip install 'calltape[livekit]'``, livekit-agents ``>=1.8,<1.9``).

Four pieces, each answering a gap of the framework:

* :func:`attach` records an ``AgentSession`` into a live call (normally a
  :class:`calltape.runtime.CallSession`): one line, public ``AgentSession`` events only.
* :func:`wait_for_playout` is a drop-in for ``RunContext.wait_for_playout()`` and
  ``SpeechHandle.wait_for_playout()`` that raises :class:`calltape.runtime.Interrupted` within
  milliseconds of an interruption. Upstream waits for the speech to be *done*, which after a barge-in
  takes as long as the speech's running tools, capped by ``INTERRUPTION_TIMEOUT`` (5 s; livekit/agents
  #5359, closed without a fix).
* :func:`guarded` runs a ``@function_tool`` body under ``call.run_tool``: durable start, timeout,
  exactly-once per call id.
* :func:`to_chat_ctx` / :func:`rehydrate` seed a new ``Agent`` from a calltape context. A plain
  ``Agent(chat_ctx=...)`` copies the context with ``tools=self._tools`` and silently drops every
  function call and output of a tool the new agent does not have.

Mapping notes (why the tap looks where it looks):

* One calltape ``reply`` is one LLM generation: a ``SpeechHandle`` step, named
  ``"{speech_id}_{step}"`` like LiveKit's own generation ids. A turn with tools has two steps.
* Emit order is not context order. The assistant ``ChatMessage`` reaches ``conversation_item_added``
  only after its playout, after its tools started and after a barge-in's transcript; so the reply is
  opened (``agent.reply.started``) at the first earlier sign of it: the agent starting to speak it or
  one of its tools starting.
* Function calls never come through ``conversation_item_added``: ``tool_execution_updated`` gives the
  start (before the body runs) and the end of each call, ``function_tools_executed`` the calls that
  failed before reaching the executor (unknown tool, bad arguments).
* The assistant message carries ``interrupted`` and, when interrupted, the synchronized transcript:
  what the user heard. That is recorded as ``agent.speech.ended.heard``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from livekit.agents import Agent, AgentSession, RunContext, llm
from livekit.agents.llm import ToolError
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

from calltape.runtime import Interrupted, ToolOutcome, ToolSpec

__all__ = [
    "SUPPORTED_VERSIONS",
    "CallSink",
    "LiveKitTap",
    "attach",
    "guarded",
    "rehydrate",
    "tap_of",
    "to_chat_ctx",
    "wait_for_playout",
]

SUPPORTED_VERSIONS = ">=1.8,<1.9"

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class CallSink(Protocol):
    """What the tap needs from a call; :class:`calltape.runtime.CallSession` is the real one.

    ``interrupt``, ``end``, ``drop`` and ``run_tool`` are used when present, so a bare recorder with
    ``emit`` is enough for recording.
    """

    def emit(self, type: str, data: Mapping[str, Any]) -> Any: ...


# Sessions the tap is attached to, so guarded tools find their call from the RunContext alone.
_TAPS: weakref.WeakKeyDictionary[AgentSession[Any], LiveKitTap] = weakref.WeakKeyDictionary()

_RUNNING_PLACEHOLDER = "The tool call is still in progress."
"""What LiveKit answers for a tool released by the interruption timeout; its real end comes later."""

_DROP_REASONS = frozenset({"error", "participant_disconnected", "job_shutdown"})
_CAUSES = {"audio_activity": "user_speech", "user_turn": "user_speech", "programmatic": "api"}


@dataclass(slots=True)
class _Speech:
    handle: SpeechHandle
    step: int = 0
    reply: str | None = None
    open: bool = False
    spoken: bool = False
    ended: bool = False
    interrupted: bool = False


def _instructions_text(agent: Agent) -> str | None:
    instructions: Any = agent.instructions
    if isinstance(instructions, str):
        return instructions
    render = getattr(instructions, "render", None)
    return str(render()) if callable(render) else None


class LiveKitTap:
    """Maps one ``AgentSession``'s events to calltape events. Create it with :func:`attach`."""

    def __init__(self, session: AgentSession[Any], call: CallSink) -> None:
        self.session = session
        self.call = call
        self._speeches: dict[str, _Speech] = {}
        self._last: _Speech | None = None
        self._call_reply: dict[str, str] = {}
        self._settled: set[str] = set()
        self._guarded_calls: set[str] = set()
        self._user_finals = False
        self._user_speaking = False
        self._agent: str | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
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
        for name, handler in self._handlers:
            session.on(name, handler)  # type: ignore[arg-type]
        _TAPS[session] = self

    # -- public ---------------------------------------------------------------------------------

    def detach(self) -> None:
        """Stops recording (the call itself stays open)."""
        for name, handler in self._handlers:
            self.session.off(name, handler)  # type: ignore[arg-type]
        for task in self._tasks:
            task.cancel()
        if _TAPS.get(self.session) is self:
            del _TAPS[self.session]

    async def drain(self) -> None:
        """Waits for the tap's background work (speech watchers, the close of the call)."""
        while pending := [t for t in self._tasks if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    def reply_of(self, call_id: str) -> str | None:
        """The calltape reply a function call belongs to (None before the tap saw the call)."""
        return self._call_reply.get(call_id)

    # -- emit helpers ---------------------------------------------------------------------------

    def _emit(self, type_: str, data: dict[str, Any]) -> None:
        self.call.emit(type_, data)

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
        sp.step, sp.reply, sp.open, sp.spoken, sp.ended = step, f"{sp.handle.id}_{step}", True, False, False
        sp.interrupted = False
        self._last = sp
        self._emit("agent.reply.started", {"reply": sp.reply, "speech_id": sp.handle.id, "step": step})
        return sp.reply

    def _close_reply(self, sp: _Speech, *, interrupted: bool = False) -> None:
        if sp.reply is None:
            return
        if sp.open:
            sp.open = False
            self._emit("agent.reply.done", {"reply": sp.reply})
        if sp.spoken and not sp.ended:
            sp.ended = True
            self._emit("agent.speech.ended", {"reply": sp.reply, "interrupted": interrupted or sp.interrupted})

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
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def _done(_: SpeechHandle) -> None:
            if not done.done():
                done.set_result(None)

        handle.add_done_callback(_done)
        await handle.wait_if_not_interrupted([done])
        if handle.interrupted:
            self._on_interrupted(sp)
        await done
        self._close_reply(sp)
        self._speeches.pop(handle.id, None)

    def _on_interrupted(self, sp: _Speech) -> None:
        if sp.reply is None or sp.interrupted:
            return  # nothing of it reached calltape: a queued speech is cancelled, not interrupted
        sp.interrupted = True
        cause = _CAUSES.get(str(getattr(sp.handle, "_interrupt_source", "") or ""), "api")
        interrupt = getattr(self.call, "interrupt", None)
        if callable(interrupt):
            interrupt(reply=sp.reply, cause=cause)
        else:
            self._emit("interruption", {"reply": sp.reply, "cause": cause})

    def _on_speech_created(self, ev: SpeechCreatedEvent) -> None:
        if ev.speech_handle.id not in self._speeches:
            self._track(ev.speech_handle)

    def _on_agent_state(self, ev: AgentStateChangedEvent) -> None:
        if ev.new_state != "speaking":
            return
        sp = self._speech(self.session.current_speech)
        if sp is None:
            return
        reply = self._open_step(sp)
        if not sp.spoken:
            sp.spoken = True
            self._emit("agent.speech.started", {"reply": reply})

    def _owner_of(self, call_id: str) -> _Speech | None:
        for sp in self._speeches.values():
            if any(getattr(item, "call_id", None) == call_id for item in sp.handle.chat_items):
                return sp
        return self._speech(self.session.current_speech)

    # -- user -----------------------------------------------------------------------------------

    def _on_transcribed(self, ev: UserInputTranscribedEvent) -> None:
        text = ev.transcript.strip()
        if not text and not ev.is_final:
            return
        if ev.is_final:
            self._user_finals = True
        self._emit("user.transcript", {"text": ev.transcript, "final": ev.is_final})

    def _on_user_state(self, ev: UserStateChangedEvent) -> None:
        if ev.new_state == "speaking" and not self._user_speaking:
            self._user_speaking = True
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
        if self._user_finals:
            # the committed turn repeats the final transcripts already recorded
            self._user_finals = False
            return
        text = msg.text_content or ""
        if text.strip():
            self._emit("user.text", {"text": text})

    def _on_assistant_message(self, msg: llm.ChatMessage) -> None:
        sp = self._speech(self.session.current_speech) or self._last
        if sp is None:
            return
        reply = self._open_step(sp)
        text = msg.text_content or ""
        if text:
            if not sp.interrupted:
                self._emit("agent.text", {"reply": reply, "text": text})
            if not sp.spoken:
                sp.spoken = True
                self._emit("agent.speech.started", {"reply": reply})
        if sp.open:
            sp.open = False
            self._emit("agent.reply.done", {"reply": reply})
        if sp.spoken and not sp.ended:
            sp.ended = True
            self._emit("agent.speech.ended", {"reply": reply, "interrupted": msg.interrupted, "heard": text})

    def _current_agent(self) -> str | None:
        fold = getattr(self.call, "fold", None)
        agent = getattr(fold, "agent", None)
        return agent if isinstance(agent, str) else self._agent

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
            if agent.id == item.new_agent_id and (text := _instructions_text(agent)) is not None:
                data["instructions"] = text
        self._agent = item.new_agent_id
        self._emit("agent.handoff", data)

    # -- tools ----------------------------------------------------------------------------------

    def _is_guarded(self, name: str) -> bool:
        tools: list[Any] = list(self.session.tools)
        with contextlib.suppress(RuntimeError):
            tools += self.session.current_agent.tools
        for tool in llm.ToolContext(tools).function_tools.values():
            if tool.info.name == name:
                return bool(getattr(tool, "__calltape_guarded__", False))
        return False

    def _record_call(self, fc: llm.FunctionCall, sp: _Speech | None) -> str | None:
        if fc.call_id in self._call_reply:
            return self._call_reply[fc.call_id]
        reply = self._open_step(sp) if sp is not None else None
        data: dict[str, Any] = {"call": fc.call_id, "name": fc.name, "arguments": fc.arguments or "{}"}
        if reply is not None:
            data["reply"] = reply
            self._call_reply[fc.call_id] = reply
        self._emit("tool.call", data)
        return reply

    def _on_tool_update(self, ev: ToolExecutionUpdatedEvent) -> None:
        update = ev.update
        if isinstance(update, ToolCallStarted):
            fc = update.function_call
            self._record_call(fc, self._owner_of(fc.call_id))
            if self._is_guarded(fc.name):
                self._guarded_calls.add(fc.call_id)
            else:
                self._emit("tool.started", {"call": fc.call_id})
        elif isinstance(update, ToolCallUpdated):
            self._emit("tool.progress", {"call": update.call_id, "state": update.message, "message": update.message})
        elif isinstance(update, ToolCallEnded):
            self._on_tool_ended(update)

    def _on_tool_ended(self, update: ToolCallEnded) -> None:
        call_id = update.call_id
        if call_id in self._guarded_calls or call_id in self._settled:
            return  # run_tool records guarded calls itself
        self._settled.add(call_id)
        if update.status == "cancelled":
            self._emit("tool.cancelled", {"call": call_id, "reason": "cancelled", "outcome": "unknown"})
            return
        output: Any = update.message if update.message is not None else ""
        error = update.status == "error"
        if update.id == call_id:
            # the item LiveKit puts in the chat context (error text sanitized, output serialized)
            sp = self._owner_of(call_id)
            for item in sp.handle.chat_items if sp is not None else ():
                if isinstance(item, llm.FunctionCallOutput) and item.call_id == call_id:
                    output, error = item.output, item.is_error
        data: dict[str, Any] = {"call": call_id, "output": output}
        if error:
            data["error"] = True
        self._emit("tool.result", data)

    def _on_tools_executed(self, ev: FunctionToolsExecutedEvent) -> None:
        replies: set[str] = set()
        for fc, out in ev.zipped():
            known = fc.call_id in self._call_reply
            reply = self._record_call(fc, self._owner_of(fc.call_id))
            if reply is not None:
                replies.add(reply)
            if fc.call_id in self._guarded_calls or fc.call_id in self._settled:
                continue
            if known and out.output == _RUNNING_PLACEHOLDER:
                continue  # LiveKit's placeholder for a tool still running: its end comes later
            self._settled.add(fc.call_id)
            data: dict[str, Any] = {"call": fc.call_id, "output": out.output}
            if out.is_error:
                data["error"] = True
            self._emit("tool.result", data)
        for sp in list(self._speeches.values()):
            if sp.reply in replies and sp.open:
                sp.open = False
                self._emit("agent.reply.done", {"reply": sp.reply})

    # -- end of the call ------------------------------------------------------------------------

    def _on_close(self, ev: CloseEvent) -> None:
        reason = ev.reason.value if hasattr(ev.reason, "value") else str(ev.reason)
        dropped = ev.error is not None or reason in _DROP_REASONS
        method = getattr(self.call, "drop" if dropped else "end", None)
        if callable(method):
            self._spawn(method(reason=reason))
        else:
            self._emit("session.dropped" if dropped else "session.ended", {"reason": reason})


def attach(session: AgentSession[Any], call: CallSink) -> LiveKitTap:
    """Records ``session`` into ``call`` from now on; returns the tap (``tap.detach()`` stops it)."""
    existing = _TAPS.get(session)
    if existing is not None:
        existing.detach()
    return LiveKitTap(session, call)


def tap_of(session: AgentSession[Any]) -> LiveKitTap | None:
    """The tap attached to ``session``, if any."""
    return _TAPS.get(session)


# -------------------------------------------------------------------------------------------------
# Interruption-aware playout wait


def _interrupted_error(handle: SpeechHandle, reply: str | None) -> Interrupted:
    cause = _CAUSES.get(str(getattr(handle, "_interrupt_source", "") or ""))
    return Interrupted(reply or handle.id, cause)


async def wait_for_playout(target: RunContext[Any] | SpeechHandle, *, timeout: float | None = None) -> None:
    """Waits like ``target.wait_for_playout()``; raises ``Interrupted`` within ms of an interruption.

    ``RunContext``: the playout of the reply that called the tool. ``SpeechHandle``: the whole speech.
    Upstream only resolves once the speech is done, which after a barge-in waits for the speech's
    running tools, up to LiveKit's 5 s interruption timeout.
    """
    handle = target.speech_handle if isinstance(target, RunContext) else target
    tap = _TAPS.get(target.session) if isinstance(target, RunContext) else None
    reply = tap._speeches[handle.id].reply if tap is not None and handle.id in tap._speeches else None
    if handle.interrupted:
        raise _interrupted_error(handle, reply)
    waiter = asyncio.ensure_future(target.wait_for_playout())
    try:
        async with asyncio.timeout(timeout):
            await handle.wait_if_not_interrupted([waiter])
    finally:
        if not waiter.done():
            waiter.cancel()
    if not waiter.done():
        raise _interrupted_error(handle, reply)
    waiter.result()


# -------------------------------------------------------------------------------------------------
# Guarded tools


def _run_context(args: Sequence[Any], kwargs: Mapping[str, Any]) -> RunContext[Any]:
    for value in (*args, *kwargs.values()):
        if isinstance(value, RunContext):
            return value
    raise TypeError("a guarded tool needs a RunContext parameter (e.g. `ctx: RunContext`)")


def guarded(fn: F | None = None, *, spec: ToolSpec | None = None) -> Any:
    """Runs the tool body under ``call.run_tool`` (durable start, timeout, exactly-once per call id).

    Put it under ``@function_tool``; the tool takes a ``RunContext``. Without ``spec`` the call's
    ``tools={name: ToolSpec}`` entry applies, else the defaults (10 s timeout, ``finish``).
    Outcomes other than ``completed`` reach the LLM as a ``ToolError`` saying what happened.
    """

    def decorate(func: F) -> F:
        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = _run_context(args, kwargs)
            tap = _TAPS.get(ctx.session)
            if tap is None:
                raise RuntimeError("calltape is not attached to this AgentSession (call attach() first)")
            run_tool = getattr(tap.call, "run_tool", None)
            if not callable(run_tool):
                raise RuntimeError("the attached call cannot run tools (it needs run_tool)")
            fc = ctx.function_call
            tap._guarded_calls.add(fc.call_id)
            try:
                arguments: Any = json.loads(fc.arguments or "{}")
            except ValueError:
                arguments = fc.arguments

            async def body() -> Any:
                return await func(*args, **kwargs)

            outcome: ToolOutcome = await run_tool(
                fc.call_id, fc.name, arguments, body, reply=tap.reply_of(fc.call_id), spec=spec
            )
            if outcome.status == "completed":
                return outcome.output
            raise ToolError(_outcome_message(outcome))

        wrapper.__calltape_guarded__ = True  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate(fn) if fn is not None else decorate


def _outcome_message(outcome: ToolOutcome) -> str:
    if outcome.status == "error":
        output = outcome.output
        detail = output.get("error") if isinstance(output, dict) else output
        return str(detail) if detail else "the tool failed"
    return {
        "timeout": "the tool timed out",
        "cancelled": "the tool call was cancelled",
        "unknown": "the outcome of this tool call is unknown; it was not run again",
    }.get(outcome.status, f"the tool call ended as {outcome.status}")


# -------------------------------------------------------------------------------------------------
# Rehydration


def _items_of(context: Any) -> Iterable[Mapping[str, Any]]:
    if isinstance(context, Mapping):
        items = context.get("items", context.get("context"))
        if items is None:
            raise TypeError("expected a calltape native context (a dict with 'items') or its item list")
        return cast(Iterable[Mapping[str, Any]], items)
    plan_context = getattr(context, "context", None)
    if plan_context is not None:  # a ResumePlan: its context is a native dict (or its item list)
        return _items_of(plan_context if isinstance(plan_context, Mapping) else {"items": plan_context})
    return cast(Iterable[Mapping[str, Any]], context)


def to_chat_ctx(context: Any, *, include_instructions: bool = False) -> llm.ChatContext:
    """A LiveKit ``ChatContext`` from a calltape ``native`` context (dict, item list or resume plan).

    Every function call keeps its output (synthetic ``{"status": ...}`` JSON for calls that did not
    complete), so the provider never sees a dangling call. The system item is left out by default:
    the new agent brings its own instructions.
    """
    items = list(_items_of(context))
    base = time.time() - 0.001 * (len(items) + 1)
    names: dict[str, str] = {}
    out: list[llm.ChatItem] = []
    group: str | None = None  # the assistant message the following calls belong to
    for i, item in enumerate(items):
        at = base + 0.001 * i
        kind = item.get("type")
        if kind == "message":
            role = item.get("role")
            if role == "system" and not include_instructions:
                continue
            if role not in ("system", "user", "assistant", "developer"):
                continue
            msg = llm.ChatMessage(
                role=role,
                content=[str(item.get("content") or "")],
                interrupted=bool(item.get("interrupted", False)),
                created_at=at,
            )
            group = msg.id if role == "assistant" else None
            out.append(msg)
        elif kind == "function_call":
            call_id, name = str(item["call_id"]), str(item["name"])
            names[call_id] = name
            arguments = item.get("arguments", "{}")
            fc = llm.FunctionCall(
                call_id=call_id,
                name=name,
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
                created_at=at,
            )
            # LiveKit groups a reply's text and calls into one provider message by id prefix
            fc.group_id = group = group or fc.id
            out.append(fc)
        elif kind == "function_call_output":
            group = None  # a call after an output starts another reply
            call_id = str(item["call_id"])
            output = item.get("output")
            out.append(
                llm.FunctionCallOutput(
                    call_id=call_id,
                    name=names.get(call_id, ""),
                    output=output if isinstance(output, str) else json.dumps(output),
                    is_error=item.get("status") == "error",
                    created_at=at,
                )
            )
        elif kind == "handoff":
            group = None
            out.append(llm.AgentHandoff(old_agent_id=item.get("from"), new_agent_id=str(item["to"]), created_at=at))
    return llm.ChatContext(out)


async def rehydrate(agent: Agent, context: Any) -> Agent:
    """Seeds ``agent``'s chat context from a calltape context, keeping calls of tools it lacks.

    Uses ``update_chat_ctx(..., exclude_invalid_function_calls=False)``: the public way around the
    tool filter that ``Agent(chat_ctx=...)`` applies.
    """
    await agent.update_chat_ctx(to_chat_ctx(context), exclude_invalid_function_calls=False)
    return agent
