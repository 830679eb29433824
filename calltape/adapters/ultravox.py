"""Ultravox: a call and its messages → calltape events; its call webhooks; a dropped call resumed as a
new Ultravox call seeded from calltape's context.

Ultravox keeps a call (``GET /api/calls/{id}``: ``callId``, ``created``, ``joined``, ``ended``,
``endReason``, ``systemPrompt``…) apart from its messages (``GET /api/calls/{id}/messages``: a page
``{"results": [...], "next": …}`` of ``{role, text, invocationId, toolName, errorDetails, timespan}``).
A saved call is therefore ``{"call": <call>, "messages": <the list, or the page>}``. Tool calls and
their results are paired by ``invocationId``; a message's time is the call's join time plus its
``timespan.start``. Ultravox's messages do not say which agent line was cut off, nor VAD edges: none
are written. A call that ended on ``connection_error`` or ``system_error`` is recorded as
``session.dropped``, so ``calltape resume`` can settle it and :func:`initial_messages` can seed a new
Ultravox call with what the caller actually heard and every settled tool outcome.

The webhooks (``{"event": "call.started" | "call.joined" | "call.ended" | "call.billed", "call": …}``)
carry the call object only; the receiver fetches the messages at ``call.ended`` when it has a source
for them. Event ids derive from the call id and each message's position, the same for the webhook
and for ``calltape import --format ultravox``, so either may come first and the other adds nothing.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from msgspec.structs import replace

from calltape.adapters.reconstruct import Turn, json_or_text, reconstruct
from calltape.adapters.webhook_auth import sign_ultravox, verify_ultravox_signature
from calltape.errors import InvalidEvent
from calltape.events import Event, make_event, parse_time
from calltape.projections.formats import to_ultravox

__all__ = [
    "DROPPED_REASONS",
    "MessageSource",
    "api_messages",
    "initial_messages",
    "messages_of",
    "resume_call_body",
    "sign_ultravox",
    "ultravox_events",
    "ultravox_webhook_events",
    "verify_ultravox_signature",
]

SOURCE = "ultravox.call"
"""The reconstruction source (and the prefix of the event ids)."""

DROPPED_REASONS = frozenset({"connection_error", "system_error"})
"""``endReason`` values that mean the call was lost rather than ended: recorded as ``session.dropped``."""

RESUMED_FROM = "calltape_resumed_from"
"""The Ultravox call ``metadata`` key naming the calltape session a new call resumes."""

API_BASE = "https://api.ultravox.ai/api"
"""Where :func:`api_messages` reads a call's messages."""

MAX_PAGES = 100
"""Pages of messages :func:`api_messages` reads at most (a call of thousands of messages)."""

MessageSource = Callable[[str], Awaitable[Sequence[Mapping[str, Any]]]]
"""Where the receiver gets a call's messages at ``call.ended``: ``async (call_id) -> messages``."""

_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)s")


def _call(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    call = payload.get("call")
    if not isinstance(call, Mapping) or not isinstance(call.get("callId"), str) or not call["callId"]:
        raise InvalidEvent("not an Ultravox call: it needs 'call' with a 'callId'")
    return call


def messages_of(value: Any) -> list[Mapping[str, Any]]:
    """The messages of a saved payload: the list itself, or the list endpoint's page (``results``)."""
    if isinstance(value, Mapping) and "results" in value:
        value = value["results"]
    if not isinstance(value, list) or not all(isinstance(m, Mapping) for m in value):
        raise InvalidEvent("Ultravox 'messages' must be the list of the call's messages, or the list endpoint's page")
    return value


def _ms(value: Any) -> int | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_time(value)
    except InvalidEvent:
        return None


def _offset_ms(timespan: Any) -> int | None:
    """``timespan.start`` (a protobuf duration such as ``"12.480s"``) in milliseconds."""
    start = timespan.get("start") if isinstance(timespan, Mapping) else None
    match = _DURATION.fullmatch(start.strip()) if isinstance(start, str) else None
    return round(float(match.group(1)) * 1000) if match else None


def _agent(call: Mapping[str, Any]) -> str:
    agent = call.get("agent")
    name = agent.get("name") if isinstance(agent, Mapping) else None
    return str(name or call.get("agentId") or "ultravox")


def _metadata(call: Mapping[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"call_id": call["callId"]}
    for key in ("agentId", "firstSpeaker", "clientVersion"):
        if call.get(key) is not None:
            meta[key] = call[key]
    if isinstance(call.get("metadata"), Mapping) and call["metadata"]:
        meta["ultravox_metadata"] = dict(call["metadata"])
    return meta


def _turns(call: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> list[Turn]:
    base = _ms(call.get("joined")) or _ms(call.get("created"))
    turns: list[Turn] = []
    for m in messages:
        offset = _offset_ms(m.get("timespan"))
        at = base + offset if base is not None and offset is not None else None
        role, text = m.get("role"), str(m.get("text") or "")
        if role == "MESSAGE_ROLE_USER":
            turns.append(Turn("user", text, at))
        elif role == "MESSAGE_ROLE_AGENT":
            turns.append(Turn("assistant", text, at))
        elif role in ("MESSAGE_ROLE_TOOL_CALL", "MESSAGE_ROLE_TOOL_RESULT"):
            invocation = m.get("invocationId")
            if not isinstance(invocation, str) or not invocation:
                raise InvalidEvent("an Ultravox tool message needs an 'invocationId'")
            if role == "MESSAGE_ROLE_TOOL_CALL":
                args = json_or_text(text) if text.strip() else {}
                # Ultravox invokes its tools itself: the message is the invocation
                name = m.get("toolName")
                turns.append(Turn("tool_call", at_ms=at, call=invocation, name=name, arguments=args, started=True))
            else:
                error = bool(m.get("errorDetails"))
                turns.append(Turn("tool_result", at_ms=at, call=invocation, output=json_or_text(text), error=error))
        elif not isinstance(role, str):
            raise InvalidEvent("an Ultravox message needs a 'role'")
        # MESSAGE_ROLE_UNSPECIFIED and future roles: nothing the context can show
    return turns


def _end_id(session: str) -> str:
    return f"{SOURCE}:{session}:end"


def ultravox_events(payload: Mapping[str, Any], *, session: str | None = None) -> list[Event]:
    """``{"call": …, "messages": …}`` as a reconstructed calltape session (session id: the call id).

    A call not ended yet (no ``ended``) gets no closing event. The closing event has an id of its own
    (not its position), so the webhook that saw only the call's end and a later import of its messages
    agree on it."""
    call = _call(payload)
    if "messages" not in payload:
        raise InvalidEvent("an Ultravox import needs 'messages' beside 'call' (the call's messages list)")
    messages = messages_of(payload["messages"])
    return _events(call, messages, session)


def _events(call: Mapping[str, Any], messages: Sequence[Mapping[str, Any]], session: str | None) -> list[Event]:
    sid = session or str(call["callId"])
    ended = _ms(call.get("ended"))
    reason = str(call.get("endReason") or "ended") if call.get("ended") else None
    events = reconstruct(
        sid,
        _turns(call, messages),
        source=SOURCE,
        agent=_agent(call),
        instructions=call.get("systemPrompt") if isinstance(call.get("systemPrompt"), str) else None,
        started_at_ms=_ms(call.get("created")),
        ended_at_ms=ended,
        end_reason=reason,
        metadata=_metadata(call),
    )
    if reason is not None and events and events[-1].type == "session.ended":
        last = events[-1]
        if reason in DROPPED_REASONS:
            last = make_event(sid, "session.dropped", {"reason": reason}, at_ms=last.at_ms, agent=last.agent)
        events[-1] = replace(last, id=_end_id(sid))
    return events


def ultravox_webhook_events(
    body: Mapping[str, Any],
    *,
    session: str | None = None,
    started: bool = False,
    messages: Sequence[Mapping[str, Any]] | None = None,
) -> list[Event]:
    """The events one call webhook adds. ``started``: the session exists already; ``messages``: the
    call's messages, fetched at ``call.ended`` (without them the call is only closed: its transcript
    can be imported later)."""
    event = body.get("event")
    if not isinstance(event, str):
        raise InvalidEvent("an Ultravox webhook needs 'event' and 'call.callId'")
    call = _call(body)
    sid = session or str(call["callId"])
    opening = [] if started else _events({**call, "ended": None}, [], sid)
    if event == "call.started":
        return opening
    if event == "call.joined":
        joined = _ms(call.get("joined"))
        data = {"joined": call["joined"]} if isinstance(call.get("joined"), str) else {}
        return [*opening, make_event(sid, "x.ultravox.joined", data, id=f"{SOURCE}:{sid}:joined", at_ms=joined)]
    if event == "call.ended":
        if messages is not None:
            events = _events(call, messages, sid)
            return events[1:] if started else events
        closing = [e for e in _events(call, [], sid) if e.id == _end_id(sid)]
        return [*opening, *closing]
    return []  # call.billed and future events: nothing the log records


def api_messages(api_key: str, *, base_url: str = API_BASE, timeout: float = 10.0) -> MessageSource:
    """A :data:`MessageSource` over Ultravox's REST API (``GET /calls/{id}/messages``, every page),
    authenticated with ``X-API-Key``. Needs the ``ultravox`` extra (httpx)."""
    from calltape.extras import requires_extra

    with requires_extra("ultravox", "fetching an Ultravox call's messages"):
        import httpx

    async def fetch(call_id: str) -> list[Mapping[str, Any]]:
        messages: list[Mapping[str, Any]] = []
        url: str | None = f"{base_url.rstrip('/')}/calls/{call_id}/messages"
        params: dict[str, Any] | None = {"pageSize": 200}
        async with httpx.AsyncClient(headers={"X-API-Key": api_key}, timeout=timeout) as client:
            for _ in range(MAX_PAGES):
                if url is None:
                    break
                response = await client.get(url, params=params)
                response.raise_for_status()
                page = response.json()
                messages.extend(messages_of(page))
                url = page.get("next") if isinstance(page, Mapping) else None
                params = None  # the next link carries its own cursor
        return messages

    return fetch


# ---------------------------------------------------------------------------------------------
# Resume: a new Ultravox call seeded from calltape's context.


def initial_messages(native: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Ultravox ``initialMessages`` from a calltape ``native`` context (``calltape context`` or a resume
    plan's; also ``--format ultravox``): what the caller heard (an interrupted reply as far as it was
    heard), every tool call with its settled output under the same ``invocationId`` (a result, or
    calltape's ``{"status": …}`` for a call that timed out, was cancelled, or whose outcome is unknown).
    The system message is the new call's ``systemPrompt`` instead (:func:`resume_call_body`)."""
    return to_ultravox(dict(native))


def resume_call_body(
    native: Mapping[str, Any], *, system_prompt: str | None = None, session: str | None = None
) -> dict[str, Any]:
    """The body of Ultravox's create-call request (``POST /api/calls``) that continues a call: its
    ``systemPrompt`` (the context's system message unless given), ``initialMessages`` from the context,
    and ``metadata`` naming the calltape session it resumes. Merge your own call settings (voice,
    medium, tools) into it."""
    items = native.get("items") or []
    system = next((i.get("content") for i in items if i.get("type") == "message" and i.get("role") == "system"), None)
    body: dict[str, Any] = {"initialMessages": initial_messages(native)}
    prompt = system_prompt if system_prompt is not None else system
    if prompt:
        body["systemPrompt"] = prompt
    sid = session or native.get("session")
    if isinstance(sid, str) and sid:
        body["metadata"] = {RESUMED_FROM: sid}
    return body
