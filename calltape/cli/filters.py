"""Which sessions a command reads, declared once with one help text each.

The session filters: ``sessions`` lists the sessions they select, ``stats`` totals over them (both
hand them to ``EventStore.sessions``). The sweep: ``check --all`` and ``export --all`` read every
session, ``--since`` keeping those with events since then."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from calltape.cli.common import parse_when
from calltape.errors import CliError

if TYPE_CHECKING:
    from calltape.eventstore import EventStore, SessionInfo

AgentFilter = Annotated[str | None, typer.Option(metavar="NAME", help="Only sessions whose current agent is this one.")]
TenantFilter = Annotated[
    str | None,
    typer.Option(
        "--of-tenant",
        metavar="NAME",
        help="Only this tenant's sessions: a filter over what the store shows (with --all-tenants, any "
        "tenant's); --tenant opens the store for one tenant.",
    ),
]
SinceFilter = Annotated[
    str | None,
    typer.Option(metavar="WHEN", help="Only sessions active at or after WHEN: RFC 3339, a date, or 30m/2h/7d ago."),
]
UntilFilter = Annotated[str | None, typer.Option(metavar="WHEN", help="Only sessions that began at or before WHEN.")]


def session_window(since: str | None, until: str | None) -> tuple[int | None, int | None]:
    """``--since`` and ``--until`` as epoch milliseconds (None: not given)."""
    return (
        parse_when(since, "--since") if since else None,
        parse_when(until, "--until") if until else None,
    )


SweepSince = Annotated[
    str | None,
    typer.Option(
        "--since",
        metavar="WHEN",
        help="With --all: only sessions with events since WHEN: RFC 3339, a date, or 30m/2h/7d ago.",
        show_default=False,
    ),
]


def sweep_since(all_sessions: bool, since: str | None) -> int | None:
    """A sweep's ``--since`` as epoch milliseconds (None: not given); it goes with ``--all`` only."""
    if since is None:
        return None
    if not all_sessions:
        raise CliError("--since goes with --all")
    return parse_when(since, "--since")


async def swept(store: EventStore, since_ms: int | None) -> list[SessionInfo]:
    """The sessions ``--all`` reads (with events since ``since_ms``), in the order they began."""
    return await store.sessions(since_ms=since_ms, order="first_at", descending=False)
