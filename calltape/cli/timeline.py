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
    generated: list[str] = field(default_factory=list)
    late_tokens: int = 0
    interrupted_seq: int | None = None
    heard: str = ""
    interrupted: bool = False


@dataclass(slots=True)
class CallView:
    """What ``show`` knows of one tool call: name, start, end and outcome."""

    call: str
    name: str
    arguments: str
    reply: str | None
    call_seq: int
    call_at: int
    started_at: int | None = None
    end_at: int | None = None
    status: str = "in_progress"
    included: bool = True
    output: Any = None
    late: str | None = None

    def duration_ms(self) -> int | None:
        """How long the tool ran, once it ended."""
        if self.end_at is None:
            return None
        return self.end_at - (self.started_at if self.started_at is not None else self.call_at)


@dataclass(slots=True)
class Timeline:
    """The rows of ``calltape show`` with the replies and calls they refer to."""

    rows: list[Row]
    replies: dict[str, ReplyView]
    calls: dict[str, CallView]
    fold: ContextFold
    first_at: int
    last_at: int
    counts: dict[str, int]


def _reply_state(fold: ContextFold, rid: str) -> tuple[bool, str] | None:
    """(interrupted, heard text) of one reply, as the projection sees it."""
    reply = fold.reply_state(rid)
    if reply is None:
        return None
    return reply.interrupted, reply.heard


def build_timeline(events: list[Event], verbose: bool = False) -> Timeline:
    """Folds a session's events into the rows ``calltape show`` prints."""
    from calltape.projections import ContextFold

    fold = ContextFold(events[0].session if events else None)
    rows: list[Row] = []
    replies: dict[str, ReplyView] = {}
    calls: dict[str, CallView] = {}
    last_reply: str | None = None
    last_user_seq = 0
    first_at = events[0].at_ms if events else 0
    counts = {"late_results": 0, "late_tokens": 0}

    def row(event: Event, lane: str, kind: str) -> Row:
        r = Row(event.seq or 0, event.at_ms, lane, kind)
        rows.append(r)
        return r

    def reply_view(rid: str, event: Event) -> ReplyView:
        nonlocal last_reply
        view = replies.get(rid)
        if view is None:
            view = ReplyView(rid, row(event, "agent", "reply"))
            view.row.reply = rid
            replies[rid] = view
            last_reply = rid
        return view

    for event in events:
        before = fold.counters["interruptions_ignored"]
        was_interrupted: dict[str, bool] = {}
        if event.type in ("interruption", "agent.speech.ended"):
            for rid in replies:
                state = _reply_state(fold, rid)
                was_interrupted[rid] = bool(state and state[0])
        fold.apply(event)
        data = event.data
        kind = event.type
        if kind == "session.started":
            r = row(event, "session", kind).add("● call started", "bold")
            r.add(f" · agent {data.get('agent')} · {data.get('modality', 'voice')}")
            if data.get("tenant"):
                r.add(f" · tenant {data['tenant']}")
            if data.get("framework"):
                r.add(f" · {data['framework']}")
        elif kind == "session.ended":
            row(event, "session", kind).add("■ call ended", "bold").add(
                f" ({data['reason']})" if data.get("reason") else ""
            )
        elif kind == "session.dropped":
            row(event, "session", kind).add("✖ call dropped", "bold red").add(
                f" ({data['reason']})" if data.get("reason") else "", "red"
            )
        elif kind == "session.resumed":
            row(event, "session", kind).add("↻ resumed", "bold green").add(
                f" by {data.get('agent')} · epoch {data.get('epoch')} · from seq {data.get('from_seq')}", "green"
            )
        elif kind == "agent.handoff":
            r = row(event, "session", kind).add("⇢ handoff", "bold magenta")
            r.add(f" {data.get('from')} → {data.get('to')}", "magenta")
            if data.get("reason"):
                r.add(f" ({data['reason']})", "magenta")
        elif kind == "agent.instructions":
            row(event, "session", kind).add("✎ instructions: ", "magenta").add(
                repr(shorten(str(data.get("text", "")), 60)), "dim"
            )
        elif kind == "user.speech.started":
            row(event, "user", kind).add("🎙 starts speaking", "dim")
        elif kind == "user.speech.stopped":
            if verbose:
                row(event, "user", kind).add("🎙 stops speaking", "dim")
        elif kind == "user.transcript":
            if data.get("final"):
                last_user_seq = event.seq or 0
                row(event, "user", kind).add(repr(str(data.get("text", "")).strip()), "bold cyan")
            elif verbose:
                row(event, "user", kind).add(f"… {str(data.get('text', '')).strip()}", "italic dim")
        elif kind == "user.text":
            last_user_seq = event.seq or 0
            row(event, "user", kind).add(repr(str(data.get("text", "")).strip()), "bold cyan").add(" (typed)", "dim")
        elif kind in ("agent.reply.started", "agent.text", "agent.reply.done"):
            rid = str(data.get("reply"))
            view = reply_view(rid, event)
            if kind == "agent.text":
                if view.interrupted_seq is not None:
                    view.late_tokens += 1
                    counts["late_tokens"] += 1
                else:
                    view.generated.append(str(data.get("text", "")))
            if verbose and kind != "agent.reply.started" and view.row.seq != event.seq:
                detail = f"· {kind.removeprefix('agent.')}"
                if kind == "agent.text":
                    detail += f" {data.get('text')!r}"
                row(event, "agent", kind).add(detail, "dim")
        elif kind in ("agent.speech.started", "agent.speech.progress"):
            if verbose:
                text = "▷ playout starts" if kind == "agent.speech.started" else f"▷ heard so far {data.get('heard')!r}"
                row(event, "agent", kind).add(text, "dim")
        elif kind == "agent.speech.ended":
            rid = str(data.get("reply"))
            state = _reply_state(fold, rid)
            newly = bool(state and state[0]) and not was_interrupted.get(rid, False)
            if newly and rid in replies:
                replies[rid].interrupted_seq = event.seq
            if data.get("interrupted") or verbose:
                r = row(event, "agent", kind)
                r.reply = rid
                if data.get("interrupted"):
                    r.add("⏹ playout cut", "yellow")
                else:
                    r.add("▷ playout ends", "dim")
                if data.get("heard") is not None:
                    r.add(f" · heard {shorten(str(data['heard']), 60)!r}", "dim")
        elif kind == "interruption":
            target: str | None = data.get("reply") or last_reply
            r = row(event, "agent", kind)
            r.reply = target
            ignored = fold.counters["interruptions_ignored"] > before
            cause = data.get("cause") or "user_speech"
            if ignored:
                r.add(f"✂ interruption ({cause})", "dim").add(" · no effect: nothing was playing or generating", "dim")
            else:
                r.add(f"✂ barge-in ({cause})", "bold yellow")
                if target is not None and target in replies:
                    replies[target].interrupted_seq = event.seq
                    state = _reply_state(fold, target)
                    if state is not None:
                        r.add(f" · heard {shorten(state[1], 60)!r}", "yellow")
        elif kind == "tool.call":
            cid = str(data.get("call"))
            owner: str | None = data.get("reply") or last_reply
            args = data.get("arguments")
            view_call = CallView(cid, str(data.get("name")), compact_json(args, 60), owner, event.seq or 0, event.at_ms)
            calls.setdefault(cid, view_call)
            r = row(event, "agent", kind)
            r.call = cid
        elif kind == "tool.started":
            if cid_view := calls.get(str(data.get("call"))):
                cid_view.started_at = event.at_ms
                if verbose:
                    row(event, "agent", kind).add(f"  ⚙ {cid_view.name} [{cid_view.call}] starts", "dim")
        elif kind == "tool.progress":
            if cid_view := calls.get(str(data.get("call"))):
                message = data.get("message") or compact_json(data.get("state"), 50)
                row(event, "agent", kind).add(f"  ⚙ {cid_view.name} [{cid_view.call}] … {message}", "dim")
        elif kind in ("tool.result", "tool.cancelled"):
            cid_view = calls.get(str(data.get("call")))
            r = row(event, "agent", kind)
            r.call = str(data.get("call"))
            if cid_view is not None and cid_view.end_at is None:
                cid_view.end_at = event.at_ms
                if kind == "tool.result":
                    reply = replies.get(cid_view.reply or "")
                    if reply is not None and reply.interrupted_seq is not None:
                        cid_view.late = f"after the barge-in at seq {reply.interrupted_seq}"
                    elif last_user_seq > cid_view.call_seq:
                        cid_view.late = f"after the user spoke again (seq {last_user_seq})"
                    if cid_view.late:
                        counts["late_results"] += 1
        elif kind == "tool.effect":
            _effect_row(row(event, "agent", kind), data)
        else:
            if verbose:
                row(event, "session", kind).add(f"{kind}", "dim")
        if rows:
            rows[-1].clean = fold.clean

    # Settle what only the end knows: heard text, interruptions, call outcomes.
    for rid, view in replies.items():
        state = _reply_state(fold, rid)
        if state is not None:
            view.interrupted, view.heard = state
    for c in fold.tool_calls():
        cv = calls.get(c.call_id)
        if cv is not None:
            cv.status, cv.included, cv.output = c.status, c.included, c.output
    for r in rows:
        _render_row(r, replies, calls)
    last_at = events[-1].at_ms if events else first_at
    return Timeline(rows, replies, calls, fold, first_at, last_at, counts)


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


def _render_row(r: Row, replies: dict[str, ReplyView], calls: dict[str, CallView]) -> None:
    if r.kind == "reply" and r.reply in replies:
        view = replies[r.reply]
        generated = "".join(view.generated)
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
        r.add("⚙ call ", "bold").add(f"{cv.name}({cv.arguments})", "bold").add(f" [{cv.call}]", "dim")
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
        if cv.late:
            r.add("  LATE", "bold magenta").add(f" {cv.late}", "magenta")
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
        "late_results": tl.counts["late_results"],
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
                        "generated": "".join(v.generated),
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
                        "reply": c.reply,
                        "status": c.status,
                        "included": c.included,
                        "duration_ms": c.duration_ms(),
                        "late": c.late,
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
