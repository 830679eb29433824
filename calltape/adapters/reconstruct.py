"""Rebuilding a session after the fact from a platform's transcript (Bland, Vapi, Retell reports).

A reconstructed session is marked as such (``session.started.metadata.reconstructed = true``). An
assistant line is taken as fully heard unless the platform says it was cut (``Turn.heard``: what the
user heard before the barge-in); nothing else is guessed: no VAD edges, no speech timing beyond the
lines' own times. Event ids are derived from the call id and the line's position, so a report
delivered twice appends nothing the second time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from calltape.adapters.replies import EventCollector, ReplyTracker
from calltape.events import Event

__all__ = ["RECONSTRUCTED", "Turn", "is_reconstructed", "json_or_text", "reconstruct"]

RECONSTRUCTED = "reconstructed"
"""The ``session.started.metadata`` key (value ``true``) of a session rebuilt from a report."""


def json_or_text(value: Any) -> Any:
    """A transcript's tool arguments or output: the JSON a string holds, else the string as it is
    (platforms report tool results as text, usually JSON)."""
    if not isinstance(value, str):
        return value
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return value


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
    started: bool = False
    """Role "tool_call": the platform says it ran the tool (a hosted platform executes its own tools),
    so the call gets ``tool.started`` at the same time: a resume then treats it as possibly done."""
    heard: str | None = None
    """Role "assistant": the line was interrupted and this is what the user heard of it (``text`` is
    what was generated); None: the platform does not say it was cut."""


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
    out = EventCollector(session, prefix=f"{source}:{session}:", agent=agent)
    replies = ReplyTracker(out)
    turns = list(turns)
    times = [t.at_ms for t in turns if t.at_ms is not None]
    out.at_ms = started_at_ms if started_at_ms is not None else (min(times) if times else None)

    def add(kind: str, data: Mapping[str, Any], at: int | None = None) -> None:
        tick(at)
        replies.emit(kind, data)

    def tick(at: int | None) -> None:
        if at is not None and (out.at_ms is None or at > out.at_ms):
            out.at_ms = at

    if with_start:
        meta = {**(metadata or {}), RECONSTRUCTED: True, "source": source}
        start: dict[str, Any] = {"agent": agent, "framework": source.split(".")[0], "metadata": meta}
        if instructions:
            start["instructions"] = instructions
        add("session.started", start, started_at_ms)

    # The open reply, and the transcript grammar around it: tool calls join the reply they followed;
    # an assistant line after a call, or after a tool result, begins a new reply.
    reply: str | None = None
    calls = 0
    after_result = False
    cut: str | None = None  # the open reply was interrupted: what the user heard of it

    def close(at: int | None) -> None:
        nonlocal reply, cut
        if reply is None:
            return
        tick(at)
        replies.done(reply)
        st = replies.state(reply)
        if cut is not None:  # the barge-in lands when the next line begins (the payload's own time)
            if cut:
                replies.speech_started(reply)
            replies.interrupt(reply, cause="user_speech", heard=cut)
            if cut:
                replies.speech_ended(reply, interrupted=True, heard=cut)
        elif st is not None and st.generated:  # every other line of such a transcript was heard in full
            replies.speech_started(reply)
            replies.speech_ended(reply)
        reply, cut = None, None

    def open_reply(at: int | None) -> str:
        nonlocal reply, calls, after_result
        close(at)
        tick(at)
        reply = replies.begin(f"{source}:{session}:r{replies.count() + 1}")
        calls, after_result = 0, False
        return reply

    for t in turns:
        if cut is not None:  # nothing more joins an interrupted reply
            close(t.at_ms)
        if t.role == "user":
            close(t.at_ms)
            if t.text.strip():
                add("user.transcript", {"text": t.text.strip(), "final": True}, t.at_ms)
        elif t.role == "assistant":
            if not t.text.strip() and t.heard is None:
                continue
            r = reply if reply is not None and not calls and not after_result else None
            r = r or open_reply(t.at_ms)
            st = replies.state(r)
            before = st.generated if st is not None else ""
            tick(t.at_ms)
            replies.text(r, (" " if before else "") + t.text.strip())
            if t.heard is not None:
                cut = " ".join(p for p in (before, t.heard.strip()) if p)
        elif t.role == "tool_call" and t.call:
            r = reply if reply is not None and not after_result else None
            r = r or open_reply(t.at_ms)
            args = t.arguments if t.arguments is not None else {}
            add("tool.call", {"call": t.call, "name": t.name or "tool", "arguments": args, "reply": r}, t.at_ms)
            if t.started:
                add("tool.started", {"call": t.call}, t.at_ms)
            calls += 1
        elif t.role == "tool_result" and t.call:
            data: dict[str, Any] = {"call": t.call, "output": t.output}
            if t.error:
                data["error"] = True
            add("tool.result", data, t.at_ms)
            if reply is not None:
                after_result = True
        elif t.role == "note" and t.note:
            add(f"x.{source.split('.')[0]}.{t.note}", {"text": t.text}, t.at_ms)
    close(ended_at_ms)
    if ended_at_ms is not None or end_reason is not None:
        add("session.ended", {"reason": end_reason} if end_reason else {}, ended_at_ms)
    return out.events


def is_reconstructed(started: Event | None) -> bool:
    """Whether a session's ``session.started`` marks it as rebuilt after the fact (the explicit record
    the receiver reads; never a guess from event ids)."""
    if started is None or started.type != "session.started":
        return False
    meta = started.data.get("metadata")
    return isinstance(meta, Mapping) and meta.get(RECONSTRUCTED) is True
