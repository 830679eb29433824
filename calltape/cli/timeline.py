"""``calltape show``: a session's timeline, readable at a glance.

Two lanes, user and agent (session events -- start, drop, resume, handoff, end -- ride in the agent
lane, styled). A reply is one row at its start: the text generated and, when it differs, the text
the user actually heard; interruptions, tool calls with their duration and outcome, results that
land late (after their reply was interrupted, or after the user spoke again) each get a row.
The last column marks the rows after which the state is *clean* (a resume would start there).

The projection is the only authority on what the context holds: the timeline folds the events with
:class:`calltape.projections.ContextFold` as it goes and reads reply and call states from it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from calltape.cli.common import (
    clock,
    compact_json,
    duration,
    note,
    offset,
    opened_store,
    out,
    require_session,
    run,
    shorten,
    within,
    write_json,
)
from calltape.errors import CliError

if TYPE_CHECKING:
    from calltape.events import Event
    from calltape.eventstore import SessionInfo
    from calltape.projections import ContextFold
    from calltape.projections.callrecord import CallRecord, ToolCallSpan


@dataclass(slots=True)
class Row:
    """One line of ``calltape show``: an event's seq, time and styled segments."""

    seq: int
    at_ms: int
    lane: str  # "user" | "agent" | "session"
    kind: str
    segments: list[tuple[str, str]] = field(default_factory=list)
    clean: bool = False
    reply: str | None = None
    call: str | None = None

    def add(self, text: str, style: str = "") -> Row:
        """Appends a styled segment; returns the row for chaining."""
        self.segments.append((text, style))
        return self

    @property
    def text(self) -> str:
        """The row's plain text (no styles), for tests and piped output."""
        return "".join(t for t, _ in self.segments)


@dataclass(slots=True)
class ReplyView:
    """What ``show`` knows of one agent reply: its text, how much was heard, how it ended."""

    reply: str
    row: Row
    generated: str = ""
    late_tokens: int = 0
    interrupted_seq: int | None = None
    heard: str = ""
    interrupted: bool = False


@dataclass(slots=True)
class Timeline:
    """The rows of ``calltape show`` with the replies and calls they refer to."""

    rows: list[Row]
    replies: dict[str, ReplyView]
    calls: dict[str, ToolCallSpan]
    record: CallRecord
    first_at: int
    last_at: int

    @property
    def fold(self) -> ContextFold:
        """The context fold the rows were read from."""
        return self.record.fold


def late_text(call: ToolCallSpan) -> str | None:
    """Why a result is LATE, in words (None: it is not)."""
    if call.late is None:
        return None
    why, seq = call.late
    return f"after the barge-in at seq {seq}" if why == "barge-in" else f"after the user spoke again (seq {seq})"


def owner_of(call: ToolCallSpan) -> str | None:
    """The reply that carried a call, None for the fold's anonymous one."""
    return call.reply if call.reply is not None and not call.reply.startswith("\x00") else None


def build_timeline(events: list[Event], verbose: bool = False) -> Timeline:
    """Reads a session's events into the rows ``calltape show`` prints.

    What each event did -- the reply an interruption cut or left alone, a result that came late --
    is read from the call's :class:`~calltape.projections.callrecord.CallRecord`; this function only
    decides which events get a row and what the row says."""
    from calltape.projections.callrecord import CallRecord

    record = CallRecord(events[0].session if events else None)
    fold = record.fold
    rows: list[Row] = []
    replies: dict[str, ReplyView] = {}
    first_at = events[0].at_ms if events else 0

    def row(event: Event, lane: str, kind: str) -> Row:
        r = Row(event.seq or 0, event.at_ms, lane, kind)
        rows.append(r)
        return r

    for event in events:
        applied = record.apply(event)
        data = event.data
        kind = event.type
        if kind in _SESSION_ROWS:
            _SESSION_ROWS[kind](row(event, "session", kind), data)
        elif kind.startswith("user."):
            _user_row(row, event, verbose)
        elif kind in ("agent.reply.started", "agent.text", "agent.reply.done"):
            rid = str(data.get("reply"))
            if rid not in replies:
                replies[rid] = ReplyView(rid, row(event, "agent", "reply"))
                replies[rid].row.reply = rid
            elif verbose and kind != "agent.reply.started":
                detail = f"· {kind.removeprefix('agent.')}"
                if kind == "agent.text":
                    detail += f" {data.get('text')!r}"
                row(event, "agent", kind).add(detail, "dim")
        elif kind in ("agent.speech.started", "agent.speech.progress"):
            if verbose:
                text = "▷ playout starts" if kind == "agent.speech.started" else f"▷ heard so far {data.get('heard')!r}"
                row(event, "agent", kind).add(text, "dim")
        elif kind == "agent.speech.ended":
            if data.get("interrupted") or verbose:
                r = row(event, "agent", kind)
                r.reply = str(data.get("reply"))
                if data.get("interrupted"):
                    r.add("⏹ playout cut", "yellow")
                else:
                    r.add("▷ playout ends", "dim")
                if data.get("heard") is not None:
                    r.add(f" · heard {shorten(str(data['heard']), 60)!r}", "dim")
        elif kind == "interruption":
            r = row(event, "agent", kind)
            r.reply = applied.target
            cause = data.get("cause") or "user_speech"
            if applied.ignored:
                r.add(f"✂ interruption ({cause})", "dim").add(" · no effect: nothing was playing or generating", "dim")
            else:
                r.add(f"✂ barge-in ({cause})", "bold yellow")
                state = fold.reply_state(applied.cut) if applied.cut in replies else None
                if state is not None:
                    r.add(f" · heard {shorten(state.heard, 60)!r}", "yellow")
        elif kind.startswith("tool."):
            _tool_row(row, event, record.calls.get(str(data.get("call"))), verbose)
        elif verbose:
            row(event, "session", kind).add(f"{kind}", "dim")
        if rows:
            rows[-1].clean = fold.clean

    # Settle what only the end knows: heard text, interruptions, call outcomes.
    record.settle()
    for rid, view in replies.items():
        span = record.replies.get(rid)
        state = fold.reply_state(rid)
        if span is not None:
            view.interrupted_seq, view.late_tokens = span.interrupted_seq, len(span.late_text_seqs)
        if state is not None:
            view.interrupted, view.heard, view.generated = state.interrupted, state.heard, state.generated
    for r in rows:
        _render_row(r, replies, record.calls)
    last_at = events[-1].at_ms if events else first_at
    return Timeline(rows, replies, record.calls, record, first_at, last_at)


def _reason(data: dict[str, Any], style: str = "") -> tuple[str, str]:
    return (f" ({data['reason']})" if data.get("reason") else "", style)


def _started_row(r: Row, data: dict[str, Any]) -> None:
    r.add("● call started", "bold").add(f" · agent {data.get('agent')} · {data.get('modality', 'voice')}")
    if data.get("tenant"):
        r.add(f" · tenant {data['tenant']}")
    if data.get("framework"):
        r.add(f" · {data['framework']}")


def _handoff_row(r: Row, data: dict[str, Any]) -> None:
    r.add("⇢ handoff", "bold magenta").add(f" {data.get('from')} → {data.get('to')}", "magenta")
    if data.get("reason"):
        r.add(f" ({data['reason']})", "magenta")


_SESSION_ROWS: dict[str, Callable[[Row, dict[str, Any]], Any]] = {
    "session.started": _started_row,
    "session.ended": lambda r, d: r.add("■ call ended", "bold").add(*_reason(d)),
    "session.dropped": lambda r, d: r.add("✖ call dropped", "bold red").add(*_reason(d, "red")),
    "session.resumed": lambda r, d: r.add("↻ resumed", "bold green").add(
        f" by {d.get('agent')} · epoch {d.get('epoch')} · from seq {d.get('from_seq')}", "green"
    ),
    "agent.handoff": _handoff_row,
    "agent.instructions": lambda r, d: r.add("✎ instructions: ", "magenta").add(
        repr(shorten(str(d.get("text", "")), 60)), "dim"
    ),
}
"""The session lane's rows: event type -> what its row says."""


def _user_row(row: Callable[[Event, str, str], Row], event: Event, verbose: bool) -> None:
    data, kind = event.data, event.type
    if kind == "user.speech.started":
        row(event, "user", kind).add("🎙 starts speaking", "dim")
    elif kind == "user.speech.stopped":
        if verbose:
            row(event, "user", kind).add("🎙 stops speaking", "dim")
    elif kind == "user.transcript":
        if data.get("final"):
            row(event, "user", kind).add(repr(str(data.get("text", "")).strip()), "bold cyan")
        elif verbose:
            row(event, "user", kind).add(f"… {str(data.get('text', '')).strip()}", "italic dim")
    elif kind == "user.text":
        row(event, "user", kind).add(repr(str(data.get("text", "")).strip()), "bold cyan").add(" (typed)", "dim")
    elif verbose:
        row(event, "session", kind).add(f"{kind}", "dim")


def _tool_row(row: Callable[[Event, str, str], Row], event: Event, call: ToolCallSpan | None, verbose: bool) -> None:
    data, kind = event.data, event.type
    if kind in ("tool.call", "tool.result", "tool.cancelled"):
        row(event, "agent", kind).call = str(data.get("call"))
    elif kind == "tool.effect":
        _effect_row(row(event, "agent", kind), data)
    elif call is None:
        return
    elif kind == "tool.started":
        if verbose:
            row(event, "agent", kind).add(f"  ⚙ {call.name} [{call.call}] starts", "dim")
    elif kind == "tool.progress":
        message = data.get("message") or compact_json(data.get("state"), 50)
        row(event, "agent", kind).add(f"  ⚙ {call.name} [{call.call}] … {message}", "dim")
    elif verbose:
        row(event, "session", kind).add(f"{kind}", "dim")


_STATUS_STYLE = {
    "completed": "green",
    "error": "red",
    "timeout": "red",
    "unknown": "bold red",
    "cancelled": "yellow",
    "in_progress": "blue",
}


_EFFECT_STYLE = {"started": "blue", "done": "green", "failed": "red", "unknown": "bold red"}


def _effect_row(r: Row, data: dict[str, Any]) -> None:
    """One phase of a real-world action (SPEC section 8): always shown, it is what the caller pays for."""
    r.call = str(data.get("call"))
    phase = str(data.get("phase"))
    r.add("  ★ effect ", "bold").add(f"{data.get('name')} {data.get('key')!r}", "bold").add(" → ", "")
    r.add(phase, _EFFECT_STYLE.get(phase, ""))
    r.add(f" [{r.call}]", "dim")
    if data.get("heard") is True:
        r.add(" · heard first", "dim")
    if phase == "done" and "output" in data:
        r.add(f": {compact_json(data['output'], 60)}", "")


def _render_row(r: Row, replies: dict[str, ReplyView], calls: dict[str, ToolCallSpan]) -> None:
    if r.kind == "reply" and r.reply in replies:
        view = replies[r.reply]
        generated = view.generated
        r.add("◆ ", "bold")
        if generated:
            r.add(repr(shorten(generated, 90)), "bold")
        else:
            r.add("(no text)", "dim")
        if view.interrupted:
            r.add("  ✂ interrupted", "yellow")
        if view.heard != generated:
            heard = repr(shorten(view.heard, 90)) if view.heard.strip() else "nothing"
            r.add("\n  heard: ", "yellow").add(heard, "yellow")
        if view.late_tokens:
            r.add(f"\n  {view.late_tokens} late token(s) after the barge-in ignored", "dim")
    elif r.kind == "tool.call" and r.call in calls:
        cv = calls[r.call]
        r.add("⚙ call ", "bold").add(f"{cv.name}({compact_json(cv.arguments, 60)})", "bold").add(f" [{cv.call}]", "dim")
        if not cv.included:
            r.add("\n  not in the context: its reply was interrupted before it started", "dim")
    elif r.kind in ("tool.result", "tool.cancelled") and r.call in calls:
        cv = calls[r.call]
        r.add(f"⚙ {cv.name} [{cv.call}] → ", "").add(cv.status, _STATUS_STYLE.get(cv.status, ""))
        took = cv.duration_ms()
        if took is not None:
            r.add(f" in {duration(took)}", "dim")
        if cv.status in ("completed", "error"):
            r.add(f": {compact_json(cv.output, 60)}", "")
        elif isinstance(cv.output, dict) and cv.output.get("reason"):
            r.add(f" ({cv.output['reason']})", "dim")
        late = late_text(cv)
        if late:
            r.add("  LATE", "bold magenta").add(f" {late}", "magenta")
    elif r.kind in ("tool.result", "tool.cancelled"):
        r.add(f"⚙ {r.kind} for unknown call [{r.call}]", "dim")


def _summary(tl: Timeline) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for cv in tl.calls.values():
        if cv.included:
            statuses[cv.status] = statuses.get(cv.status, 0) + 1
    kinds = [r.kind for r in tl.rows]
    return {
        "user_turns": sum(1 for i in tl.fold.native()["items"] if i.get("role") == "user"),
        "replies": len(tl.replies),
        "interrupted_replies": sum(1 for v in tl.replies.values() if v.interrupted),
        "tool_calls": len(tl.calls),
        "tool_outcomes": statuses,
        "late_results": sum(1 for c in tl.calls.values() if c.late is not None),
        "drops": kinds.count("session.dropped"),
        "resumes": kinds.count("session.resumed"),
        "handoffs": kinds.count("agent.handoff"),
        "clean": tl.fold.clean,
        "last_clean_seq": tl.fold.last_clean_seq,
    }


def _n(count: int, noun: str) -> str:
    if count == 1:
        return f"1 {noun}"
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{count} {plural}"


def _summary_line(summary: dict[str, Any]) -> str:
    parts = [_n(summary["user_turns"], "user turn"), _n(summary["replies"], "reply")]
    if summary["interrupted_replies"]:
        parts[-1] += f" ({summary['interrupted_replies']} interrupted)"
    if summary["tool_calls"]:
        outcomes = ", ".join(f"{n} {s}" for s, n in sorted(summary["tool_outcomes"].items()))
        parts.append(f"{_n(summary['tool_calls'], 'tool call')} ({outcomes})")
    for key, noun in (
        ("late_results", "late result"),
        ("drops", "drop"),
        ("resumes", "resume"),
        ("handoffs", "handoff"),
    ):
        if summary[key]:
            parts.append(_n(summary[key], noun))
    state = "clean" if summary["clean"] else f"not clean; last clean point: seq {summary['last_clean_seq']}"
    parts.append(state)
    return " · ".join(parts)


def show(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(metavar="SESSION", help="The session (call) id.")],
    to: Annotated[int | None, typer.Option("--to", metavar="N", min=1, help="Show only up to seq N.")] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also show interims, deltas, playout and VAD details.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the timeline as JSON.")] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            metavar="FILE",
            help="Write the timeline picture as one self-contained HTML page to FILE (- for stdout).",
        ),
    ] = None,
) -> None:
    """Show a session as a timeline: user and agent lanes, heard vs generated text, tools, barge-ins.

    ✓ marks the rows after which the call is clean (nothing generating, unheard, running or
    half-said): a resume would restart from the last of them. LATE marks a tool result that
    arrived after its reply was interrupted or after the user spoke again.
    """

    async def load() -> tuple[SessionInfo, list[Event]]:
        async with opened_store(ctx) as store:
            info = await require_session(store, session)
            if to is not None:
                within(info, to, "--to")
            return info, await store.read(session, to_seq=to)

    if html is not None and json_out:
        raise CliError("--html and --json cannot be used together; choose one.")
    info, events = run(load())
    if html is not None:
        from calltape.picture import timeline_html

        _write_html(html, timeline_html(events, info))
        return
    tl = build_timeline(events, verbose=verbose)
    summary = _summary(tl)
    if json_out:
        from calltape.cli.inspect import _session_json
        from calltape.events import format_time

        write_json(
            {
                "session": _session_json(info),
                "rows": [
                    {
                        "seq": r.seq,
                        "at": format_time(r.at_ms),
                        "offset_ms": r.at_ms - tl.first_at,
                        "lane": r.lane,
                        "kind": r.kind,
                        "text": r.text,
                        "clean": r.clean,
                        **({"reply": r.reply} if r.reply else {}),
                        **({"call": r.call} if r.call else {}),
                    }
                    for r in tl.rows
                ],
                "replies": [
                    {
                        "reply": v.reply,
                        "generated": v.generated,
                        "heard": v.heard,
                        "interrupted": v.interrupted,
                        "late_tokens": v.late_tokens,
                    }
                    for v in tl.replies.values()
                ],
                "tools": [
                    {
                        "call_id": c.call,
                        "name": c.name,
                        "reply": owner_of(c),
                        "status": c.status,
                        "included": c.included,
                        "duration_ms": c.duration_ms(),
                        "late": late_text(c),
                        "output": c.output,
                    }
                    for c in tl.calls.values()
                ],
                "summary": summary,
            }
        )
        return
    _print(info, tl, summary, to)


def _write_html(path: Path, page: str) -> None:
    """Writes the page whole or not at all (a temporary file renamed into place)."""
    if str(path) == "-":
        sys.stdout.write(page)
        sys.stdout.flush()
        return
    if path.is_dir():
        raise CliError(f"{path} is a directory; give a file name for the HTML page.")
    if not path.parent.is_dir():
        raise CliError(f"cannot write {path}: the directory {path.parent} does not exist.")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CliError(f"cannot write {path}: {exc.strerror or exc}.") from None
    note(f"Wrote the timeline picture to {path}.")


def _print(info: SessionInfo, tl: Timeline, summary: dict[str, Any], to: int | None) -> None:
    console = out()
    header = Text()
    header.append(info.session, "bold")
    header.append(f"  {info.status}", {"dropped": "bold red", "active": "green"}.get(info.status, "dim"))
    header.append(f" · agent {info.agent} · epoch {info.epoch} · {info.last_seq} events")
    if info.tenant:
        header.append(f" · tenant {info.tenant}")
    header.append(f"\nstarted {clock(info.first_at_ms)} UTC · lasted {duration(tl.last_at - tl.first_at)}", "dim")
    if to is not None:
        header.append(f" · shown up to seq {to}", "dim")
    table = Table(box=None, header_style="bold", pad_edge=False, expand=False)
    table.add_column("#", justify="right", style="dim", no_wrap=True)
    table.add_column("time", justify="right", style="dim", no_wrap=True)
    table.add_column("user", ratio=2, overflow="fold")
    table.add_column("agent", ratio=3, overflow="fold")
    table.add_column("✓", no_wrap=True, style="green")
    for r in tl.rows:
        text = Text()
        for segment, style in r.segments:
            text.append(segment, style)
        user, agent = (text, Text()) if r.lane == "user" else (Text(), text)
        table.add_row(str(r.seq), offset(r.at_ms - tl.first_at), user, agent, "✓" if r.clean else "")
    console.print(Panel(Group(header), expand=False, border_style="dim"))
    console.print(table)
    console.print(Text(_summary_line(summary), style="bold"))
