"""ElevenLabs Agents, live: a tap on the ``elevenlabs`` SDK's ``Conversation`` / ``AsyncConversation``.

The SDK runs the conversation on its own threads (the websocket reader, and the client tools' event
loop), so the tap never records from them: every server message and every client tool run is handed
to the event loop that owns calltape's connection (``loop.call_soon_threadsafe``) and recorded there,
in the order it arrived, by one consumer task. Attach before ``start_session()``::

    tap = tap_elevenlabs(ct, conversation)       # ct: an open calltape.connect(...)
    conversation.start_session()                  # (await it for AsyncConversation)
    ...; await tap.close()                        # after the conversation ended

The tap sees each server message before the SDK dispatches it (it wraps the conversation's
``_handle_message``, present in every SDK release since 2.0), so it needs none of the user's callbacks
and leaves them as they are. Mapping (the post-call mapping's choices, :mod:`calltape.adapters.elevenlabs`):

* the session id is the conversation id (``session_prefix`` + ``conversation_id``, as ``calltape serve``
  names it), opened when ``conversation_initiation_metadata`` arrives and *not* marked reconstructed,
  so the post-call webhook or ``import --format elevenlabs`` of the same conversation only closes it;
* ``user_transcript`` → ``user.transcript`` (final); ``agent_response`` → one reply (started, its
  text; done when the next turn begins; in a voice conversation its speech starts at once and ends in
  full when the next reply begins or the call ends, unless it was cut);
* ``interruption`` → ``interruption`` of the current reply; ``agent_response_correction`` → the cut
  reply's heard text (``agent.speech.ended`` interrupted, ``heard`` = the corrected response: what was
  actually said before the cut, as the webhook's ``message`` of an interrupted line);
* ``client_tool_call`` → ``tool.call`` under its ``tool_call_id`` (joined to the current reply unless
  the user spoke since; the call ends that reply's generation), and the client tool runs guarded (SPEC
  section 3: exactly once per call id, never for an interrupted reply, ``tool.started`` durable before
  the body, then ``tool.result``); the SDK is
  answered with the output calltape's context shows.

Heard first (``calltape.effect(..., heard=True)`` in a client tool): ElevenLabs reports when a reply was
cut, never when it finished playing, so in a voice conversation such an effect is refused at once
(``EffectNotRun``: the call is ``tool.cancelled`` ``not_run`` and the agent is told so); in a text-only
conversation the announcing reply is whole when the call arrives, and the effect runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from calltape.adapters.replies import ReplyTracker
from calltape.runtime.toolspec import ToolOutcome, ToolSpec

if TYPE_CHECKING:
    from calltape.client import Calltape
    from calltape.runtime import CallSession

__all__ = ["ElevenLabsTap", "TapOptions", "tap_elevenlabs"]

log = logging.getLogger(__name__)

FRAMEWORK = "elevenlabs"
"""The ``session.started.framework`` of a conversation recorded live."""

_RECORDED = frozenset(
    {
        "conversation_initiation_metadata",
        "user_transcript",
        "agent_response",
        "agent_response_correction",
        "interruption",
        "client_tool_call",
    }
)

Handle = Callable[[str, dict[str, Any]], Coroutine[Any, Any, Any]]


class _ClientToolError(Exception):
    """A guarded client tool ended in an error: the SDK sends its text to the agent as ``is_error``."""


class ElevenLabsTap:
    """Records one ElevenLabs conversation into calltape as it happens (see the module docstring).

    Made by :func:`tap_elevenlabs`, on the event loop that owns ``ct``."""

    def __init__(
        self,
        ct: Calltape,
        conversation: Any,
        *,
        agent: str | None = None,
        session_prefix: str = "",
        tools: Mapping[str, ToolSpec] | None = None,
    ) -> None:
        self._ct = ct
        self._loop = asyncio.get_running_loop()
        self._agent = agent
        self._prefix = session_prefix
        self._tools = dict(tools or {})
        self._agent_id = str(getattr(conversation, "agent_id", "") or "")
        self._voice = getattr(conversation, "audio_interface", None) is not None
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._running: set[asyncio.Task[None]] = set()
        self.call: CallSession | None = None
        """The live call, once the conversation's id has arrived."""
        self._replies: ReplyTracker | None = None
        self._consumer = self._loop.create_task(self._consume(), name="calltape-elevenlabs-tap")
        self._hook_messages(conversation)
        self._hook_tools(conversation)
        self._hook_end(conversation)

    # -- the SDK's threads: hand over, record nothing here ------------------------------------

    def _post(self, kind: str, payload: Any = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed: the call is over for calltape
            log.warning("calltape: an ElevenLabs %s arrived after the tap's event loop closed", kind)

    def _see(self, message: Any) -> None:
        if isinstance(message, dict) and message.get("type") in _RECORDED:
            self._post("message", message)

    def _hook_messages(self, conversation: Any) -> None:
        original = conversation._handle_message
        see = self._see
        if inspect.iscoroutinefunction(original):

            async def hooked_async(message: Any, ws: Any) -> None:
                see(message)
                await original(message, ws)

            conversation._handle_message = hooked_async
        else:

            def hooked(message: Any, ws: Any) -> None:
                see(message)
                original(message, ws)

            conversation._handle_message = hooked

    def _hook_tools(self, conversation: Any) -> None:
        client_tools = conversation.client_tools
        handle: Handle = client_tools.handle
        post = self._post

        async def guarded(tool_name: str, parameters: dict[str, Any]) -> Any:
            done: concurrent.futures.Future[ToolOutcome] = concurrent.futures.Future()
            post("run", (tool_name, dict(parameters), handle, asyncio.get_running_loop(), done))
            outcome = await asyncio.wrap_future(done)
            if outcome.status == "error":
                error = outcome.output.get("error") if isinstance(outcome.output, dict) else None
                raise _ClientToolError(str(error or outcome.output))
            return outcome.output

        client_tools.handle = guarded

    def _hook_end(self, conversation: Any) -> None:
        name = "callback_disconnect" if hasattr(conversation, "callback_disconnect") else "callback_end_session"
        if not hasattr(conversation, name):
            return  # an SDK without an end callback: the application calls close()
        user = getattr(conversation, name)
        post = self._post
        asynchronous = inspect.iscoroutinefunction(conversation._handle_message)

        def reason_of(args: tuple[Any, ...]) -> str:
            # DisconnectionDetails.reason (user, agent, error); callback_end_session says nothing
            return str(getattr(args[0], "reason", "") or "ended") if args else "ended"

        if asynchronous:

            async def ended_async(*args: Any) -> None:
                post("end", reason_of(args))
                if user is not None:
                    await user(*args)

            setattr(conversation, name, ended_async)
        else:

            def ended(*args: Any) -> None:
                post("end", reason_of(args))
                if user is not None:
                    user(*args)

            setattr(conversation, name, ended)

    # -- the owning loop: record, in arrival order ----------------------------------------------

    async def close(self, reason: str = "user") -> None:
        """Waits until everything the SDK reported is recorded and the session has ended.

        Call it after the conversation ended (the SDK's end is recorded with its own reason: ``user``
        and ``agent`` end the session, ``error`` records it as dropped, so it can be resumed)."""
        self._post("end", reason)
        await asyncio.shield(self._consumer)

    async def _consume(self) -> None:
        while True:
            kind, payload = await self._queue.get()
            try:
                if kind == "end":
                    await self._end(str(payload))
                    return
                if kind == "run":
                    self._run(*payload)
                else:
                    await self._message(payload)
            except Exception as exc:  # never take the conversation down; the type only (no content)
                log.error("calltape: the ElevenLabs tap could not record a %s (%s)", kind, type(exc).__name__)

    async def _message(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "conversation_initiation_metadata":
            await self._open(str(message["conversation_initiation_metadata_event"]["conversation_id"]))
            return
        call, replies = self.call, self._replies
        if call is None or replies is None:
            return  # nothing before the conversation's id (the server sends it first)
        if kind == "user_transcript":
            text = str(message["user_transcription_event"]["user_transcript"]).strip()
            if text:
                current = replies.current
                if current is not None:
                    replies.done(current)
                call.emit("user.transcript", {"text": text, "final": True})
        elif kind == "agent_response":
            text = str(message["agent_response_event"]["agent_response"]).strip()
            if text:
                self._finish_current()
                rid = replies.begin()
                replies.text(rid, text)
                if self._voice:
                    replies.speech_started(rid)
        elif kind == "interruption":
            replies.interrupt(cause="user_speech")
        elif kind == "agent_response_correction":
            event = message["agent_response_correction_event"]
            self._correct(str(event["original_agent_response"]).strip(), str(event["corrected_agent_response"]).strip())
        elif kind == "client_tool_call":
            tc = message["client_tool_call"]
            current = replies.current
            if current is None or replies.user_spoke_since(current):
                self._finish_current()
                current = replies.begin()
            args = tc.get("parameters") or {}
            data = {"call": str(tc["tool_call_id"]), "name": str(tc.get("tool_name") or "tool"), "arguments": args}
            call.emit("tool.call", {**data, "reply": current})
            replies.done(current)  # its text came whole (agent_response): the call ends its generation

    async def _open(self, conversation_id: str) -> None:
        metadata = {"conversation_id": conversation_id}
        if self._agent_id:
            metadata["agent_id"] = self._agent_id
        self.call = await self._ct.start_call(
            self._prefix + conversation_id,
            agent=self._agent or self._agent_id or FRAMEWORK,
            modality="voice" if self._voice else "text",
            framework=FRAMEWORK,
            metadata=metadata,
            tools=self._tools,
        )
        # ElevenLabs never says when a reply finished playing (the SDK's audio device plays it): a
        # heard-first effect is refused at once rather than run unheard or left waiting (SPEC section 8)
        self.call.playout_reported = not self._voice
        self._replies = ReplyTracker(self.call)

    def _finish_current(self) -> None:
        """The current reply is over: generated, and (voice) heard in full unless it was cut."""
        replies = self._replies
        current = replies.current if replies is not None else None
        if replies is None or current is None:
            return
        replies.done(current)
        st = replies.state(current)
        if self._voice and st is not None and st.speech_started and not st.interrupted:
            replies.speech_ended(current)

    def _correct(self, original: str, corrected: str) -> None:
        """What was actually said of a cut reply: the latest reply that generated ``original``."""
        replies = self._replies
        if replies is None:
            return
        said = (r.reply for r in reversed(replies.view().replies()) if r.generated.strip() == original)
        rid = next(said, replies.current)
        st = replies.state(rid) if rid is not None else None
        if rid is None or st is None or (st.speech_ended and not st.interrupted):
            return  # unknown, or already heard in full: nothing to correct
        replies.done(rid)
        if self._voice and st.speech_started:
            if not st.interrupted:
                replies.interrupt(rid, cause="user_speech", heard=corrected)
            replies.speech_ended(rid, interrupted=True, heard=corrected)
        else:  # nothing played: the interruption itself carries the heard text (late: the fold still takes it)
            replies.emit("interruption", {"reply": rid, "cause": "user_speech", "heard": corrected})

    def _run(
        self,
        name: str,
        parameters: dict[str, Any],
        handle: Handle,
        tools_loop: asyncio.AbstractEventLoop,
        done: concurrent.futures.Future[ToolOutcome],
    ) -> None:
        async def body() -> Any:
            if tools_loop is self._loop:
                result = await handle(name, parameters)
            else:
                result = await asyncio.wrap_future(
                    asyncio.run_coroutine_threadsafe(handle(name, parameters), tools_loop)
                )
            # what the SDK sends the agent for an empty result, so the log holds what the agent was told
            return result or f"Client tool: {name} called successfully."

        async def run() -> None:
            try:
                call = self.call
                if call is None:  # no conversation id yet: nothing to guard against, run it as the SDK would
                    done.set_result(ToolOutcome(await body(), "completed", ran=True))
                    return
                arguments = {k: v for k, v in parameters.items() if k != "tool_call_id"}
                call_id = str(parameters.get("tool_call_id"))
                done.set_result(await call.run_tool(call_id, name, arguments, body))
            except BaseException as exc:
                done.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise

        task = self._loop.create_task(run(), name="calltape-elevenlabs-tool")
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _end(self, reason: str) -> None:
        # The SDK stops its client tools' loop at the end: a tool still running is settled now.
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        call = self.call
        if call is None:
            return
        self._finish_current()
        if reason == "error":
            await call.drop("elevenlabs connection error")
        else:
            await call.end(reason)


class TapOptions(TypedDict, total=False):
    """The keyword options of :func:`tap_elevenlabs` (what they mean is told there), which hands them to
    :class:`ElevenLabsTap` (whose defaults apply): stated once, so the two cannot drift apart."""

    agent: str | None
    session_prefix: str
    tools: Mapping[str, ToolSpec] | None


def tap_elevenlabs(ct: Calltape, conversation: Any, **options: Unpack[TapOptions]) -> ElevenLabsTap:
    """Taps an ElevenLabs ``Conversation`` or ``AsyncConversation`` before its ``start_session()``.

    Call it on the event loop that owns ``ct`` (the tap records there, whatever thread the SDK calls
    from). ``agent`` names the agent in the log (default: the conversation's agent id);
    ``session_prefix`` must match ``calltape serve``'s if the post-call webhook goes there too; ``tools``
    sets the client tools' :class:`~calltape.runtime.ToolSpec` (timeout, interruption policy)."""
    return ElevenLabsTap(ct, conversation, **options)
