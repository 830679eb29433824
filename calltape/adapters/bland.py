"""Bland post-call webhook ingest, and the after-the-fact reconstruction the hosted adapters share.

Bland reports a call once, after it ended, as a list of ``transcripts`` (``user``/``assistant`` lines with
times). Nothing in it says what was interrupted or what the user heard, so a reconstructed session is
marked as such (``session.started.metadata.reconstructed = true``) and every assistant line is taken as
fully heard. Event ids are derived from the call id and the line's position, so a webhook that is
delivered twice appends nothing the second time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from calltape.errors import InvalidEvent
from calltape.events import Event, make_event, parse_time

__all__ = [
    "BlandPostCall",
    "BlandTranscript",
    "Turn",
    "bland_events",
    "reconstruct",
    "verify_bland_signature",
]


@dataclass(frozen=True, slots=True)
class Turn:
    """One line of an after-the-fact transcript, platform-neutral."""

    role: Literal["user", "assistant", "tool_call", "tool_result", "note"]
    text: str = ""
    at_ms: int | None = None
    call: str | None = None
    name: str | None = None
    arguments: Any = None
    output: Any = None
    error: bool = False
    note: str | None = None  # role "note": the extension event type suffix


def reconstruct(
    session: str,
    turns: Iterable[Turn],
    *,
    source: str,
    agent: str = "agent",
    instructions: str | None = None,
    started_at_ms: int | None = None,
    ended_at_ms: int | None = None,
    end_reason: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    with_start: bool = True,
) -> list[Event]:
    """The events of a whole call rebuilt from its transcript, with stable ids (``{source}:{session}:{n}``).

    Replies are split where the platform split them: an assistant line after a tool result, or after the
    user spoke, begins a new reply; tool calls join the reply they followed.
    """
    events: list[Event] = []
    turns = list(turns)
    times = [t.at_ms for t in turns if t.at_ms is not None]
    clock = [started_at_ms if started_at_ms is not None else (min(times) if times else None)]

    def add(kind: str, data: Mapping[str, Any], at: int | None = None) -> None:
        if at is not None and (clock[0] is None or at > clock[0]):
            clock[0] = at
        events.append(
            make_event(session, kind, data, id=f"{source}:{session}:{len(events) + 1}", at_ms=clock[0], agent=agent)
        )

    if with_start:
        meta = {**(metadata or {}), "reconstructed": True, "source": source}
        start: dict[str, Any] = {"agent": agent, "framework": source.split(".")[0], "metadata": meta}
        if instructions:
            start["instructions"] = instructions
        add("session.started", start, started_at_ms)

    reply: dict[str, Any] | None = None  # {"id", "text", "calls", "closed_by_result"}
    replies = 0

    def close(at: int | None) -> None:
        nonlocal reply
        if reply is None:
            return
        rid = reply["id"]
        add("agent.reply.done", {"reply": rid}, at)
        if reply["text"]:
            add("agent.speech.started", {"reply": rid}, at)
            add("agent.speech.ended", {"reply": rid, "interrupted": False}, at)
        reply = None

    def open_reply(at: int | None) -> dict[str, Any]:
        nonlocal reply, replies
        close(at)
        replies += 1
        reply = {"id": f"{source}:{session}:r{replies}", "text": False, "calls": 0, "after_result": False}
        add("agent.reply.started", {"reply": reply["id"]}, at)
        return reply

    for t in turns:
        if t.role == "user":
            close(t.at_ms)
            if t.text.strip():
                add("user.transcript", {"text": t.text.strip(), "final": True}, t.at_ms)
        elif t.role == "assistant":
            if not t.text.strip():
                continue
            r = reply if reply is not None and not reply["calls"] and not reply["after_result"] else None
            r = r or open_reply(t.at_ms)
            add("agent.text", {"reply": r["id"], "text": (" " if r["text"] else "") + t.text.strip()}, t.at_ms)
            r["text"] = True
        elif t.role == "tool_call" and t.call:
            r = reply if reply is not None and not reply["after_result"] else None
            r = r or open_reply(t.at_ms)
            args = t.arguments if t.arguments is not None else {}
            add("tool.call", {"call": t.call, "name": t.name or "tool", "arguments": args, "reply": r["id"]}, t.at_ms)
            r["calls"] += 1
        elif t.role == "tool_result" and t.call:
            data: dict[str, Any] = {"call": t.call, "output": t.output}
            if t.error:
                data["error"] = True
            add("tool.result", data, t.at_ms)
            if reply is not None:
                reply["after_result"] = True
        elif t.role == "note" and t.note:
            add(f"x.{source.split('.')[0]}.{t.note}", {"text": t.text}, t.at_ms)
    close(ended_at_ms)
    if ended_at_ms is not None or end_reason is not None:
        add("session.ended", {"reason": end_reason} if end_reason else {}, ended_at_ms)
    return events


# ---------------------------------------------------------------------------------------------
# Bland's payload (Bland publishes no Python SDK types; fields as documented for post-call webhooks).


class BlandTranscript(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: int | str | None = None
    created_at: str | None = None
    text: str = ""
    user: str


class BlandPostCall(BaseModel):
    """The post-call webhook body (and ``GET /v1/calls/{id}``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    call_id: str = Field(min_length=1)
    transcripts: list[BlandTranscript] = Field(default_factory=list)
    created_at: str | None = None
    started_at: str | None = None
    end_at: str | None = None
    completed: bool | None = None
    inbound: bool | None = None
    to: str | None = None
    from_: str | None = Field(default=None, alias="from")
    call_length: float | None = None
    status: str | None = None
    summary: str | None = None
    error_message: str | None = None
    call_ended_by: str | None = None
    pathway_id: str | None = None
    metadata: dict[str, Any] | None = None
    variables: dict[str, Any] | None = None


def _time(value: str | None) -> int | None:
    if not value:
        return None
    try:
        return parse_time(value.replace(" ", "T", 1) if "T" not in value else value)
    except InvalidEvent:
        return None


def parse_bland(body: Mapping[str, Any]) -> BlandPostCall:
    try:
        return BlandPostCall.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InvalidEvent(f"Bland post-call webhook: '{where}': {err['msg'].lower()}") from None


_BLAND_ROLES = {"user": "user", "assistant": "assistant"}


def bland_events(body: Mapping[str, Any] | BlandPostCall, *, session: str | None = None) -> list[Event]:
    """A Bland post-call webhook as a reconstructed calltape session (session id: the call id)."""
    call = body if isinstance(body, BlandPostCall) else parse_bland(body)
    turns: list[Turn] = []
    for line in call.transcripts:
        role = _BLAND_ROLES.get(line.user)
        at = _time(line.created_at)
        if role == "user":
            turns.append(Turn("user", line.text, at))
        elif role == "assistant":
            turns.append(Turn("assistant", line.text, at))
        else:  # "agent-action", "robot": kept in the log, outside the context
            turns.append(Turn("note", line.text, at, note=line.user.replace("-", "_")))
    meta: dict[str, Any] = {"call_id": call.call_id}
    for key in ("to", "from_", "inbound", "call_length", "status", "summary", "pathway_id"):
        value = getattr(call, key)
        if value is not None:
            meta[key.rstrip("_")] = value
    if call.metadata:
        meta["bland_metadata"] = call.metadata
    return reconstruct(
        session or call.call_id,
        turns,
        source="bland.post_call",
        started_at_ms=_time(call.started_at) or _time(call.created_at),
        ended_at_ms=_time(call.end_at),
        end_reason=call.call_ended_by or call.error_message or ("completed" if call.completed else None),
        metadata=meta,
    )


def verify_bland_signature(body: bytes, secret: str, signature: str | None) -> bool:
    """``X-Webhook-Signature``: hex HMAC-SHA256 of the raw body with the account's signing secret."""
    if not signature:
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature.strip().lower())
