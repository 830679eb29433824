"""What the timeline picture shows: items on lanes of one time axis, read from the call's read model.

The read model (:class:`calltape.projections.callrecord.CallRecord`, over the context fold) is the
only authority on replies and calls: every state drawn (interrupted or not, heard text, call outcome,
included or not, when a playout was cut) is read from it, so the picture can never tell a different
story than ``calltape context``, ``calltape show`` or ``calltape check`` (whose findings it reads from
the same record). The events only give the times of the marks and the details shown on hover or click.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from calltape.checks import check_facts
from calltape.events import Event
from calltape.projections.callrecord import CallRecord
from calltape.runtime.latency import session_latencies

LANES: Final[tuple[tuple[str, str], ...]] = (
    ("call", "call"),
    ("vad", "user speech"),
    ("transcript", "user transcripts"),
    ("reply", "agent replies"),
    ("tool", "tools"),
    ("effect", "effects"),
    ("interruption", "interruptions"),
    ("finding", "check findings"),
)
"""Lane id and caption, top to bottom."""


@dataclass(slots=True)
class Item:
    """One thing drawn: a span (``end_ms`` set) or a marker at one instant (``end_ms`` None)."""

    lane: str
    kind: str
    """The CSS class hint: ``final``, ``interim``, ``typed``, ``speech``, ``reply``, ``tool``,
    ``interruption``, ``ignored``, ``cut``, ``started``, ``ended``, ``dropped``, ``resumed``,
    ``handoff``, ``instructions``, ``redacted``, ``effect``, ``finding``."""
    start_ms: int
    """Offset from the session's first event."""
    end_ms: int | None
    label: str
    title: str
    """One-line summary (tooltip and the details' heading)."""
    seqs: list[int]
    """The events the item stands for (shown in the details)."""
    status: str = ""
    """Replies: ``heard``, ``interrupted``, ``unheard``; tools: the call's status, or ``excluded``;
    effects: their latest phase (``started``, ``done``, ``failed``, ``unknown``)."""
    heard: str = ""
    unheard: str = ""
    """Replies: generated text the user never heard."""
    open: bool = False
    """Still running at the last event (the span runs to the end of the picture)."""


@dataclass(slots=True)
class Picture:
    """A session's timeline picture, ready to render."""

    session: str
    first_at_ms: int
    duration_ms: int
    items: list[Item]
    dropped: list[tuple[int, int]]
    """Periods (offsets) from a drop to its resume, or to the end."""
    events: dict[int, dict[str, Any]]
    """Wire-format events by seq, those the items refer to."""
    header: dict[str, Any] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)
    """The call's voice latency figures (``calltape stats``'s ``latency_ms``)."""
    findings: list[dict[str, Any]] = field(default_factory=list)
    """The call's ``calltape check`` findings (``{"session", "seq", "rule", "message"}``)."""


@dataclass(slots=True)
class _Effect:
    """One run of an effect ``(name, key)``: from its ``started`` to the phase that settled it."""

    item: Item
    data: dict[str, Any]


def _effect_title(data: dict[str, Any], phase: str) -> str:
    title = f"effect {data.get('name')} {data.get('key')!r} [{data.get('call')}] → {phase}"
    if data.get("heard") is True:
        title += " · heard first"
    return title


def _on_effect(
    effects: dict[tuple[str, str], _Effect], items: list[Item], data: dict[str, Any], at: int, seq: int
) -> None:
    """``tool.effect``: a ``started`` opens a span on the effects lane, the next phase of the same
    ``(name, key)`` closes it with its outcome; a phase with nothing open (a reconcile's verdict after
    ``unknown``) is a marker."""
    key = (str(data.get("name")), str(data.get("key")))
    phase = str(data.get("phase"))
    label = f"{key[0]} {key[1]}"
    if phase == "started":
        item = Item("effect", "effect", at, at, f"{label} → started", _effect_title(data, "started"), [seq], "started")
        item.open = True
        items.append(item)
        effects[key] = _Effect(item, data)
        return
    running = effects.pop(key, None)
    if running is None:
        items.append(Item("effect", "effect", at, None, f"{label} → {phase}", _effect_title(data, phase), [seq], phase))
        return
    item = running.item
    item.end_ms, item.open, item.status = at, False, phase
    item.label = f"{label} → {phase} · {_ms(at - item.start_ms)}"
    item.title = _effect_title(running.data, phase) + f" in {_ms(at - item.start_ms)}"
    item.seqs.append(seq)


_AFTER_THE_FACT = frozenset({"session.redacted"})
"""Events an operator adds to a call after it (``calltape redact``): they do not stretch its time axis."""


def build_picture(events: list[Event], header: dict[str, Any] | None = None) -> Picture:
    """Reads ``events`` (one session, in seq order) into the items of its picture."""
    session = events[0].session if events else ""
    record = CallRecord(session or None)
    first = events[0].at_ms if events else 0
    items: list[Item] = []
    dropped: list[tuple[int, int]] = []
    drop_at: int | None = None
    speech_at: tuple[int, int] | None = None  # (offset, seq) of the open user.speech.started
    effects: dict[tuple[str, str], _Effect] = {}
    used: set[int] = set()

    def mark(lane: str, kind: str, at: int, label: str, title: str, seq: int) -> None:
        items.append(Item(lane, kind, at, None, label, title, [seq]))

    def close_speech(at: int, seq: int | None, open_: bool = False) -> None:
        nonlocal speech_at
        if speech_at is None:
            return
        start, first_seq = speech_at
        seqs = [first_seq] if seq is None else [first_seq, seq]
        title = "user speaking (VAD)" + (" · still speaking at the last event" if open_ else "")
        items.append(Item("vad", "speech", start, at, "", title, seqs, open=open_))
        speech_at = None

    last = 0  # the call's own latest instant
    for event in events:
        seq = event.seq or 0
        at = event.at_ms - first
        if event.type in _AFTER_THE_FACT:
            at = last  # stamped when the operator acted, maybe months later: drawn where the call was
        else:
            last = max(last, at)
        data = event.data
        kind = event.type
        applied = record.apply(event)
        if applied.cut is not None and kind == "agent.speech.ended":
            mark("interruption", "cut", at, "playout cut", f"playout of reply {applied.cut} cut", seq)
        if kind == "tool.effect":
            _on_effect(effects, items, data, at, seq)
        elif kind == "interruption":
            cause = data.get("cause") or "user_speech"
            if applied.ignored:
                title = f"interruption ({cause}) with no effect: nothing was playing, generating or running"
                mark("interruption", "ignored", at, "", title, seq)
            else:
                heard = f" · heard {data['heard']!r}" if isinstance(data.get("heard"), str) else ""
                mark("interruption", "interruption", at, "✂ barge-in", f"barge-in ({cause}){heard}", seq)
        elif kind == "user.speech.started":
            close_speech(at, None)
            speech_at = (at, seq)
        elif kind == "user.speech.stopped":
            close_speech(at, seq)
        elif kind == "user.transcript":
            text = str(data.get("text", "")).strip()
            if data.get("final"):
                mark("transcript", "final", at, text, f"user (final transcript): {text}", seq)
            else:
                mark("vad", "interim", at, "", f"interim transcript: {text}", seq)
        elif kind == "user.text":
            text = str(data.get("text", "")).strip()
            mark("transcript", "typed", at, text, f"user (typed): {text}", seq)
        elif kind in _CALL_MARKS:
            label, title = _CALL_MARKS[kind](data)
            mark("call", kind.rsplit(".", 1)[-1], at, label, title, seq)
            if kind == "session.dropped" and drop_at is None:
                drop_at = at
                close_speech(at, None)
            elif kind == "session.resumed":
                if drop_at is not None:
                    dropped.append((drop_at, at))
                drop_at = None
                close_speech(at, None)
    end = last
    close_speech(end, None, open_=True)
    for running in effects.values():  # still running at the last event
        running.item.end_ms = max(end, running.item.start_ms)
    if drop_at is not None:
        dropped.append((drop_at, end))
    record.settle()
    items.extend(_reply_items(record, first, end))
    items.extend(_call_items(record, first, end))
    offsets = {e.seq or 0: min(e.at_ms - first, end) for e in events}
    findings = check_facts(record) if events else []
    for found in findings:
        at = offsets.get(found.seq, end)
        items.append(Item("finding", "finding", at, None, found.rule, f"{found.rule}: {found.message}", [found.seq]))
    items.sort(key=lambda i: (i.start_ms, i.seqs[0]))
    for item in items:
        used.update(item.seqs)
    wire = {e.seq or 0: e.to_wire() for e in events if (e.seq or 0) in used}
    return Picture(
        session,
        first,
        end,
        items,
        dropped,
        wire,
        dict(header or {}),
        session_latencies(events).summary(),
        [f.to_json() for f in findings],
    )


def _session_started(data: dict[str, Any]) -> tuple[str, str]:
    title = f"call started · agent {data.get('agent')} · {data.get('modality', 'voice')}"
    if data.get("framework"):
        title += f" · {data['framework']}"
    return "start", title


def _reason(data: dict[str, Any]) -> str:
    return f" ({data['reason']})" if data.get("reason") else ""


_CALL_MARKS: Final[dict[str, Callable[[dict[str, Any]], tuple[str, str]]]] = {
    "session.started": _session_started,
    "session.ended": lambda d: ("end", f"call ended{_reason(d)}"),
    "session.dropped": lambda d: ("dropped", f"call dropped{_reason(d)}"),
    "session.resumed": lambda d: (
        f"resumed · {d.get('agent')}",
        f"resumed by {d.get('agent')} · epoch {d.get('epoch')} · from seq {d.get('from_seq')}",
    ),
    "agent.handoff": lambda d: (f"handoff → {d.get('to')}", f"handoff {d.get('from')} → {d.get('to')}{_reason(d)}"),
    "agent.instructions": lambda d: ("instructions", f"instructions changed: {d.get('text')}"),
    "session.redacted": lambda d: (
        "redacted",
        f"redacted {d.get('spans')} span(s): {', '.join(map(str, d.get('kinds') or []))}",
    ),
}
"""Call-lane markers: event type -> (label, title) from its data."""


def _offset(at_ms: int | None, first: int) -> int | None:
    return None if at_ms is None else at_ms - first


def _reply_items(record: CallRecord, first: int, end: int) -> list[Item]:
    """One span per reply with events of its own, from its first event to where its playout stopped."""
    out = []
    open_ids = {r.reply for r in record.fold.open_replies()}
    for span in record.replies.values():
        state = record.reply_state(span.reply)
        if state is None or span.own_at_ms is None or span.end_at_ms is None:
            continue
        start = span.own_at_ms - first
        generated, heard = state.generated, state.heard
        unheard = generated[len(heard) :] if generated.startswith(heard) else ("" if heard else generated)
        if state.interrupted:
            status = "unheard" if not heard.strip() else "interrupted"
        else:
            status = "heard"
        stop = _offset(
            span.speech_ended_at_ms if span.speech_ended_at_ms is not None else span.interrupted_at_ms, first
        )
        is_open = span.reply in open_ids
        span_end = end if is_open else (stop if stop is not None else span.end_at_ms - first)
        title = f"reply {span.reply}"
        if state.interrupted:
            title += " · interrupted"
        title += f" · heard: {heard!r}" if heard else " · nothing heard"
        if unheard:
            title += f" · generated but not heard: {unheard!r}"
        if span.late_text_seqs:
            title += f" · {len(span.late_text_seqs)} late token(s) after the interruption ignored"
        if is_open:
            title += " · still " + ("generating" if state.generating else "waiting for playout")
        label = heard if heard or unheard else "(no text)"
        out.append(
            Item(
                "reply", "reply", start, max(span_end, start), label, title, span.seqs, status, heard, unheard, is_open
            )
        )
    return out


def _call_items(record: CallRecord, first: int, end: int) -> list[Item]:
    """One span per tool call, from the call to its first settling event (or the end, or its reply's cut)."""
    out = []
    for state in record.tool_states():
        call = record.calls.get(state.call_id)
        if call is None:
            continue
        call_at = call.at_ms - first
        status = state.status if state.included else "excluded"
        reply = record.replies.get(state.reply)
        interrupted_at = _offset(reply.interrupted_at_ms, first) if reply is not None else None
        end_at = _offset(call.end_at_ms, first)
        took = call.duration_ms()
        is_open = state.status == "in_progress"
        if end_at is not None:
            stop = end_at
        elif is_open:
            stop = end
        else:  # settled by the fold with no event of its own: cancelled with its reply
            stop = max(interrupted_at or call_at, call_at)
        title = f"{state.name}({state.arguments}) [{state.call_id}] → {state.status}"
        if took is not None:
            title += f" in {_ms(took)}"
        if call.started_at_ms is None and state.status != "completed":
            title += " · never started"
        if not state.included:
            title += " · not in the context: its reply was interrupted before it started"
        label = f"{state.name} → {state.status}" if state.included else f"{state.name} · not in the context"
        if took is not None:
            label += f" · {_ms(took)}"
        if state.status in ("completed", "error") and interrupted_at is not None and end_at is not None:
            if end_at >= interrupted_at:
                title += " · the result arrived after the barge-in (kept in the context)"
        out.append(Item("tool", "tool", call_at, stop, label, title, call.seqs, status, open=is_open))
    return out


def _ms(ms: int) -> str:
    return f"{ms}ms" if ms < 1000 else f"{ms / 1000:.1f}s"
