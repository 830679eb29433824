"""Rebuilding a session after the fact from a platform's transcript (Bland, Vapi, Retell reports).

Nothing in such a transcript says what was interrupted or what the user heard, so a reconstructed
session is marked as such (``session.started.metadata.reconstructed = true``) and every assistant line
is taken as fully heard. Event ids are derived from the call id and the line's position, so a report
delivered twice appends nothing the second time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from calltape.events import Event, make_event

__all__ = ["Turn", "reconstruct"]


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
