"""Commands that move events in and out of the log: ``db``, ``import``, ``export``, ``replay``.

Import is all-or-nothing with respect to *validity*: every line of every file is validated
(:func:`calltape.events.parse_event`) before the first append, and one invalid line means nothing is
written. The appends then go in batches, each its own transaction, so a file of any size streams
through bounded memory; because appends are idempotent by event id, an import cut short (a crash, a
lost connection, an event the store refuses such as a stale epoch) is repaired by fixing the cause
and running the same command again: what was already stored is skipped.

An event without an ``id`` gets a *deterministic* one (UUIDv5 of its session, its canonical JSON
and how often that exact line occurred before in this import), so re-importing such a file is a
no-op too, where a random id would duplicate every event.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from calltape.cli.common import (
    CliError,
    database_url,
    note,
    opened_store,
    out,
    require_session,
    run,
    within,
    write_json,
)
from calltape.errors import CalltapeError

if TYPE_CHECKING:
    from calltape.events import Event
    from calltape.eventstore import EventStore

BATCH = 1000
MAX_REPORTED = 20
_ID_NAMESPACE = uuid.UUID("8f5b0c1e-2d1a-4c57-9f0e-6a3c7d1b2e40")


# ---------------------------------------------------------------------------------------------
# db


def db_upgrade(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (the revisions before and after).")] = False,
) -> None:
    """Apply the schema migrations to the database (the embedded SQLite file upgrades itself)."""
    from calltape.cli.dberrors import database_errors
    from calltape.eventstore import upgrade
    from calltape.eventstore.errors import where

    url = database_url(ctx)
    with database_errors(url):
        before, after = run(upgrade(url))
    place = where(url)
    if json_out:
        write_json({"database": place, "before": before, "after": after, "upgraded": before != after})
    elif before == after:
        out().print(f"The {place} is already at schema revision {after}.")
    else:
        out().print(f"Upgraded the {place} from revision {before or 'none'} to {after}.")


def db_info(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show which database calltape uses and whether its schema is current."""
    from calltape.eventstore.errors import where
    from calltape.migrations import head_revision

    url = database_url(ctx)

    async def check() -> int:
        async with opened_store(ctx) as store:
            return len(await store.sessions())

    count = run(check())
    from sqlalchemy.engine import make_url

    info = {
        "database": where(url),
        "url": make_url(url).render_as_string(hide_password=True),
        "schema": head_revision(),
        "sessions": count,
    }
    if json_out:
        write_json(info)
        return
    out().print(f"{info['database']} · schema {info['schema']} (current) · {count} sessions")


# ---------------------------------------------------------------------------------------------
# import


@dataclass(slots=True)
class _Source:
    name: str
    path: Path | None
    data: bytes | None = None

    def lines(self) -> Iterator[tuple[int, bytes]]:
        if self.data is not None:
            yield from enumerate(self.data.splitlines(), start=1)
            return
        assert self.path is not None
        with self.path.open("rb") as handle:
            yield from enumerate(handle, start=1)


def _sources(files: list[str]) -> list[_Source]:
    sources: list[_Source] = []
    stdin_used = False
    for name in files:
        if name == "-":
            if stdin_used:
                raise CliError("'-' (stdin) can be given only once")
            stdin_used = True
            sources.append(_Source("<stdin>", None, sys.stdin.buffer.read()))
            continue
        path = Path(name)
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise CliError(f"cannot read '{name}': {exc.strerror or exc}") from None
        if path.is_dir():
            raise CliError(f"cannot read '{name}': it is a directory")
        sources.append(_Source(name, path))
    return sources


class _Parser:
    """Line → Event, with deterministic ids for events that have none."""

    def __init__(self) -> None:
        self.occurrences: dict[bytes, int] = {}

    def parse(self, line: bytes) -> Event:
        from calltape.events import parse_event

        try:
            obj: Any = orjson.loads(line)
        except orjson.JSONDecodeError:
            return parse_event(line)  # raises InvalidEvent with the JSON error
        event = parse_event(obj)
        event = replace(event, seq=None)  # the store assigns seqs
        if isinstance(obj, dict) and obj.get("id") is None:
            body = {k: v for k, v in obj.items() if k != "seq"}
            canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
            n = self.occurrences.get(canonical, 0)
            self.occurrences[canonical] = n + 1
            event = replace(event, id=str(uuid.uuid5(_ID_NAMESPACE, f"{event.session}\x00{n}\x00{canonical!r}")))
        return event


def _events(sources: list[_Source]) -> Iterator[tuple[_Source, int, Event]]:
    parser = _Parser()
    for source in sources:
        for lineno, raw in source.lines():
            line = raw.strip()
            if not line:
                continue
            yield source, lineno, parser.parse(line)


def _validate(sources: list[_Source]) -> tuple[int, set[str]]:
    """Validates every line; raises CliError listing ``FILE:LINE: reason`` for the invalid ones."""
    count = 0
    sessions: set[str] = set()
    problems: list[str] = []
    invalid = 0
    parser = _Parser()
    for source in sources:
        try:
            for lineno, raw in source.lines():
                line = raw.strip()
                if not line:
                    continue
                try:
                    event = parser.parse(line)
                except CalltapeError as exc:
                    invalid += 1
                    if len(problems) < MAX_REPORTED:
                        problems.append(f"{source.name}:{lineno}: {exc}")
                    continue
                count += 1
                sessions.add(event.session)
        except OSError as exc:
            raise CliError(f"cannot read '{source.name}': {exc.strerror or exc}") from None
    if invalid:
        for problem in problems:
            sys.stderr.write(problem + "\n")
        if invalid > len(problems):
            sys.stderr.write(f"… and {invalid - len(problems)} more invalid lines\n")
        sys.stderr.flush()
        raise CliError(
            f"nothing was imported: {invalid} invalid line{'s' if invalid != 1 else ''} "
            f"(fix {'them' if invalid != 1 else 'it'} and run the import again)"
        )
    return count, sessions


async def _last_seqs(store: EventStore, sessions: set[str]) -> dict[str, int]:
    seqs: dict[str, int] = {}
    for session in sessions:
        info = await store.session_info(session)
        seqs[session] = info.last_seq if info is not None else 0
    return seqs


def import_events(
    ctx: typer.Context,
    files: Annotated[
        list[str],
        typer.Argument(metavar="FILE...", help="JSON Lines files of events; '-' reads standard input."),
    ],
    batch: Annotated[int, typer.Option(min=1, help="Events per append transaction.")] = BATCH,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON counts (imported, skipped, sessions).")] = False,
) -> None:
    """Append events from JSONL files to the log.

    Every line of every file is validated first; if any line is invalid, nothing is written and
    each bad line is reported as FILE:LINE: reason. Import is idempotent: an event whose id the
    session already has is skipped (seq in the file is ignored; the store assigns its own), so an
    import that stopped half-way is completed by running it again.
    """
    sources = _sources(files)
    total, sessions = _validate(sources)
    if total == 0:
        note("No events to import.")
        return

    async def append_all() -> tuple[int, int]:
        async with opened_store(ctx, create=True) as store:
            before = await _last_seqs(store, sessions)
            pending: list[Event] = []
            first_line = ""
            for source, lineno, event in _events(sources):
                if not pending:
                    first_line = f"{source.name}:{lineno}"
                pending.append(event)
                if len(pending) >= batch:
                    await _append_batch(store, pending, first_line, f"{source.name}:{lineno}")
                    pending = []
            if pending:
                await _append_batch(store, pending, first_line, "the end")
            after = await _last_seqs(store, sessions)
        return sum(after[s] - before[s] for s in sessions), len(sessions)

    new, touched = run(append_all())
    skipped = total - new
    if json_out:
        write_json({"imported": new, "skipped": skipped, "sessions": touched, "lines": total})
        return
    message = f"Imported {new} new event{'s' if new != 1 else ''} into {touched} session{'s' if touched != 1 else ''}"
    if skipped:
        message += f" ({skipped} already stored)"
    out().print(message + ".")


async def _append_batch(store: EventStore, events: list[Event], first: str, last: str) -> None:
    from calltape.errors import FencedWrite, InvalidEvent

    try:
        await store.append(events)
    except (InvalidEvent, FencedWrite) as exc:
        raise CliError(
            f"the store refused the events from {first} to {last}: {exc}; the lines before were imported, "
            "so fix the file and run the import again (stored events are skipped)"
        ) from None


# ---------------------------------------------------------------------------------------------
# export


def export_events(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(metavar="SESSION", help="The session (call) id.")],
    to: Annotated[int | None, typer.Option("--to", metavar="N", min=1, help="Stop at seq N (export a prefix).")] = None,
) -> None:
    """Write a session's events as JSON Lines on standard output.

    The output round-trips: importing it into an empty store reproduces the session.
    """

    async def dump() -> None:
        async with opened_store(ctx) as store:
            await require_session(store, session)
            after = 0
            stream = sys.stdout.buffer
            while True:
                events = await store.read(session, after_seq=after, to_seq=to, limit=2000)
                if not events:
                    break
                stream.write(b"".join(e.to_json() + b"\n" for e in events))
                after = events[-1].seq or after + len(events)
            stream.flush()

    run(dump())


# ---------------------------------------------------------------------------------------------
# replay


def replay(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(metavar="SESSION", help="The session to copy.")],
    into: Annotated[str, typer.Option("--into", metavar="NEW", help="The new session id (must have no events).")],
    to: Annotated[
        int | None, typer.Option("--to", metavar="N", min=1, help="Copy only the prefix up to seq N.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (the number of events copied).")] = False,
) -> None:
    """Copy a session's log (or its prefix up to N) into a new session id.

    Events keep their type, data, times, agents and epochs and get new ids; the copy is one
    transaction. Use it to reproduce a bad call against a new agent build, then compare with
    calltape diff.
    """
    if into == session:
        raise CliError("--into must name a new session, not the one being replayed")

    async def copy() -> int:
        from calltape.errors import ConcurrencyConflict
        from calltape.events import new_event_id

        async with opened_store(ctx) as store:
            info = await require_session(store, session)
            if to is not None:
                within(info, to, "--to")
            existing = await store.session_info(into)
            if existing is not None and existing.last_seq > 0:
                raise CliError(
                    f"session '{into}' already has {existing.last_seq} events; replay needs a new session id"
                )
            events = await store.read(session, to_seq=to)
            copies = [replace(e, session=into, id=new_event_id(), seq=None) for e in events]
            try:
                await store.append(copies, expected_seq=0)
            except ConcurrencyConflict:
                raise CliError(f"session '{into}' received events while the replay ran; nothing was copied") from None
            return len(copies)

    count = run(copy())
    if json_out:
        write_json({"session": session, "into": into, "events": count})
    else:
        out().print(f"Replayed {count} events of '{session}' into '{into}'.")
