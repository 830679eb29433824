"""``calltape delete`` and ``calltape prune``: erasure on request and retention (SPEC section 6)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from calltape.cli.common import opened_store, out, parse_when, run, write_json
from calltape.cli.progress import meter
from calltape.errors import CliError


def delete(
    ctx: typer.Context,
    sessions: Annotated[list[str], typer.Argument(metavar="SESSION", help="The sessions to erase.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Counts as JSON.")] = False,
) -> None:
    """Erase sessions for good: events, snapshots and summary, in one transaction each.

    A tombstone (the session id, the time and the event count, no content) stays, so appending to or
    importing into an erased session id is refused: a replayed spill file or a late webhook cannot bring
    the call back. On a terminal it asks first unless --yes.
    """

    async def erase() -> list[dict[str, object]]:
        from calltape.errors import SessionNotFound

        async with opened_store(ctx) as store:
            for session in sessions:  # all must exist before any is erased
                if await store.session_info(session) is None and await store.tombstone(session) is None:
                    raise SessionNotFound(session)
            return [{"session": s, "events": await store.erase(s)} for s in sessions]

    if not yes and sys.stdin.isatty():
        names = ", ".join(sessions)
        if not typer.confirm(f"Erase {len(sessions)} session(s) for good ({names})?", default=False):
            raise CliError("nothing was erased")
    erased = run(erase())
    if as_json:
        write_json(erased)
        return
    for row in erased:
        out().print(f"Erased {row['session']}: {row['events']} event(s).", markup=False)


def prune(
    ctx: typer.Context,
    older_than: Annotated[
        str, typer.Option("--older-than", metavar="AGE", help="Erase sessions last active before: 30d, 12h.")
    ],
    status: Annotated[
        str, typer.Option("--status", metavar="STATUS", help="Only sessions that are ended, dropped, or any.")
    ] = "any",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be erased; erase nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Counts as JSON.")] = False,
) -> None:
    """Erase every session whose last event is older than a duration (retention), one at a time.

    Each session is its own short transaction, so a prune of millions of events never holds a lock for
    long nor stalls live appends to other calls. Erased sessions leave tombstones, as with delete.
    """
    from calltape.eventstore.retention import prune as prune_sessions

    if status not in ("ended", "dropped", "any"):
        raise CliError(f"--status '{status}' is not one of: ended, dropped, any")
    if not older_than.strip() or not older_than.strip()[0].isdigit():
        raise CliError(f"--older-than '{older_than}' is not a duration: use 30d, 12h, 45m")
    before = parse_when(older_than, "--older-than")

    async def go() -> object:
        async with opened_store(ctx) as store:
            with meter("pruning", None, count=True) as bar:
                return await prune_sessions(
                    store,
                    before_ms=before,
                    status=status,
                    dry_run=dry_run,
                    progress=lambda done, total: bar.update(completed=done, total=total),
                )

    report = run(go())
    sessions, events = report.sessions, report.events  # type: ignore[attr-defined]
    if as_json:
        write_json({"sessions": sessions, "events": events, "dry_run": dry_run})
        return
    verb = "Would erase" if dry_run else "Erased"
    out().print(f"{verb} {sessions} session(s), {events} event(s).", markup=False)
