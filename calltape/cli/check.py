"""``calltape check``: the barge-in rules of SPEC section 7 over stored calls or JSONL files.

One line per violation on stdout (``SESSION seq RULE: sentence``), or ``--json`` a list of
``{"session","seq","rule","message"}``. Exit 0 when every checked call is clean, 1 when any
violation is found, 2 on a usage error. A sweep reads one session at a time, so memory stays that
of one call however many are checked; a progress bar shows on a terminal only.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from calltape.cli.common import note, opened_store, require_session, run, state, write_json
from calltape.cli.filters import SweepSince, sweep_since, swept
from calltape.errors import CliError

if TYPE_CHECKING:
    from calltape.checks import CheckOptions, Violation

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 7 * 86_400_000}


def parse_duration(value: str, option: str) -> int:
    """``10m``, ``90s``, ``2h``, ``7d`` to milliseconds (a usage error otherwise)."""
    match = _DURATION.fullmatch(value.strip())
    if match is None:
        raise typer.BadParameter(f"'{value}' is not a duration (use 30s, 10m, 2h or 7d)", param_hint=option)
    return round(float(match.group(1)) * _UNIT_MS[match.group(2)])


class _Printer:
    """Writes violations as they are found (text) or gathers them (JSON)."""

    def __init__(self, json_out: bool) -> None:
        self.json_out = json_out
        self.found: list[Violation] = []
        self.sessions = 0
        self.events = 0
        self.bad_sessions = 0

    def add(self, events: int, violations: list[Violation]) -> None:
        self.sessions += 1
        self.events += events
        if violations:
            self.bad_sessions += 1
        if self.json_out:
            self.found.extend(violations)
        else:
            self.found.extend(violations)
            if violations:
                sys.stdout.write("".join(f"{v}\n" for v in violations))
                sys.stdout.flush()

    def finish(self) -> int:
        if self.json_out:
            write_json([v.to_json() for v in self.found])
        n = len(self.found)
        summary = (
            f"Checked {self.sessions} session{'s' if self.sessions != 1 else ''} "
            f"({self.events} event{'s' if self.events != 1 else ''}): "
        )
        if n:
            summary += (
                f"{n} violation{'s' if n != 1 else ''} in {self.bad_sessions} "
                f"session{'s' if self.bad_sessions != 1 else ''}."
            )
        else:
            summary += "no violations."
        note(summary)
        return 1 if n else 0


def check(
    ctx: typer.Context,
    sessions: Annotated[
        list[str] | None, typer.Argument(metavar="SESSION", help="Sessions (calls) to check.", show_default=False)
    ] = None,
    files: Annotated[
        list[str] | None,
        typer.Option(
            "--file",
            metavar="FILE",
            help="Check a JSONL file of events instead of the database (repeatable; a file may hold several sessions).",
            show_default=False,
        ),
    ] = None,
    all_sessions: Annotated[bool, typer.Option("--all", help="Check every session in the database.")] = False,
    since: SweepSince = None,
    rule_ids: Annotated[
        list[str] | None,
        typer.Option("--rule", metavar="RULE", help="Check only this rule (repeatable).", show_default=False),
    ] = None,
    talk_over_ms: Annotated[
        int,
        typer.Option(
            "--talk-over-ms", min=0, metavar="MS", help="talk-over: how long the playout may run on after a barge-in."
        ),
    ] = 500,
    stale_after: Annotated[
        str,
        typer.Option("--stale-after", metavar="DURATION", help="unsettled-drop: how old a drop must be to count."),
    ] = "10m",
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs", "-j", min=0, metavar="N", help="Worker processes for a large sweep (0: one per CPU core)."
        ),
    ] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON list of violations.")] = False,
) -> None:
    """Check recorded calls for barge-in bugs; one line per violation.

    The rules: orphan calls, late starts, double runs, zombie writes, talk-over, late tokens,
    unsettled drops and slow tools. Prints one line per violation: SESSION seq RULE: sentence.
    """
    from calltape.checks import RULES, CheckOptions
    from calltape.errors import CheckInputError

    sessions = list(sessions or [])
    files = list(files or [])
    chosen = [bool(sessions), bool(files), all_sessions]
    if sum(chosen) == 0:
        raise CliError("give SESSION..., --file FILE or --all (see 'calltape check --help')")
    if sum(chosen) > 1:
        raise CliError("give only one of SESSION..., --file FILE and --all")
    since_ms = sweep_since(all_sessions, since)
    for rule_id in rule_ids or []:
        if rule_id not in RULES:
            raise CliError(f"unknown rule '{rule_id}' (the rules are: {', '.join(RULES)})")
    options = CheckOptions(talk_over_ms=talk_over_ms, stale_after_ms=parse_duration(stale_after, "--stale-after"))
    rules = rule_ids or None
    printer = _Printer(json_out)

    if files:
        from calltape.checks import check_events, read_jsonl

        try:
            for name in files:
                for session, events in read_jsonl(name):
                    printer.add(len(events), check_events(events, options, rules, session))
        except CheckInputError as exc:
            raise CliError(str(exc)) from None
    else:
        names, total = run(_names(ctx, sessions, all_sessions, since_ms))
        _sweep(ctx, names, total, jobs or os.cpu_count() or 1, options, rules, printer)
    code = printer.finish()
    if code:
        raise typer.Exit(code)


async def _names(
    ctx: typer.Context, names: list[str], all_sessions: bool, since_ms: int | None
) -> tuple[list[str], int]:
    """The sessions to check (in order of their start) and how many events they hold."""
    async with opened_store(ctx) as store:
        if all_sessions:
            infos = await swept(store, since_ms)
            return [i.session for i in infos], sum(i.last_seq for i in infos)
        names = list(dict.fromkeys(names))
        total = 0
        for name in names:
            total += (await require_session(store, name)).last_seq
        return names, total


def _sweep(
    ctx: typer.Context,
    names: list[str],
    total_events: int,
    jobs: int,
    options: CheckOptions,
    rules: list[str] | None,
    printer: _Printer,
) -> None:
    from calltape.checks import CHUNK, sweep_parallel, sweep_store

    progress = _progress(len(names), total_events)
    try:
        if jobs > 1 and len(names) > CHUNK:
            for reports in sweep_parallel(state(ctx).db, names, options, rules, jobs=jobs):
                for report in reports:
                    printer.add(report.events, report.violations)
                    if progress is not None:
                        progress.advance(report.events)
            return

        async def one_process() -> None:
            async with opened_store(ctx) as store:
                async for report in sweep_store(store, names, options, rules):
                    printer.add(report.events, report.violations)
                    if progress is not None:
                        progress.advance(report.events)

        run(one_process())
    finally:
        if progress is not None:
            progress.stop()


class _Bar:
    """A rich progress bar on stderr (terminals only: a pipe or a CI log gets the summary line)."""

    def __init__(self, sessions: int, events: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from calltape.cli.common import err

        self.progress = Progress(
            TextColumn("checking"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("events · {task.fields[sessions]} sessions"),
            TimeRemainingColumn(),
            console=err(),
            transient=True,
        )
        self.task = self.progress.add_task("check", total=events, sessions=f"0/{sessions}")
        self.sessions_total = sessions
        self.done = 0
        self.progress.start()

    def advance(self, events: int) -> None:
        self.done += 1
        self.progress.update(self.task, advance=events, sessions=f"{self.done}/{self.sessions_total}")

    def stop(self) -> None:
        self.progress.stop()


def _progress(sessions: int, events: int) -> _Bar | None:
    if sessions < 2 or not sys.stderr.isatty():
        return None
    return _Bar(sessions, events)
