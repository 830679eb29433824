"""Commands that move events in and out of the log: ``db``, ``import``, ``export``, ``replay``.

Import is all or nothing: the whole input goes in through one transaction
(:func:`calltape.eventstore.bulk.bulk_import`), so an invalid line anywhere, or an event the store
refuses (a stale epoch, a second ``session.started``), leaves the store exactly as it was, on both
backends and at any size. Each line is parsed once, in batches, so a file of any size streams
through bounded memory. A file whose every event the store already has is recognised by a quick
pass over the ids (no validation, no write) and skipped.

Reading the input (and the deterministic ids of events without one) is
:mod:`calltape.cli.reading`; a large input is read in a second process while this one stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer

from calltape.cli.common import (
    database_url,
    import_refusal,
    note,
    opened_store,
    out,
    require_session,
    run,
    within,
    write_json,
)
from calltape.cli.filters import SweepSince, sweep_since, swept
from calltape.cli.reading import Batch, Problems, ReaderProcess, Source, batches, open_sources
from calltape.errors import CalltapeError, CliError
from calltape.gcpause import BULK, gc_paused
from calltape.redaction import Redactor

if TYPE_CHECKING:
    from calltape.eventstore import EventStore
    from calltape.eventstore.bulk import BulkImport

BATCH = 5000
OVERLAP_SLICE = 500
"""Lines read between two yields to the event loop while a PostgreSQL write is in flight."""
QUICK_CHUNK = 5000


# ---------------------------------------------------------------------------------------------
# db


def db_upgrade(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (the revisions before and after).")] = False,
    grant: Annotated[
        str | None,
        typer.Option(
            "--grant",
            metavar="ROLE",
            help="PostgreSQL: give this existing role what the application needs (read and write the calltape "
            "tables' rows; no ownership, no bypass of row-level security), so tenants are kept apart for it.",
            show_default=False,
        ),
    ] = None,
    citus: Annotated[
        bool | None,
        typer.Option(
            "--citus/--no-citus",
            help="Distribute the tables by session over a Citus cluster (default: when the database has the "
            "citus extension); --citus fails without it.",
            show_default=False,
        ),
    ] = None,
    shards: Annotated[
        int | None,
        typer.Option(
            "--shards",
            metavar="N",
            help="Citus: distribute the tables in N shards (default: citus.shard_count where set, else 2 per "
            "worker node; each worker's share of a batch is one statement per shard).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Apply the schema migrations to the database (the embedded SQLite file upgrades itself)."""
    from calltape.cli.dberrors import database_errors
    from calltape.eventstore import upgrade
    from calltape.eventstore.errors import where

    url = database_url(ctx)
    with database_errors(url):
        before, after = run(upgrade(url, grant=grant, citus=citus, shards=shards))
    place = where(url)
    if json_out:
        result: dict[str, object] = {"database": place, "before": before, "after": after, "upgraded": before != after}
        if grant is not None:
            result["granted"] = grant
        write_json(result)
    elif before == after:
        out().print(f"The {place} is already at schema revision {after}.")
    else:
        out().print(f"Upgraded the {place} from revision {before or 'none'} to {after}.")
    if grant is not None and not json_out:
        out().print(f"Role '{grant}' may now read and write calltape rows, one tenant at a time.")


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


async def _all_stored(store: EventStore, sources: list[Source], chunk: int) -> tuple[int, int] | None:
    """The quick path for a file imported before: if every line is an event whose (session, id) the
    store has, how many events and sessions there are; None as soon as one is not (then the real
    import runs)."""
    from calltape.events import MAX_ID_CHARS
    from calltape.eventstore.bulk import stored_keys

    total = 0
    sessions: set[str] = set()
    keys: list[tuple[str, str]] = []

    async def check() -> bool:
        unique = set(keys)
        found = await stored_keys(store, list(unique))
        keys.clear()
        return len(found) == len(unique)

    for source in sources:
        if source.path is None:
            return None  # standard input can be read only once
        for _, raw in source.lines():
            line = raw.strip()
            if not line:
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                return None
            if not isinstance(obj, dict):
                return None
            session, id_ = obj.get("session"), obj.get("id")
            if not isinstance(session, str) or not isinstance(id_, str) or not isinstance(obj.get("type"), str):
                return None
            if "\x00" in session or "\x00" in id_ or len(session) > MAX_ID_CHARS or len(id_) > MAX_ID_CHARS:
                return None  # not an id the store could hold: the real import reports the line
            keys.append((session, id_))
            sessions.add(session)
            total += 1
            if len(keys) >= chunk and not await check():
                return None
    if keys and not await check():
        return None
    return total, len(sessions)


async def _import_here(
    imp: BulkImport,
    add: Callable[[BulkImport, Batch], Awaitable[None]],
    sources: list[Source],
    size: int,
    problems: Problems,
    dialect: str,
) -> None:
    """Reads and stores in this process (standard input, a small file). PostgreSQL works in its own
    process: while it stores one batch, this one reads the next, yielding to the loop every slice so
    the write goes on. SQLite's writes run in a thread of this process that needs the GIL for every
    row, so there reading and writing take turns."""
    overlap = dialect == "postgresql"
    in_flight: asyncio.Future[None] | None = None
    try:
        for part in batches(sources, size, problems, OVERLAP_SLICE if overlap else None):
            if part is None:
                await asyncio.sleep(0)  # a slice read: let the write in flight go on
                continue
            if in_flight is not None:
                await in_flight
            in_flight = asyncio.ensure_future(add(imp, part))
            if not overlap:
                await in_flight
                in_flight = None
        if in_flight is not None:
            await in_flight
            in_flight = None
    finally:
        if in_flight is not None:  # leaving on an error: the write ends before the rollback
            with contextlib.suppress(Exception):
                await in_flight


def import_events(
    ctx: typer.Context,
    files: Annotated[
        list[str],
        typer.Argument(metavar="FILE", help="JSON Lines files of events (plain or gzip); '-' reads standard input."),
    ],
    batch: Annotated[
        int, typer.Option(min=1, metavar="N", help="Events per write inside the one import transaction (at least 1).")
    ] = BATCH,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON counts (imported, skipped, sessions).")] = False,
    allow_after_resume: Annotated[
        bool,
        typer.Option(
            "--allow-after-resume",
            help="Import events without an epoch even into a session resumed since (not fenced).",
        ),
    ] = False,
    platform: Annotated[
        str,
        typer.Option(
            "--format",
            metavar="FORMAT",
            help="jsonl (calltape events), or a hosted platform's saved post-call payload, one JSON document a "
            'file: vapi, retell, bland, elevenlabs, ultravox ({"call": …, "messages": …}).',
        ),
    ] = "jsonl",
) -> None:
    """Append events from JSONL files (plain or gzip) to the log, all or nothing.

    With --format vapi|retell|bland|elevenlabs|ultravox each file is a platform's saved post-call
    payload (its end-of-call report or call object), converted into one session per call: what the
    payload does not say (VAD edges, exact timing) is left out. Importing it again adds nothing.

    Events without an epoch are fenced like a writer of epoch 1 (raised by a session.resumed in the
    same import): once a session has been resumed, an old export or a late spill file cannot write
    into it; --allow-after-resume imports them anyway.

    The whole import is one transaction: if any line is invalid, or the store refuses any event
    (a stale epoch, a second session.started), nothing is written and each bad line is reported
    as FILE:LINE: reason. Import is idempotent: an event whose id the session already has is
    skipped (seq in the file is ignored; the store assigns its own), and a file imported before is
    recognised quickly and skipped.
    """
    from calltape.cli.progress import meter
    from calltape.errors import ImportRefused
    from calltape.eventstore.bulk import bulk_import

    sources = open_sources(files)
    if platform != "jsonl":
        from calltape.cli.postcall import import_postcall

        import_postcall(ctx, sources, platform, json_out=json_out, allow_after_resume=allow_after_resume)
        return
    problems = Problems()
    known_size = all(s.size is not None for s in sources)
    total_bytes = sum(s.size or 0 for s in sources) if known_size else None

    async def append_all() -> tuple[int, int, int]:
        async with opened_store(ctx, create=True) as store:
            with meter("checking", total_bytes) as bar:
                stored = await _all_stored(store, sources, QUICK_CHUNK)
            if stored is not None:
                return 0, stored[0], stored[1]
            lines = 0

            async def add(imp: BulkImport, part: Batch) -> None:
                nonlocal lines
                try:
                    await imp.add(part.events)
                except ImportRefused as exc:
                    source, lineno = part.lines[exc.index]
                    raise CliError(
                        f"{source.name}:{lineno}: {import_refusal(exc, part.events[exc.index])}; nothing was imported"
                    ) from None
                lines += len(part.events)
                if bar.shown:
                    bar.update(
                        completed=sum(s.consumed for s in sources) if known_size else None,
                        note=f"{lines:,} events",
                    )

            # The cyclic collector waits until the import is done: it would rescan every event still
            # held by a batch, many times over, and reference counting frees them anyway.
            with meter("importing", total_bytes) as bar, gc_paused(BULK):
                async with bulk_import(store, allow_after_resume=allow_after_resume) as imp:
                    if ReaderProcess.wanted(sources):
                        # A large file: a second process reads and checks while this one stores.
                        reader = ReaderProcess(sources, batch, problems)
                        async with contextlib.aclosing(reader.batches()) as parts:
                            async for part in parts:
                                if not problems.count:
                                    await add(imp, part)
                    else:
                        await _import_here(imp, add, sources, batch, problems, store.dialect)
                    if problems.count:
                        raise problems.fail()  # leaves the transaction: everything is rolled back
                    counts = imp.counts
            return counts.new, counts.stored, len(counts.sessions)

    new, skipped, touched = run(append_all())
    total = new + skipped
    if total == 0:
        if json_out:
            write_json({"imported": 0, "skipped": 0, "sessions": 0, "lines": 0})
        else:
            note("No events to import.")
        return
    if json_out:
        write_json({"imported": new, "skipped": skipped, "sessions": touched, "lines": total})
        return
    message = f"Imported {new} new event{'s' if new != 1 else ''} into {touched} session{'s' if touched != 1 else ''}"
    if skipped:
        message += f" ({skipped} already stored)"
    out().print(message + ".")


# ---------------------------------------------------------------------------------------------
# export


def _session_file(name: str) -> list[str]:
    """Session ids, one per line ('-': standard input); blank lines and # comments are skipped."""
    try:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read '{name}': {exc.strerror or exc}") from None
    ids = []
    for raw in data.decode("utf-8", errors="replace").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            ids.append(line)
    return ids


def export_events(
    ctx: typer.Context,
    sessions: Annotated[
        list[str] | None, typer.Argument(metavar="SESSION", help="The sessions (call ids) to export.")
    ] = None,
    all_sessions: Annotated[bool, typer.Option("--all", help="Export every session.")] = False,
    since: SweepSince = None,
    session_file: Annotated[
        str | None,
        typer.Option("--session-file", metavar="FILE", help="Also export the ids listed in FILE, one per line."),
    ] = None,
    to: Annotated[
        int | None, typer.Option("--to", metavar="N", min=1, help="Stop at seq N (a prefix; one session only).")
    ] = None,
    otlp: Annotated[
        bool,
        typer.Option(
            "--otlp",
            help="Send the calls as OpenTelemetry traces over OTLP/HTTP instead (the otel extra): one trace per "
            "call, spans per turn, reply, tool call and effect.",
        ),
    ] = False,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            "--otlp-endpoint",
            metavar="URL",
            help="With --otlp: the traces URL (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else "
            "$OTEL_EXPORTER_OTLP_ENDPOINT/v1/traces, else http://localhost:4318/v1/traces).",
        ),
    ] = None,
    content: Annotated[
        bool,
        typer.Option(
            "--content",
            help="With --otlp: include what was said, tool arguments and results (redacted, see --redact).",
        ),
    ] = False,
    redact: Annotated[
        str,
        typer.Option(
            "--redact",
            metavar="KINDS",
            help="With --content: redaction applied to it first (card, email, phone, ssn; all; none).",
        ),
    ] = "all",
) -> None:
    """Write sessions' events as JSON Lines on standard output, one session after another.

    The output round-trips: importing it into an empty store reproduces the sessions. With --otlp the
    calls go to a tracing tool (Langfuse, Phoenix, an OpenTelemetry Collector) instead.
    """
    from calltape.cli.progress import meter

    chosen = list(sessions or [])
    if session_file is not None:
        chosen += _session_file(session_file)
    if all_sessions and chosen:
        raise CliError("give sessions or --all, not both")
    since_ms = sweep_since(all_sessions, since)
    if not all_sessions and not chosen:
        raise CliError("name the sessions to export, or use --all (see 'calltape export --help')")
    if to is not None and (all_sessions or len(chosen) != 1):
        raise CliError("--to needs exactly one session")
    chosen = list(dict.fromkeys(chosen))
    if not otlp and (otlp_endpoint is not None or content):
        raise CliError("--otlp-endpoint and --content go with --otlp")
    redactor = _redactor(redact) if content else None

    async def dump() -> None:
        async with opened_store(ctx) as store:
            if all_sessions:
                infos = await swept(store, since_ms)
                names = [i.session for i in infos]
            else:
                names = chosen
                for name in names:  # every id checked before the first line is written
                    info = await require_session(store, name)
                    if to is not None:
                        within(info, to, "--to")
            if otlp:
                calls = [await store.read(name, to_seq=to) for name in names]
                from calltape.cli.otlp import send_calls

                spans, target = send_calls(calls, endpoint=otlp_endpoint, content=content, redactor=redactor)
                note(f"Sent {spans} spans of {len(calls)} call(s) to {target}.")
                return
            stream = sys.stdout.buffer
            with meter("exporting", len(names), count=True) as bar:
                for name in names:
                    after = 0
                    while True:
                        events = await store.read(name, after_seq=after, to_seq=to, limit=5000)
                        if not events:
                            break
                        stream.write(b"".join(e.to_json() + b"\n" for e in events))
                        after = events[-1].seq or after + len(events)
                    bar.update(advance=1)
            stream.flush()

    run(dump())


def _redactor(spec: str) -> Redactor | None:
    if spec.strip().lower() == "none":
        return None
    try:
        return Redactor.parse(spec)
    except CalltapeError as exc:
        raise CliError(str(exc)) from None


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
        from calltape.errors import ForkRefused
        from calltape.eventstore.fork import fork_session

        async with opened_store(ctx) as store:
            info = await require_session(store, session)
            if to is not None:
                within(info, to, "--to")
            try:
                return await fork_session(store, session, into, to_seq=to)
            except ForkRefused as refused:
                raise CliError(str(refused)) from None

    count = run(copy())
    if json_out:
        write_json({"session": session, "into": into, "events": count})
    else:
        out().print(f"Replayed {count} events of '{session}' into '{into}'.")
