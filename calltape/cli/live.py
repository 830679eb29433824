"""Commands around live calls: ``tail``, ``resume``, ``stats``, ``serve``, ``demo``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from calltape.cli.common import (
    FORMAT_HELP,
    check_format,
    clock,
    compact_json,
    complete_format,
    completer,
    database_url,
    duration,
    note,
    one_of,
    opened_store,
    out,
    require_session,
    run,
    shorten,
    state,
    write_json,
)
from calltape.cli.dberrors import database_errors
from calltape.cli.filters import AgentFilter, SinceFilter, TenantFilter, UntilFilter, session_window
from calltape.errors import CliError

if TYPE_CHECKING:
    from calltape.events import Event


# ---------------------------------------------------------------------------------------------
# tail


def describe_event(event: Event) -> str:
    """One line of what an event says."""
    d = event.data
    kind = event.type
    if kind == "session.started":
        return f"agent {d.get('agent')} · {d.get('modality', 'voice')}" + (
            f" · tenant {d['tenant']}" if d.get("tenant") else ""
        )
    if kind in ("user.transcript", "user.text", "agent.text", "agent.instructions"):
        text = repr(shorten(str(d.get("text", "")), 70))
        if kind == "user.transcript" and not d.get("final"):
            text += " (interim)"
        if kind == "agent.text":
            text = f"[{d.get('reply')}] {text}"
        return text
    if kind in ("agent.reply.started", "agent.reply.done", "agent.speech.started"):
        return f"[{d.get('reply')}]"
    if kind in ("agent.speech.progress", "agent.speech.ended", "interruption"):
        parts = [f"[{d.get('reply')}]"] if d.get("reply") else []
        if d.get("interrupted"):
            parts.append("interrupted")
        if d.get("cause"):
            parts.append(str(d["cause"]))
        if d.get("heard") is not None:
            parts.append(f"heard {shorten(str(d['heard']), 50)!r}")
        return " ".join(parts)
    if kind == "tool.call":
        return f"[{d.get('call')}] {d.get('name')}({compact_json(d.get('arguments'), 50)})"
    if kind in ("tool.started", "tool.progress", "tool.result", "tool.cancelled"):
        rest = ""
        if kind == "tool.result":
            rest = (" error: " if d.get("error") else " ") + compact_json(d.get("output"), 60)
        elif kind == "tool.cancelled":
            rest = f" {d.get('reason')}" + (f" ({d['outcome']})" if d.get("outcome") else "")
        elif kind == "tool.progress":
            rest = " " + (d.get("message") or compact_json(d.get("state"), 50))
        return f"[{d.get('call')}]{rest}"
    if kind == "session.resumed":
        return f"agent {d.get('agent')} · epoch {d.get('epoch')} · from seq {d.get('from_seq')}"
    if kind == "agent.handoff":
        return f"{d.get('from')} → {d.get('to')}"
    if kind in ("session.ended", "session.dropped"):
        return str(d.get("reason") or "")
    return compact_json(d, 70) if d else ""


_KIND_STYLE = {
    "user": "cyan",
    "agent": "white",
    "tool": "blue",
    "interruption": "bold yellow",
    "session": "magenta",
}


async def run_until_signal(body: Callable[[], Awaitable[None]]) -> None:
    """Runs ``body`` until it ends or SIGINT/SIGTERM arrives; a signal ends it quietly."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(body())
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def tail(
    ctx: typer.Context,
    session: Annotated[
        str | None, typer.Argument(metavar="SESSION", help="Follow only this session (default: all).")
    ] = None,
    from_: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="POS",
            help="Start after this feed position (TXID:POS or POS as printed; 0 = the beginning). Default: now.",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per event, with its position.")] = False,
) -> None:
    """Follow the log and print events as they are appended, until Ctrl-C.

    Each line starts with the event's feed position: pass it to --from to continue later
    without missing or repeating an event.
    """
    from calltape.eventstore import FeedPosition

    start: FeedPosition | None = None
    if from_ is not None:
        try:
            start = FeedPosition.parse(from_)
        except ValueError as exc:
            raise CliError(str(exc)) from None

    async def follow() -> None:
        async with opened_store(ctx) as store:
            position = start if start is not None else await store.head()
            what = f"session '{session}'" if session else "every session"
            note(f"Following {what} after position {position} (Ctrl-C to stop).")
            stream = sys.stdout
            console = out()
            events = store.subscribe(position, session=session)
            try:
                async for pos, event in events:
                    if json_out:
                        import orjson

                        stream.buffer.write(orjson.dumps({"position": str(pos), **event.to_wire()}) + b"\n")
                        stream.buffer.flush()
                        continue
                    group = event.type.split(".")[0]
                    line = Text()
                    line.append(f"{pos!s:>8} ", "dim")
                    line.append(f"{clock(event.at_ms)[11:]} ", "dim")
                    if session is None:
                        line.append(f"{event.session} ", "bold")
                    line.append(f"#{event.seq} ", "dim")
                    line.append(f"{event.type:<22}", _KIND_STYLE.get(group, "dim"))
                    line.append(" " + describe_event(event))
                    console.print(line, soft_wrap=True)
                    stream.flush()

            finally:
                aclose = getattr(events, "aclose", None)
                if aclose is not None:
                    await aclose()

    run(run_until_signal(follow))


# ---------------------------------------------------------------------------------------------
# resume


def resume(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(metavar="SESSION", help="The dropped (or live) session.")],
    agent: Annotated[str, typer.Option("--agent", metavar="NAME", help="The agent that takes the call over.")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan without appending anything (no fencing either).")
    ] = False,
    format: Annotated[
        str, typer.Option("--format", "-f", metavar="FORMAT", help=FORMAT_HELP, autocompletion=complete_format)
    ] = "native",
    idempotent: Annotated[
        list[str] | None,
        typer.Option(
            "--idempotent",
            metavar="TOOL",
            help="A tool that is safe to run again: its open calls get the 'retry' decision (repeatable).",
        ),
    ] = None,
    instructions: Annotated[
        str | None, typer.Option(metavar="TEXT", help="New system instructions for the new agent.")
    ] = None,
    take_over: Annotated[
        bool,
        typer.Option(
            "--take-over", help="Resume even a call that already has a live resumed agent (it is fenced in turn)."
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Accepted for uniformity: the plan is always JSON.")] = False,
) -> None:
    """Resume a call on a new agent: settle what was in flight, fence the old writer, print the plan.

    The plan (JSON) holds the checkpoint (last clean seq), the new epoch, the settled context in
    the chosen format, and a decision per open tool call: reuse (result in the log), retry
    (declared --idempotent) or unknown (may have run: never re-run automatically). Unless
    --dry-run, the settling events and session.resumed are appended, so any later write from the
    old agent's epoch is rejected. While the old agent still writes, the plan is made again on the
    longer log until it lands (up to 30 s). A call already resumed by an agent that is still live
    is refused unless --take-over.
    """
    check_format(format)

    async def go() -> dict[str, Any]:
        from calltape.errors import ConcurrencyConflict
        from calltape.runtime import ToolSpec
        from calltape.runtime import resume as do_resume

        tools = {name: ToolSpec(idempotent=True) for name in idempotent or []}
        async with opened_store(ctx) as store:
            await require_session(store, session)
            try:
                plan = await do_resume(
                    store,
                    session,
                    agent,
                    dry_run=dry_run,
                    tools=tools,
                    instructions=instructions,
                    format=format,
                    take_over=take_over,
                )
            except ConcurrencyConflict:
                raise CliError(
                    f"session '{session}' kept changing while the resume was planned (another writer appended "
                    "for 30 s, or another resume won): nothing was appended; stop the other writer and try again"
                ) from None
            return plan.to_json()

    write_json(run(go()))


# ---------------------------------------------------------------------------------------------
# stats


def stats(
    ctx: typer.Context,
    session: Annotated[
        str | None, typer.Argument(metavar="SESSION", help="One session (default: totals over sessions).")
    ] = None,
    agent: AgentFilter = None,
    of_tenant: TenantFilter = None,
    since: SinceFilter = None,
    until: UntilFilter = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Figures from the log: counts, tool outcomes, effects, recoveries and the voice latencies of a call or many.

    Events, interruptions, tool outcomes and durations, effects by name and outcome, drops, resumes,
    handoffs, the recoveries calltape performed (late results delivered, duplicates prevented, fenced
    writes, timeouts, …), and the voice latencies (p50/p95/p99): user stopped speaking to agent speech,
    interruption to agent silent, reply to first text, and tool durations by name. Without SESSION, the
    totals are over the sessions the filters select, as calltape sessions lists them."""
    since_ms, until_ms = session_window(since, until)

    async def compute() -> dict[str, Any]:
        from calltape.cli.progress import meter
        from calltape.runtime import merge_stats, session_stats
        from calltape.runtime.latency import Latencies

        async with opened_store(ctx) as store:
            if session is not None:
                await require_session(store, session)
                return session_stats(await store.read(session))
            infos = await store.sessions(agent=agent, tenant=of_tenant, since_ms=since_ms, until_ms=until_ms)
            figures = []
            latencies = Latencies()
            with meter("reading sessions", len(infos), count=True) as bar:
                for info in infos:
                    figures.append(session_stats(await store.read(info.session), into=latencies))
                    bar.update(advance=1)
            return merge_stats(figures, latencies)

    figures = run(compute())
    if json_out:
        write_json(figures)
        return
    _print_stats(figures, session)


def _print_stats(figures: dict[str, Any], session: str | None) -> None:
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()

    def counts(values: dict[str, int]) -> str:
        return ", ".join(f"{n} {k}" for k, n in values.items()) or "none"

    if session is not None:
        table.add_row("session", session)
        table.add_row("events", f"{figures['events']} over {duration(round(figures['duration_s'] * 1000))}")
        table.add_row("interruptions", str(figures["interruptions"]))
        tools = figures["tools"]
        line = f"{tools['calls']} ({counts(tools['outcomes'])})"
        if tools.get("duration_ms_p50") is not None:
            line += (
                f" · p50 {duration(round(tools['duration_ms_p50']))}, max {duration(round(tools['duration_ms_max']))}"
            )
        table.add_row("tool calls", line)
    else:
        table.add_row("sessions", str(figures["sessions"]))
        table.add_row("events", str(figures["events"]))
        table.add_row("interruptions", str(figures["interruptions"]))
        table.add_row("tool outcomes", counts(figures["tool_outcomes"]))
    table.add_row("drops", str(figures["drops"]))
    table.add_row("resumes", str(figures["resumes"]))
    table.add_row("handoffs", str(figures["handoffs"]))
    table.add_row("recoveries", counts(figures["recoveries"]))
    if figures.get("effects"):
        table.add_row("effects", "; ".join(f"{name}: {counts(c)}" for name, c in figures["effects"].items()))
    out().print(table)
    _print_latencies(figures["latency_ms"])


_LATENCY_ROWS = (
    ("user_stopped_to_agent_speech", "user stopped → agent speaks"),
    ("interruption_to_agent_stopped", "interruption → agent silent"),
    ("reply_to_first_text", "reply started → first text"),
)


def _print_latencies(latency: dict[str, Any]) -> None:
    """The latency figures as a table: one row per figure and per tool, p50/p95/p99/max in ms."""
    table = Table(title="latency (ms)", title_justify="left", box=None, pad_edge=False)
    table.add_column("figure", style="bold")
    for name in ("count", "p50", "p95", "p99", "max"):
        table.add_column(name, justify="right")

    def row(label: str, summary: dict[str, Any]) -> None:
        cells = ("-" if summary[k] is None else str(summary[k]) for k in ("count", "p50", "p95", "p99", "max"))
        table.add_row(Text(label), *cells)  # Text: a tool's name is never read as markup

    for key, label in _LATENCY_ROWS:
        row(label, latency[key])
    for name, summary in latency["tool_duration"].items():
        row(f"tool {name}", summary)
    out().print()
    out().print(table)


# ---------------------------------------------------------------------------------------------
# serve


def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(metavar="HOST", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, metavar="PORT", help="Port to listen on (1 to 65535).")] = 8787,
    session_prefix: Annotated[
        str, typer.Option(metavar="PREFIX", help="Prefix for the session ids of received calls.")
    ] = "",
    allow_unsigned: Annotated[
        bool, typer.Option("--allow-unsigned", help="Accept webhooks without a verifiable signature (local testing).")
    ] = False,
    allow_after_resume: Annotated[
        bool,
        typer.Option(
            "--allow-after-resume",
            help="Record webhooks into a call even after `calltape resume` handed it to another agent.",
        ),
    ] = False,
    log_level: Annotated[
        str,
        typer.Option(
            metavar="LEVEL",
            help="Server log level: critical, error, warning, info or debug.",
            callback=one_of("critical", "error", "warning", "info", "debug"),
            autocompletion=completer("critical", "error", "warning", "info", "debug"),
        ),
    ] = "info",
) -> None:
    """Receive the hosted platforms' webhooks and record the calls; serve metrics and timelines.

    POST /vapi, /retell, /bland, /elevenlabs, /ultravox record the calls; GET /metrics gives counts of
    what the calls do, check findings and the voice latency figures, from the server's start, for
    Prometheus.

    Secrets come from the environment, never the command line: CALLTAPE_VAPI_SECRET,
    CALLTAPE_VAPI_BEARER, CALLTAPE_VAPI_HMAC_SECRET, CALLTAPE_RETELL_API_KEY, CALLTAPE_BLAND_SECRET,
    CALLTAPE_ELEVENLABS_SECRET, CALLTAPE_ULTRAVOX_SECRET (and CALLTAPE_ULTRAVOX_API_KEY to fetch an
    ended call's messages).
    Any call's timeline picture is at GET /sessions/ID/timeline (list: GET /sessions) for requests
    that carry CALLTAPE_VIEWER_TOKEN (bearer, or basic-auth password); closed without it, open with
    --allow-unsigned. Webhooks of a call that was resumed since (`calltape resume`) are refused with
    409 unless --allow-after-resume.
    Runs until Ctrl-C. Needs the serve extra: pip install 'calltape[serve]'.
    """
    from calltape.extras import requires_extra

    with requires_extra("serve", "calltape serve"):
        from calltape.server import run_server
    from calltape.eventstore import open_store

    url = database_url(ctx)

    async def check() -> None:  # fail fast, in the CLI's error style, before the server starts
        store = await open_store(url)
        await store.close()

    with database_errors(url):
        run(check())
    out().print(f"Listening on http://{host}:{port} (Ctrl-C to stop).", style="dim")
    with contextlib.suppress(KeyboardInterrupt):
        run_server(
            url,
            host,
            port,
            log_level=log_level,
            session_prefix=session_prefix,
            allow_unsigned=allow_unsigned,
            allow_after_resume=allow_after_resume,
        )


# ---------------------------------------------------------------------------------------------
# demo


def demo(ctx: typer.Context) -> None:
    """One bad call's story, offline, in a few seconds: barge-in, crash, resume, fenced zombie.

    On the embedded database (or --db): a barge-in during a booking tool, a naive context against
    calltape's, a crash, a resume on a new agent, a fenced zombie write; then the commands to
    inspect the call it recorded."""
    from calltape.demo import run_demo

    url = database_url(ctx)
    with database_errors(url):
        run(run_demo(state(ctx).db, out()))
