"""Read commands over the projections: ``sessions``, ``context``, ``diff``."""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from calltape.canonical_json import canonical_bytes
from calltape.cli.common import (
    FORMAT_HELP,
    check_format,
    clock,
    compact_json,
    complete_format,
    completer,
    duration,
    one_of,
    opened_store,
    out,
    require_session,
    run,
    shorten,
    within,
    write_json,
)
from calltape.cli.filters import AgentFilter, SinceFilter, TenantFilter, UntilFilter, session_window
from calltape.errors import CliError

if TYPE_CHECKING:
    from calltape.eventstore import EventStore, SessionInfo
    from calltape.projections import ContextFold

AT_HELP = "Instant: a seq (42), an RFC 3339 time (2025-01-31T09:30:00Z) or +SECONDS from the start (+12.5)."
JSON_HELP = "Print JSON instead of a table."

_STATUS_STYLE = {"active": "green", "ended": "dim", "dropped": "bold red"}
_SORT_KEYS = {"last": "last_at", "first": "first_at", "session": "session", "events": "events"}


# ---------------------------------------------------------------------------------------------
# sessions


def _session_json(info: SessionInfo) -> dict[str, Any]:
    from calltape.events import format_time

    return {
        "session": info.session,
        "agent": info.agent,
        "tenant": info.tenant,
        "modality": info.modality,
        "framework": info.framework,
        "status": info.status,
        "events": info.last_seq,
        "epoch": info.epoch,
        "first_at": format_time(info.first_at_ms) if info.first_at_ms is not None else None,
        "last_at": format_time(info.last_at_ms) if info.last_at_ms is not None else None,
    }


def sessions(
    ctx: typer.Context,
    agent: AgentFilter = None,
    of_tenant: TenantFilter = None,
    status: Annotated[
        str | None,
        typer.Option(
            metavar="STATUS",
            help="Only sessions in this status: active, ended or dropped.",
            callback=one_of("active", "ended", "dropped"),
            autocompletion=completer("active", "ended", "dropped"),
        ),
    ] = None,
    since: SinceFilter = None,
    until: UntilFilter = None,
    sort: Annotated[
        str,
        typer.Option(
            metavar="FIELD",
            help="Sort by: last (latest event), first (start), session (id) or events (count).",
            callback=one_of(*_SORT_KEYS),
            autocompletion=completer(*_SORT_KEYS),
        ),
    ] = "last",
    ascending: Annotated[bool, typer.Option("--asc/--desc", help="Sort order.")] = False,
    limit: Annotated[int, typer.Option(min=0, metavar="N", help="At most this many sessions (0: all).")] = 50,
    json_out: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """List sessions with their summary: agent, tenant, status, events, epoch, times."""
    since_ms, until_ms = session_window(since, until)

    async def fetch() -> list[SessionInfo]:
        async with opened_store(ctx) as store:
            return await store.sessions(
                agent=agent,
                tenant=of_tenant,
                status=status,
                since_ms=since_ms,
                until_ms=until_ms,
                order=_SORT_KEYS[sort],
                descending=not ascending,
                limit=(limit + 1) if limit else None,
            )

    found = run(fetch())
    more = bool(limit) and len(found) > limit
    found = found[:limit] if limit else found
    if json_out:
        write_json([_session_json(i) for i in found])
        return
    if not found:
        out().print("No sessions.", style="dim")
        return
    # The session id is the one column a user copies: it is never wrapped, folded or cut. Every other
    # column gives way first, and on a terminal too narrow even for the ids the table grows past it.
    id_width = max(len("SESSION"), *(len(i.session) for i in found))
    console = out()
    table = Table(box=None, header_style="bold", pad_edge=False)
    if console.width < id_width + 60:
        console = Console(
            file=console.file, width=id_width + 110, highlight=False, markup=False, no_color=console.no_color
        )
    for name, justify in (
        ("SESSION", "left"),
        ("AGENT", "left"),
        ("TENANT", "left"),
        ("STATUS", "left"),
        ("EVENTS", "right"),
        ("EPOCH", "right"),
        ("STARTED (UTC)", "left"),
        ("LENGTH", "right"),
    ):
        if name == "SESSION":
            table.add_column(name, no_wrap=True, min_width=id_width, overflow="ignore")
        else:
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for info in found:
        length = (
            info.last_at_ms - info.first_at_ms if info.last_at_ms is not None and info.first_at_ms is not None else None
        )
        table.add_row(
            info.session,
            info.agent or "",
            info.tenant or "",
            Text(info.status, style=_STATUS_STYLE.get(info.status, "")),
            str(info.last_seq),
            str(info.epoch),
            clock(info.first_at_ms),
            duration(length),
        )
    console.print(table)
    if more:
        console.print(f"(first {limit} shown; use --limit 0 for all)", style="dim")


# ---------------------------------------------------------------------------------------------
# context


async def fold_at(store: EventStore, session: str, at: str | None, option: str = "--at") -> ContextFold:
    """The fold at ``at``; a seq past the session's last event is an error, never silently the end."""
    from calltape.projections import AtSeq, build_context, parse_instant

    info = await require_session(store, session)
    if at is not None:
        instant = parse_instant(at)
        if isinstance(instant, AtSeq):
            within(info, instant.seq, option)
    return await build_context(store, session, at)


def context(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(metavar="SESSION", help="The session (call) id.")],
    at: Annotated[str | None, typer.Option("--at", metavar="N|TIME|+SECONDS", help=AT_HELP)] = None,
    format: Annotated[
        str, typer.Option("--format", "-f", metavar="FORMAT", help=FORMAT_HELP, autocompletion=complete_format)
    ] = "native",
    json_out: Annotated[
        bool, typer.Option("--json", help="Accepted for uniformity: the output is always JSON.")
    ] = False,
) -> None:
    """Print the chat context of a session at an instant, as JSON.

    The context is what the LLM should see: what the user said, what they actually heard of each
    reply, every tool call with exactly one output. Default instant: the latest event.
    """
    check_format(format)

    async def build() -> Any:
        from calltape.projections import render

        async with opened_store(ctx) as store:
            folded = await fold_at(store, session, at)
            return render(folded.native(), format)

    write_json(run(build()))


# ---------------------------------------------------------------------------------------------
# diff


@dataclass(slots=True)
class Side:
    """One side of ``calltape diff``: a session's context at an instant, and how to name it."""

    label: str
    session: str
    seq: int
    native: dict[str, Any]
    summary: dict[str, int] = field(default_factory=dict)


def _summary(folded: ContextFold, events: list[Any]) -> dict[str, int]:
    counts = Counter(e.type for e in events)
    tools = Counter(c.status for c in folded.tool_calls() if c.included)
    summary = {
        "events": len(events),
        "user turns": sum(1 for i in folded.native()["items"] if i.get("role") == "user"),
        "replies": counts["agent.reply.started"],
        "interruptions": folded.counters["interruptions"] - folded.counters["interruptions_ignored"],
        "tool calls": counts["tool.call"],
        "drops": counts["session.dropped"],
        "resumes": counts["session.resumed"],
        "handoffs": counts["agent.handoff"],
    }
    for status in ("completed", "error", "timeout", "unknown", "cancelled", "in_progress"):
        summary[f"tools {status}"] = tools[status]
    return summary


async def _side(store: EventStore, session: str, at: str | None, option: str) -> Side:
    folded = await fold_at(store, session, at, option)
    events = await store.read(session, to_seq=folded.seq)
    label = f"{session}@{folded.seq}"
    return Side(label, session, folded.seq, folded.native(), _summary(folded, events))


def describe_item(item: dict[str, Any] | None, limit: int = 70) -> str:
    """A context item in one short line for the diff table (role, then its text or call)."""
    if item is None:
        return ""
    kind = item.get("type")
    if kind == "message":
        content = item.get("content") or ""
        text = f"{item['role']}: {shorten(content, limit)!r}" if content else f"{item['role']}: (empty)"
        return text + (" (interrupted)" if item.get("interrupted") else "")
    if kind == "function_call":
        return f"call {item['name']}({compact_json(item['arguments'], limit // 2)}) [{item['call_id']}]"
    if kind == "function_call_output":
        return f"output [{item['call_id']}] {item['status']}: {compact_json(item['output'], limit // 2)}"
    if kind == "handoff":
        return f"handoff {item['from']} → {item['to']}"
    return compact_json(item, limit)


def _key(item: dict[str, Any]) -> bytes:
    return canonical_bytes(item)


def diff_items(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Aligned rows ``{"op": "="|"~"|"-"|"+", "a": item|None, "b": item|None}``."""
    rows: list[dict[str, Any]] = []
    matcher = difflib.SequenceMatcher(None, [_key(i) for i in a], [_key(i) for i in b], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            rows.extend({"op": "=", "a": a[i], "b": b[j]} for i, j in zip(range(i1, i2), range(j1, j2), strict=True))
            continue
        left, right = a[i1:i2], b[j1:j2]
        while left and right:
            x, y = left[0], right[0]
            if x.get("type") == y.get("type") and x.get("role") == y.get("role"):
                rows.append({"op": "~", "a": x, "b": y})
                left, right = left[1:], right[1:]
            elif len(left) >= len(right):
                rows.append({"op": "-", "a": x, "b": None})
                left = left[1:]
            else:
                rows.append({"op": "+", "a": None, "b": y})
                right = right[1:]
        rows.extend({"op": "-", "a": x, "b": None} for x in left)
        rows.extend({"op": "+", "a": None, "b": y} for y in right)
    return rows


_OP_STYLE = {"=": "dim", "~": "yellow", "-": "red", "+": "green"}


def diff(
    ctx: typer.Context,
    a: Annotated[str, typer.Argument(metavar="SESSION", help="A session.")],
    b: Annotated[
        str | None,
        typer.Argument(
            metavar="OTHER", help="Another session; without it, SESSION is compared with itself at --vs-at."
        ),
    ] = None,
    at: Annotated[
        str | None, typer.Option("--at", metavar="N|TIME|+SECONDS", help="Instant of SESSION (default: its end).")
    ] = None,
    vs_at: Annotated[
        str | None,
        typer.Option(
            "--vs-at",
            metavar="M|TIME|+SECONDS",
            help="Instant of OTHER, or of SESSION again when OTHER is not given (default: the same as --at).",
        ),
    ] = None,
    all_items: Annotated[bool, typer.Option("--all", help="Also list the items that are the same.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the diff as JSON.")] = False,
) -> None:
    """Compare two sessions' contexts, or one session's context at two instants.

    The contexts are compared item by item (= same, ~ changed, - only in the left, + only in the
    right), followed by a summary of event counts, interruptions and tool outcomes. Like diff(1),
    the exit status is 0 when the contexts are the same and 1 when they differ.

    """
    if b is None and vs_at is None:
        raise CliError("give a second session, or --vs-at to compare the session with itself at another instant")
    right_session = b if b is not None else a
    right_at = vs_at if vs_at is not None else at

    async def compare() -> tuple[Side, Side]:
        async with opened_store(ctx) as store:
            left = await _side(store, a, at, "--at")
            right = await _side(store, right_session, right_at, "--vs-at" if vs_at is not None else "--at")
            return left, right

    left, right = run(compare())
    rows = diff_items(left.native["items"], right.native["items"])
    counts = Counter(r["op"] for r in rows)
    same = counts["="] == len(rows)
    if json_out:
        write_json(
            {
                "same": same,
                "a": {"session": left.session, "seq": left.seq, "agent": left.native.get("agent")},
                "b": {"session": right.session, "seq": right.seq, "agent": right.native.get("agent")},
                "items": rows,
                "summary": {k: [left.summary[k], right.summary[k]] for k in left.summary},
            }
        )
    else:
        _print_diff(left, right, rows, all_items)
        console = out()
        if same:
            console.print(f"The contexts are the same ({len(rows)} items).", style="bold green")
        else:
            console.print(
                f"The contexts differ: {counts['~']} changed, {counts['-']} only in {left.label}, "
                f"{counts['+']} only in {right.label}.",
                style="bold yellow",
                markup=False,
            )
    if not same:
        raise typer.Exit(1)


def _print_diff(left: Side, right: Side, rows: list[dict[str, Any]], all_items: bool) -> None:
    console = out()
    if left.label == right.label:
        left.label, right.label = f"{left.label} (A)", f"{right.label} (B)"
    table = Table(title="Context items", title_justify="left", box=None, header_style="bold", pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column(left.label, overflow="fold", ratio=1)
    table.add_column(right.label, overflow="fold", ratio=1)
    hidden = 0
    for row in rows:
        op = row["op"]
        if op == "=" and not all_items:
            hidden += 1
            continue
        style = _OP_STYLE[op]
        table.add_row(
            Text(op, style=style),
            Text(describe_item(row["a"]), style=style if op != "+" else ""),
            Text(describe_item(row["b"]), style=style if op != "-" else ""),
        )
    if table.row_count:
        console.print(table)
    if hidden:
        console.print(f"({hidden} identical items not shown; --all lists them)", style="dim")
    summary = Table(title="Summary", title_justify="left", box=None, header_style="bold", pad_edge=False)
    summary.add_column("")
    summary.add_column(left.label, justify="right")
    summary.add_column(right.label, justify="right")
    for key, value in left.summary.items():
        other = right.summary[key]
        if not value and not other:
            continue
        style = "yellow" if value != other else ""
        summary.add_row(Text(key, style=style), Text(str(value), style=style), Text(str(other), style=style))
    console.print(summary)
