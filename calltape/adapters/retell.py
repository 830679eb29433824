"""Retell: the custom-LLM WebSocket protocol, and the call webhooks with ``X-Retell-Signature``.

Custom LLM. Retell sends ``update_only`` (live transcript), ``response_required`` / ``reminder_required``
(with a growing ``response_id``) and expects ``response`` frames back. A newer ``response_id`` means the
older response is abandoned: the handler stops generating it and records an ``interruption`` whose
``heard`` is the agent text Retell's transcript shows as spoken. Retell's transcript is also the heard
text of a reply that finished normally.

A re-asked response must never run a tool twice. Tools run as session-level tasks, shielded from the
generation that asked for them: superseding a response cancels its generation, not the tool, whose
result still lands in the log. An identical call (same name, same canonical arguments) asked again in the
same user turn joins the first one instead of running again.

Webhooks. ``{"event": ..., "call": {...}}`` signed with ``X-Retell-Signature: v=<ms>,d=<hex>`` where
``d`` is HMAC-SHA256 over ``body + <ms>`` with the API key (the scheme of ``Retell.verify``), checked
against the raw body, within five minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from calltape.adapters.reconstruct import Turn, json_or_text, reconstruct
from calltape.adapters.replies import ReplyTracker
from calltape.adapters.webhook_auth import sign_retell, verify_retell_signature
from calltape.canonical_json import canonical_arguments, json_text
from calltape.errors import InvalidEvent
from calltape.events import Event, make_event
from calltape.runtime.protocol import LiveCall
from calltape.runtime.toolspec import ToolOutcome, ToolSpec

__all__ = [
    "RetellLLMSession",
    "RetellTurn",
    "retell_webhook_events",
    "sign_retell",
    "verify_retell_signature",
]

Send = Callable[[dict[str, Any]], Awaitable[None]]

log = logging.getLogger("calltape.adapters.retell")


def _norm(text: str) -> str:
    return re.sub(r"[^\w]+", " ", text.lower()).strip()


def _canonical(arguments: Any) -> str:
    return canonical_arguments(arguments).decode()


@dataclass(slots=True)
class _Part:
    """One calltape reply of a Retell response: a response that asks for a tool ends its reply at the
    call (the announcement the caller hears before the tool runs) and goes on in a new one."""

    id: str
    response_id: int
    start_index: int
    """Where the response's words start in Retell's transcript."""
    skip: int = 0
    """Words of the response spoken by its earlier parts (one Retell utterance holds them all)."""
    split: bool = False
    """Ended at a tool call: heard in full once Retell's transcript shows every word of it spoken."""


@dataclass(slots=True)
class _Reply:
    """What only Retell knows about a response (its ``response_id``, its parts, its generation task);
    each part's lifecycle is read from the fold (the reply tracker)."""

    part: _Part
    """The part the generation writes to now."""
    user_turn: int
    task: asyncio.Task[None] | None = None
    parts: list[_Part] = field(default_factory=list)
    """Every part, the current one last."""

    @property
    def id(self) -> str:
        """The current part's reply id."""
        return self.part.id

    @property
    def response_id(self) -> int:
        """Retell's id of the response."""
        return self.part.response_id


class RetellTurn:
    """What a response generator sees: the context so far, and guarded tools."""

    def __init__(self, session: RetellLLMSession, reply: _Reply, request: Mapping[str, Any]) -> None:
        self._session = session
        self._reply = reply
        self.request = request
        self.response_id = reply.response_id
        self.interaction_type: str = str(request.get("interaction_type"))
        self.end_call = False
        self.transfer_number: str | None = None

    @property
    def reply(self) -> str:
        """The calltape reply the generation writes to now (a new one after each tool call)."""
        return self._reply.id

    @property
    def current(self) -> bool:
        """Whether this turn is still the one Retell wants answered (a newer ``response_id`` supersedes it)."""
        return self._session.replies.current == self._reply.id

    def context(self, format: str = "openai") -> Any:
        """The calltape context (what was heard, every tool result), not Retell's raw transcript."""
        return self._session.call.context(format=format)

    async def run_tool(
        self,
        name: str,
        arguments: Any,
        body: Callable[..., Awaitable[Any]],
        *,
        call_id: str | None = None,
        spec: ToolSpec | None = None,
    ) -> ToolOutcome:
        """Runs a tool under guarded execution; asked again with the same arguments in this user turn
        (Retell re-asks), it waits for the one run instead of starting another."""
        return await self._session._run_tool(self._reply, name, arguments, body, call_id, spec)


class RetellLLMSession:
    """One Retell custom-LLM WebSocket connection recorded into a calltape call.

    ``respond(turn)`` is the application's generator: it yields text chunks and may await
    ``turn.run_tool(...)``. ``send`` writes one JSON frame to Retell. :meth:`serve` runs the loop over a
    Starlette ``WebSocket``; tests and other transports call :meth:`receive` per message.
    """

    def __init__(
        self,
        call: LiveCall,
        respond: Callable[[RetellTurn], AsyncIterator[str]],
        send: Send,
        *,
        begin_message: str = "",
        config: Mapping[str, Any] | None = None,
        reply_prefix: str = "retell-",
    ) -> None:
        self.call = call
        self.replies = ReplyTracker(call)
        self.reply_prefix = reply_prefix
        self.respond = respond
        self.send = send
        self.begin_message = begin_message
        self.config = {"auto_reconnect": True, "call_details": True, **(config or {})}
        self._replies: dict[int, _Reply] = {}
        self._user_finals: dict[int, str] = {}
        self._interim: tuple[int, str] | None = None
        self._user_turn = 0
        self._tools: dict[tuple[int, str, str], asyncio.Task[Any]] = {}
        self._transcript: list[Mapping[str, Any]] = []

    # -- transport --------------------------------------------------------------------------------

    async def open(self) -> None:
        """The frames Retell expects first: config, then the begin message (empty: wait for the user)."""
        await self.send({"response_type": "config", "config": self.config})
        reply = self._new_reply(0, {"interaction_type": "begin"})
        self.replies.text(reply.id, self.begin_message)
        self.replies.done(reply.id)
        await self.send(
            {"response_type": "response", "response_id": 0, "content": self.begin_message, "content_complete": True}
        )

    async def serve(self, websocket: Any) -> None:
        """Runs the protocol over an accepted Starlette WebSocket until Retell closes it.

        A frame that is not a JSON object, or not a valid Retell message, is logged and skipped: one bad
        frame does not end the call."""
        await self.open()
        try:
            while True:
                message = await websocket.receive()
                if message.get("type") == "websocket.disconnect":
                    break
                raw = message.get("text")
                if raw is None:
                    raw = message.get("bytes") or b""
                try:
                    frame = orjson.loads(raw)
                    if not isinstance(frame, dict):
                        raise InvalidEvent("a Retell frame must be a JSON object")
                    await self.receive(frame)
                except (orjson.JSONDecodeError, InvalidEvent) as exc:
                    log.warning("skipped a Retell custom-LLM frame: %s", exc)
        finally:
            await self.close()

    async def close(self) -> None:
        """Stops generation; running tools keep going (their results still reach the log)."""
        for reply in self._replies.values():
            if reply.task is not None and not reply.task.done():
                reply.task.cancel()
        await self.wait_idle()

    async def wait_idle(self) -> None:
        """Waits until every reply generation and tool task of the connection has finished."""
        tasks = [r.task for r in self._replies.values() if r.task is not None]
        tasks += list(self._tools.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- Retell → us ------------------------------------------------------------------------------

    async def receive(self, message: Mapping[str, Any]) -> None:
        """Handles one frame from Retell (ping, transcript update, response or reminder request)."""
        kind = message.get("interaction_type")
        if kind == "ping_pong":
            await self.send({"response_type": "ping_pong", "timestamp": message.get("timestamp")})
        elif kind == "call_details":
            raw = message.get("call")
            call: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
            keep = ("call_id", "agent_id", "call_type", "from_number", "to_number", "direction")
            self.call.emit("x.retell.call_details", {k: call[k] for k in keep if k in call})
        elif kind == "update_only":
            self._on_transcript(message.get("transcript") or [], final=False)
            if message.get("turntaking") == "user_turn" and self.replies.current is not None:
                self._settle_if_heard(self.replies.current)
        elif kind in ("response_required", "reminder_required"):
            rid = message.get("response_id")
            if not isinstance(rid, int):
                raise InvalidEvent(f"Retell {kind} without an integer response_id")
            if "transcript" in message:
                self._on_transcript(message.get("transcript") or [], final=True)
            self._supersede(rid)
            reply = self._new_reply(rid, message)
            reply.task = asyncio.create_task(self._generate(reply, message))
        # anything else (newer protocol additions) is ignored

    def _new_reply(self, response_id: int, request: Mapping[str, Any]) -> _Reply:
        part = self._new_part(f"{self.reply_prefix}{response_id}", response_id, len(self._transcript))
        reply = _Reply(part, self._user_turn, parts=[part])
        self._replies[response_id] = reply
        return reply

    def _new_part(self, base: str, response_id: int, start_index: int, skip: int = 0) -> _Part:
        rid, n = base, 1
        while self.replies.state(rid) is not None:
            n += 1
            rid = f"{base}.{n}"
        self.replies.begin(rid)
        return _Part(rid, response_id, start_index, skip)

    def _parts(self) -> list[_Part]:
        return [p for r in self._replies.values() for p in r.parts]

    def _on_transcript(self, transcript: Sequence[Any], *, final: bool) -> None:
        self._transcript = [u for u in transcript if isinstance(u, Mapping)]
        last = len(self._transcript) - 1
        for i, u in enumerate(self._transcript):
            role, text = u.get("role"), str(u.get("content") or "").strip()
            if role != "user" or not text or i in self._user_finals:
                continue
            if i < last or final:
                self._user_finals[i] = text
                self._user_turn += 1
                self._interim = None
                self.call.emit("user.transcript", {"text": text, "final": True})
            elif self._interim != (i, text):
                self._interim = (i, text)
                self.call.emit("user.transcript", {"text": text, "final": False})
        for part in self._parts():
            if self.replies.finished(part.id):
                continue
            heard = self._spoken(part)
            if heard:
                self.replies.speech_started(part.id)
                self.replies.heard(part.id, heard)
                if part.split:  # an announcement before a tool call: heard-first effects wait for it
                    self._settle_if_heard(part.id)

    def _spoken(self, part: _Part) -> str:
        """What Retell's transcript shows spoken of the part (its words of the response's utterances)."""
        spoken = [
            str(u.get("content") or "").strip()
            for u in self._transcript[part.start_index :]
            if u.get("role") == "agent"
        ]
        heard = " ".join(s for s in spoken if s)
        if not part.skip and not part.split:
            return heard
        words = heard.split()[part.skip :]
        if part.split:
            st = self.replies.state(part.id)
            words = words[: len(st.generated.split())] if st is not None else words
        return " ".join(words)

    def _settle_if_heard(self, rid: str) -> None:
        """Ends the playout of a complete reply whose every word Retell's transcript shows as spoken."""
        st = self.replies.state(rid)
        if st is None or not st.done or self.replies.finished(rid):
            return
        said = _norm(st.generated)
        if said and _norm(st.reported_heard or "") == said:
            self.replies.speech_ended(rid, heard=st.reported_heard)

    def _supersede(self, response_id: int) -> None:
        for reply in list(self._replies.values()):
            if reply.response_id >= response_id:
                continue
            if reply.task is not None and not reply.task.done():
                reply.task.cancel()
            for part in reply.parts:
                self._settle_if_heard(part.id)
                if self.replies.finished(part.id):
                    continue
                st = self.replies.state(part.id)
                heard = (st.reported_heard if st is not None else None) or ""
                self.replies.interrupt(part.id, cause="user_speech", heard=heard)
                if st is not None and st.speech_started:
                    self.replies.speech_ended(part.id, interrupted=True, heard=heard)

    def _end_part_at_call(self, reply: _Reply) -> str:
        """The reply a tool call of the response belongs to: the current part, which the call ends (the
        caller hears it before the tool runs); text after the call goes into a new part."""
        part = reply.part
        if not part.split:
            part.split = True
            self.replies.done(part.id)
            self._settle_if_heard(part.id)  # a part with no text is heard as it completes
        return part.id

    def _writing_part(self, reply: _Reply) -> str:
        """The part the generation writes to: a new one once the current part ended at a tool call."""
        part = reply.part
        if part.split:
            st = self.replies.state(part.id)
            words = len(st.generated.split()) if st is not None else 0
            base = reply.parts[0].id
            part = self._new_part(f"{base}.t{len(reply.parts)}", part.response_id, part.start_index, part.skip + words)
            reply.part = part
            reply.parts.append(part)
        return part.id

    # -- us → Retell ------------------------------------------------------------------------------

    async def _generate(self, reply: _Reply, request: Mapping[str, Any]) -> None:
        turn = RetellTurn(self, reply, request)
        try:
            async for chunk in self.respond(turn):
                if self._cut(reply):
                    return
                if chunk:
                    self.replies.text(self._writing_part(reply), chunk)
                    await self.send(
                        {
                            "response_type": "response",
                            "response_id": reply.response_id,
                            "content": chunk,
                            "content_complete": False,
                        }
                    )
            if self._cut(reply):
                return
            self.replies.done(reply.id)
            final: dict[str, Any] = {
                "response_type": "response",
                "response_id": reply.response_id,
                "content": "",
                "content_complete": True,
            }
            if turn.end_call:
                final["end_call"] = True
            if turn.transfer_number:
                final["transfer_number"] = turn.transfer_number
            await self.send(final)
        except asyncio.CancelledError:
            return
        finally:
            self.replies.done(reply.id)

    def _cut(self, reply: _Reply) -> bool:
        """The reply was superseded (or otherwise ended): stop generating it. A part that ended at a tool
        call and was heard in full is not cut: the response goes on after the call."""
        st = self.replies.state(reply.id)
        return st is None or st.interrupted or (st.speech_ended and not reply.part.split)

    async def _run_tool(
        self,
        reply: _Reply,
        name: str,
        arguments: Any,
        body: Callable[..., Awaitable[Any]],
        call_id: str | None,
        spec: ToolSpec | None,
    ) -> ToolOutcome:
        key = (reply.user_turn, name, _canonical(arguments))
        task = self._tools.get(key)
        if task is None:  # first ask in this user turn: record it and run it
            cid = call_id or f"{reply.id}:{name}:{len(self._tools) + 1}"
            args = orjson.loads(key[2]) if isinstance(arguments, str) and key[2].startswith("{") else arguments
            self.call.emit("tool.call", {"call": cid, "name": name, "arguments": args, "reply": reply.id})
            self._end_part_at_call(reply)
            await self.send(
                {
                    "response_type": "tool_call_invocation",
                    "tool_call_id": cid,
                    "name": name,
                    "arguments": key[2],
                }
            )
            task = asyncio.create_task(self._run_and_report(cid, name, args, body, reply.id, spec))
            self._tools[key] = task
        else:  # asked again (a re-asked response): its announcement ends at the call too
            self._end_part_at_call(reply)
        return await asyncio.shield(task)  # superseding the response cancels the caller, not the tool

    async def _run_and_report(
        self, cid: str, name: str, args: Any, body: Callable[..., Awaitable[Any]], reply: str, spec: ToolSpec | None
    ) -> ToolOutcome:
        outcome = await self.call.run_tool(cid, name, args, body, reply=reply, spec=spec)
        output = outcome.output
        with contextlib.suppress(Exception):  # the socket may be gone; the log has the result
            await self.send(
                {
                    "response_type": "tool_call_result",
                    "tool_call_id": cid,
                    "content": json_text(output),
                }
            )
        return outcome


# ---------------------------------------------------------------------------------------------
# Webhooks.


def _call_of(body: Mapping[str, Any]) -> Mapping[str, Any]:
    event, call = body.get("event"), body.get("call")
    if not isinstance(event, str) or not isinstance(call, Mapping) or not call.get("call_id"):
        raise InvalidEvent("a Retell webhook needs 'event' and 'call.call_id'")
    return call


def retell_session(body: Mapping[str, Any], prefix: str = "") -> str:
    return prefix + str(_call_of(body)["call_id"])


def retell_webhook_events(
    body: Mapping[str, Any], *, session: str | None = None, started: bool = False, live: bool = False
) -> list[Event]:
    """The events a webhook adds. ``started``: the session exists; ``live``: its conversation was recorded
    live (custom LLM), so ``call_ended`` only closes it instead of rebuilding it from the transcript."""
    call = _call_of(body)
    event = str(body["event"])
    sid = session or str(call["call_id"])
    agent = str(call.get("agent_name") or call.get("agent_id") or "retell")
    start_ms = call.get("start_timestamp") if isinstance(call.get("start_timestamp"), int) else None
    end_ms = call.get("end_timestamp") if isinstance(call.get("end_timestamp"), int) else None
    meta = {
        k: call[k] for k in ("call_id", "agent_id", "call_type", "direction", "from_number", "to_number") if k in call
    }

    def one(kind: str, data: Mapping[str, Any], at: int | None = None) -> Event:
        return make_event(sid, kind, data, id=f"retell:{sid}:{event}:{kind}", at_ms=at)

    if event == "call_started":
        if started:
            return []
        return [one("session.started", {"agent": agent, "framework": "retell", "metadata": meta}, start_ms)]
    if event == "call_ended":
        reason = str(call.get("disconnection_reason") or "ended")
        if live:
            return [one("session.ended", {"reason": reason}, end_ms)]
        turns: list[Turn] = []
        for u in call.get("transcript_with_tool_calls") or call.get("transcript_object") or []:
            if not isinstance(u, Mapping):
                continue
            words = u.get("words") or []
            first = words[0].get("start") if words and isinstance(words[0], Mapping) else None
            at = start_ms + int(float(first) * 1000) if start_ms is not None and first is not None else None
            role = u.get("role")
            if role == "user":
                turns.append(Turn("user", str(u.get("content") or ""), at))
            elif role == "agent":
                turns.append(Turn("assistant", str(u.get("content") or ""), at))
            elif role == "tool_call_invocation":
                turns.append(
                    Turn(
                        "tool_call",
                        at_ms=at,
                        call=str(u.get("tool_call_id")),
                        name=u.get("name"),
                        arguments=u.get("arguments") or "{}",
                    )
                )
            elif role == "tool_call_result":
                output = json_or_text(u.get("content"))
                turns.append(
                    Turn(
                        "tool_result",
                        at_ms=at,
                        call=str(u.get("tool_call_id")),
                        output=output,
                        error=u.get("successful") is False,
                    )
                )
        return reconstruct(
            sid,
            turns,
            source="retell.call_ended",
            agent=agent,
            started_at_ms=start_ms,
            ended_at_ms=end_ms,
            end_reason=reason,
            metadata=meta,
            with_start=not started,
        )
    if event == "call_analyzed":
        return [one("x.retell.call_analyzed", {"call_analysis": call.get("call_analysis") or {}})]
    if event == "transfer_bridged":
        to = str(call.get("transfer_destination") or body.get("transfer_destination") or "transfer")
        return [one("agent.handoff", {"from": agent, "to": to, "reason": "transfer"})]
    if event.startswith("transfer_"):
        dest = call.get("transfer_destination") or body.get("transfer_destination")
        return [one(f"x.retell.{event}", {"transfer_destination": dest} if dest else {})]
    return []  # transcript_updated and future events: nothing to record
