"""Vapi server-URL messages → calltape events, and the tool-call reply under guarded execution.

Vapi POSTs ``{"message": {...}}`` to the server URL. The mapping reads each call's state (which
reply is current, what of it the user heard) from the fold of what it mapped so far, through the shared
reply tracker (:mod:`calltape.adapters.replies`), so one :class:`VapiIngest` should see a call's messages
in order; after a restart it continues from the fold of the stored log (:meth:`VapiIngest.restore`).

* A reply is Vapi's ``turnId`` when the message carries one; otherwise the ingest numbers the assistant
  turns itself (a new turn begins with assistant output after the user spoke or barged in).
* Final ``transcript`` messages of role ``assistant`` are what the TTS actually spoke, so they are the
  heard text (``agent.speech.progress``) — a barge-in keeps only what was said.
* ``tool-calls`` arrive in several shapes: ``toolCallList`` items with a nested ``function``
  (arguments as JSON text or object), the flat ``{id, name, arguments}`` form, the legacy ``toolCalls``
  list, and ``toolWithToolCallList[].toolCall``. All are read.
* Event ids are derived from the message content, so a redelivered message appends nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from calltape.adapters.reconstruct import Turn, json_or_text, reconstruct
from calltape.adapters.replies import EventCollector, ReplyTracker
from calltape.adapters.webhook_auth import verify_vapi_request
from calltape.canonical_json import canonical_bytes, json_text
from calltape.errors import InvalidEvent
from calltape.events import Event, now_ms
from calltape.projections import ContextFold, fold_events
from calltape.runtime.protocol import LiveCall
from calltape.runtime.toolspec import ToolSpec

__all__ = [
    "VapiIngest",
    "VapiToolCall",
    "end_of_call_report",
    "run_tool_calls",
    "tool_calls_of",
    "tool_results",
    "verify_vapi_request",
]


@dataclass(frozen=True, slots=True)
class VapiToolCall:
    """One tool call of a ``tool-calls`` message, normalized from the shapes Vapi sends."""

    id: str
    name: str
    arguments: dict[str, Any]


def _arguments(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise InvalidEvent("Vapi tool call: arguments are not valid JSON") from exc
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidEvent("Vapi tool call: arguments must be a JSON object")
    return value


def tool_calls_of(message: Mapping[str, Any]) -> list[VapiToolCall]:
    """Every tool call in a ``tool-calls`` message, whatever shape Vapi used; first occurrence wins."""
    raw: list[Any] = []
    raw.extend(message.get("toolCallList") or [])
    raw.extend(message.get("toolCalls") or [])  # legacy
    for item in message.get("toolWithToolCallList") or []:
        if isinstance(item, Mapping) and isinstance(item.get("toolCall"), Mapping):
            raw.append(item["toolCall"])
    calls: dict[str, VapiToolCall] = {}
    for tc in raw:
        if not isinstance(tc, Mapping) or not tc.get("id"):
            raise InvalidEvent("Vapi tool call without an 'id'")
        fn = tc.get("function")
        if isinstance(fn, Mapping):  # OpenAI-style nested function
            name, args = fn.get("name"), fn.get("arguments", fn.get("parameters"))
        else:  # the flat form
            name, args = tc.get("name"), tc.get("arguments", tc.get("parameters"))
        if not isinstance(name, str) or not name:
            raise InvalidEvent(f"Vapi tool call '{tc['id']}' has no function name")
        calls.setdefault(str(tc["id"]), VapiToolCall(str(tc["id"]), name, _arguments(args)))
    return list(calls.values())


def tool_results(
    calls: Sequence[VapiToolCall], outcomes: Sequence[Any], *, error_statuses: Iterable[str] = ()
) -> dict[str, Any]:
    """The ``{"results": [...]}`` body Vapi expects (``ServerMessageResponseToolCalls``).

    ``outcomes`` are ``ToolOutcome`` objects (or plain outputs), in the order of ``calls``. Vapi wants
    strings: JSON outputs are serialized; a failed, timed-out, cancelled or unknown outcome is an
    ``error`` so the model does not take it as done.
    """
    failed = {"error", "timeout", "cancelled", "unknown", *error_statuses}
    results: list[dict[str, Any]] = []
    for call, outcome in zip(calls, outcomes, strict=True):
        output = getattr(outcome, "output", outcome)
        status = getattr(outcome, "status", "completed")
        text = json_text(output)
        entry: dict[str, Any] = {"toolCallId": call.id, "name": call.name}
        if status in failed:
            entry["error"] = text if output is not None else status
        else:
            entry["result"] = text
        results.append(entry)
    return {"results": results}


async def run_tool_calls(
    call: LiveCall,
    message: Mapping[str, Any],
    tools: Mapping[str, Callable[..., Awaitable[Any]]],
    *,
    reply: str | None = None,
    specs: Mapping[str, ToolSpec] | None = None,
) -> dict[str, Any]:
    """Runs a ``tool-calls`` message's calls under :meth:`LiveCall.run_tool`; returns Vapi's reply body.

    A call id already in the log returns its stored result (Vapi retries a slow webhook), so a retried
    request never runs a tool twice.
    """
    body = message.get("message", message)
    calls = tool_calls_of(body)

    async def one(tc: VapiToolCall) -> Any:
        fn = tools.get(tc.name)
        if fn is None:
            return _Missing(tc.name)
        params = inspect.signature(fn).parameters
        wants_progress = "progress" in params

        async def run(progress: Any = None) -> Any:
            kwargs = dict(tc.arguments)
            if wants_progress:
                kwargs["progress"] = progress
            return await fn(**kwargs)

        tool_body: Callable[..., Awaitable[Any]] = run if wants_progress else (lambda: run())
        spec = (specs or {}).get(tc.name)
        return await call.run_tool(tc.id, tc.name, tc.arguments, tool_body, reply=reply, spec=spec)

    outcomes = await asyncio.gather(*(one(tc) for tc in calls))
    return tool_results(calls, outcomes)


@dataclass(frozen=True, slots=True)
class _Missing:
    name: str

    @property
    def output(self) -> str:
        return f"no tool named '{self.name}' is registered"

    status = "error"


# ---------------------------------------------------------------------------------------------
# Message → events.


@dataclass(slots=True)
class _CallState:
    """One call: its fold (every reply fact), the tracker over it, and whether the call ended."""

    writer: EventCollector
    replies: ReplyTracker
    ended: bool = False

    @classmethod
    def over(cls, session: str, fold: ContextFold, *, ended: bool = False) -> _CallState:
        writer = EventCollector(session, fold)
        return cls(writer, ReplyTracker(writer, fold=fold), ended)

    @property
    def started(self) -> bool:
        return self.writer.fold.agent is not None

    @property
    def agent(self) -> str:
        return self.writer.fold.agent or "vapi"


def _message(body: Mapping[str, Any]) -> dict[str, Any]:
    msg = body.get("message", body)
    if not isinstance(msg, Mapping) or not isinstance(msg.get("type"), str):
        raise InvalidEvent("a Vapi server message needs 'message.type'")
    return dict(msg)


def call_id_of(body: Mapping[str, Any]) -> str:
    msg = _message(body)
    call = msg.get("call")
    cid = call.get("id") if isinstance(call, Mapping) else None
    if not isinstance(cid, str) or not cid:
        raise InvalidEvent("a Vapi server message needs 'message.call.id'")
    return cid


class VapiIngest:
    """Maps Vapi server messages to calltape events, one call's state at a time.

    A call's state is the fold of what was mapped so far (the reply tracker reads it); after a restart
    hand the ingest the fold of the stored log with :meth:`restore`."""

    def __init__(self, *, session_prefix: str = "", max_calls: int = 10_000) -> None:
        self.session_prefix = session_prefix
        self.max_calls = max_calls
        self._calls: dict[str, _CallState] = {}

    def session_of(self, body: Mapping[str, Any]) -> str:
        """The calltape session id of the call a Vapi message belongs to."""
        return self.session_prefix + call_id_of(body)

    def known(self, session: str) -> bool:
        """Whether this ingest has seen the session (else restore it from the log before continuing)."""
        return session in self._calls

    def restore(self, session: str, fold: ContextFold, *, ended: bool = False) -> None:
        """Continues a call from the fold of its stored log (``build_context``) after a restart;
        ``ended``: the log already holds ``session.ended`` (the store's session status)."""
        self._remember(session, _CallState.over(session, fold, ended=ended))

    def _remember(self, session: str, st: _CallState) -> None:
        self._calls[session] = st
        while len(self._calls) > self.max_calls:
            self._calls.pop(next(iter(self._calls)))

    def events(self, body: Mapping[str, Any]) -> list[Event]:
        """The events one server message adds (possibly none); ids are stable across redeliveries."""
        msg = _message(body)
        session = self.session_of(body)
        st = self._calls.get(session)
        if st is None:
            st = _CallState.over(session, ContextFold(session))
            self._remember(session, st)
        at = int(msg["timestamp"]) if isinstance(msg.get("timestamp"), (int, float)) else now_ms()
        digest = hashlib.sha256(canonical_bytes(msg)).hexdigest()[:20]
        st.writer.reset(f"vapi:{digest}:", at)
        if self._map(msg, st):
            return self.reconstruct(body)
        return st.writer.events

    # -- the mapping (each step writes through the call's reply tracker) --------------------------

    def _start(self, msg: Mapping[str, Any], st: _CallState) -> None:
        if st.started:
            return
        assistant = _obj(msg, "assistant")
        call = _obj(msg, "call")
        agent = str(assistant.get("name") or call.get("assistantId") or "vapi")
        meta = {"vapi_call_id": call.get("id"), "type": call.get("type")}
        data: dict[str, Any] = {"agent": agent, "framework": "vapi"}
        data["metadata"] = {k: v for k, v in meta.items() if v is not None}
        st.replies.emit("session.started", data)

    def _new_reply(self, st: _CallState, turn_id: Any) -> str:
        self._close_reply(st)
        return st.replies.begin(str(turn_id) if turn_id else f"turn-{st.replies.count() + 1}")

    def _current_reply(self, st: _CallState, turn_id: Any) -> str:
        """The reply new assistant output belongs to: a new one after the user spoke or barged in."""
        replies = st.replies
        current = replies.current
        if turn_id and str(turn_id) != current:
            return self._new_reply(st, turn_id)
        state = None if current is None else replies.state(current)
        if current is None or state is None or state.interrupted or replies.user_spoke_since(current):
            return self._new_reply(st, turn_id)
        return current

    def _close_reply(self, st: _CallState) -> None:
        current = st.replies.current
        if current is not None:
            st.replies.done(current)

    def _map(self, msg: Mapping[str, Any], st: _CallState) -> bool:
        """Writes the message's events; True when the call must be rebuilt from a report instead."""
        kind = msg["type"]
        if kind == "end-of-call-report":
            return self._end_of_call(msg, st)
        if st.ended:
            return False
        self._start(msg, st)
        replies = st.replies
        turn_id = msg.get("turnId")
        current = replies.current
        state = None if current is None else replies.state(current)
        if kind == "status-update":
            if msg.get("status") == "ended":
                self._close_reply(st)
                st.ended = True
                replies.emit("session.ended", {"reason": str(msg.get("endedReason") or "ended")})
        elif kind == "speech-update":
            role, status = msg.get("role"), msg.get("status")
            if role == "user" and status == "started":
                replies.emit("user.speech.started", {"source": "vad"})
            elif role == "user" and status == "stopped":
                replies.emit("user.speech.stopped", {})
            elif role == "assistant" and status == "started":
                replies.speech_started(self._current_reply(st, turn_id))
            elif role == "assistant" and status == "stopped" and current is not None and state is not None:
                if state.speech_started and not state.speech_ended:
                    self._close_reply(st)
                    replies.speech_ended(current, interrupted=state.interrupted, heard=state.reported_heard or None)
        elif kind == "transcript":
            text = str(msg.get("transcript") or "").strip()
            final = msg.get("transcriptType") == "final" or "final" in str(msg.get("type"))
            if msg.get("role") == "user" and text:
                replies.emit("user.transcript", {"text": text, "final": bool(final)})
            elif msg.get("role") == "assistant" and text and final and current is not None and state is not None:
                # what the TTS spoke, piece by piece: the heard text so far
                replies.heard(current, f"{state.reported_heard} {text}" if state.reported_heard else text)
        elif kind == "model-output":
            output = msg.get("output")
            if isinstance(output, Mapping):  # the SDK types it as an object; live calls send token text
                output = output.get("content") if isinstance(output.get("content"), str) else None
            if isinstance(output, str) and output:
                replies.text(self._current_reply(st, turn_id), output)
        elif kind == "user-interrupted":
            if current is not None and state is not None and not state.interrupted:
                heard = state.reported_heard
                if heard is None and state.speech_started and not state.speech_ended:
                    heard = ""
                replies.interrupt(current, cause="user_speech", heard=heard.strip() if heard is not None else None)
                self._close_reply(st)
        elif kind == "tool-calls":
            calls = tool_calls_of(msg)
            if current is None or state is None or state.done or state.interrupted or replies.user_spoke_since(current):
                current = self._new_reply(st, turn_id)
            for tc in calls:
                replies.emit("tool.call", {"call": tc.id, "name": tc.name, "arguments": tc.arguments, "reply": current})
        elif kind == "transfer-update":
            to_assistant = _obj(msg, "toAssistant") or None
            dest = _obj(msg, "destination")
            to = (
                (to_assistant or {}).get("name")
                or dest.get("assistantName")
                or dest.get("number")
                or dest.get("sipUri")
                or "transfer"
            )
            self._close_reply(st)
            handoff: dict[str, Any] = {"from": st.agent, "to": str(to), "reason": "transfer"}
            if to_assistant and isinstance(to_assistant.get("model"), Mapping):
                system = [
                    m.get("content")
                    for m in to_assistant["model"].get("messages") or []
                    if isinstance(m, Mapping) and m.get("role") == "system"
                ]
                if system and isinstance(system[0], str):
                    handoff["instructions"] = system[0]
            replies.emit("agent.handoff", handoff)
        return False

    def _end_of_call(self, msg: Mapping[str, Any], st: _CallState) -> bool:
        reason = str(msg.get("endedReason") or "ended")
        if st.replies.count():  # the call was recorded live: the report only closes it
            if not st.ended:
                self._close_reply(st)
                st.ended = True
                st.replies.emit("session.ended", {"reason": reason})
            return False
        return True

    def reconstruct(self, body: Mapping[str, Any]) -> list[Event]:
        """An ``end-of-call-report`` for a call never seen live, rebuilt from ``artifact.messages``."""
        msg = _message(body)
        session = self.session_of(body)
        artifact = _obj(msg, "artifact")
        messages = [m for m in artifact.get("messages") or [] if isinstance(m, Mapping)]
        cut = _interrupted_lines(messages, _obj(artifact, "performanceMetrics").get("numAssistantInterrupted"))
        turns: list[Turn] = []
        started = _ms(msg.get("startedAt"))
        for i, m in enumerate(messages):
            role = m.get("role")
            at = int(m["time"]) if isinstance(m.get("time"), (int, float)) else None
            if role == "user":
                turns.append(Turn("user", str(m.get("message") or ""), at))
            elif role in ("bot", "assistant"):
                # Vapi's bot lines are the transcript of what was spoken: a cut line was heard as it reads
                text = str(m.get("message") or "")
                turns.append(Turn("assistant", text, at, heard=text if i in cut else None))
            elif role == "tool_calls":
                for tc in tool_calls_of({"toolCalls": m.get("toolCalls") or []}):
                    turns.append(Turn("tool_call", at_ms=at, call=tc.id, name=tc.name, arguments=tc.arguments))
            elif role == "tool_call_result" and m.get("toolCallId"):
                output = json_or_text(m.get("result"))
                turns.append(Turn("tool_result", at_ms=at, call=str(m["toolCallId"]), output=output))
        system = next((str(m.get("message")) for m in messages if m.get("role") == "system"), None)
        call = _obj(msg, "call")
        events = reconstruct(
            session,
            turns,
            source="vapi.end_of_call_report",
            agent=str(_obj(msg, "assistant").get("name") or "vapi"),
            instructions=system,
            started_at_ms=started,
            ended_at_ms=_ms(msg.get("endedAt")),
            end_reason=str(msg.get("endedReason") or "ended"),
            metadata={"vapi_call_id": call.get("id")},
        )
        st = _CallState.over(session, fold_events(events, session), ended=True)
        self._remember(session, st)
        return events


def _interrupted_lines(messages: Sequence[Mapping[str, Any]], count: Any) -> set[int]:
    """The bot lines the report says were interrupted: Vapi gives only a count
    (``performanceMetrics.numAssistantInterrupted``) and each line's time span, so a line counts when
    the next line is the user's and began before the bot line ended. When more lines overlap than the
    count, the longest overlaps are taken (a short one is more likely a backchannel or endpointing
    jitter); with no count, or no overlap, nothing is marked."""
    if not isinstance(count, (int, float)) or count < 1:
        return set()
    overlaps: list[tuple[float, int]] = []
    for i, m in enumerate(messages):
        end = m.get("endTime")
        if m.get("role") not in ("bot", "assistant") or not isinstance(end, (int, float)):
            continue
        nxt = next((n for n in messages[i + 1 :] if n.get("role") != "system"), None)
        begun = nxt.get("time") if nxt is not None else None
        if nxt is not None and nxt.get("role") == "user" and isinstance(begun, (int, float)) and begun < end:
            overlaps.append((end - begun, i))
    overlaps.sort(key=lambda o: (-o[0], o[1]))
    return {i for _, i in overlaps[: int(count)]}


def end_of_call_report(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A saved Vapi payload as an end-of-call report body (``{"message": …}``).

    Accepts the report as the server URL received it (``{"message": {...}}`` or the bare message) and the
    call object (``GET /call/{id}``), whose ``artifact`` holds the same messages. Anything else raises
    :class:`~calltape.errors.InvalidEvent` in one sentence."""
    msg = payload.get("message", payload)
    if isinstance(msg, Mapping) and msg.get("type") == "end-of-call-report":
        call_id_of({"message": msg})
        return {"message": dict(msg)}
    if isinstance(msg, Mapping) and "type" in msg and "artifact" not in msg:
        raise InvalidEvent(f"a Vapi server message of type '{msg.get('type')}' is not an end-of-call report")
    cid = payload.get("id")
    has_messages = isinstance(payload.get("artifact"), Mapping) or isinstance(payload.get("messages"), list)
    if not isinstance(cid, str) or not cid or not has_messages:
        raise InvalidEvent("not a Vapi end-of-call report or call object (no 'message.type' nor 'id' with 'artifact')")
    artifact = dict(_obj(payload, "artifact"))
    if not artifact.get("messages") and isinstance(payload.get("messages"), list):
        artifact["messages"] = payload["messages"]
    report: dict[str, Any] = {"type": "end-of-call-report", "call": {"id": cid}, "artifact": artifact}
    for key in ("startedAt", "endedAt", "endedReason", "assistant"):
        if payload.get(key) is not None:
            report[key] = payload[key]
    return {"message": report}


def _obj(msg: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = msg.get(key)
    return value if isinstance(value, Mapping) else {}


def _ms(value: Any) -> int | None:
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str) and value:
        from calltape.events import parse_time

        try:
            return parse_time(value)
        except InvalidEvent:
            return None
    return None
