"""Helpers for the event-log tests: event builders, raw database access, a TCP proxy we can kill."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg
import orjson
from sqlalchemy.engine import make_url

from calltape.errors import StoreUnavailable
from calltape.events import Event, make_event
from calltape.eventstore import EventStore
from calltape.eventstore.postgres import PgWriter

T = TypeVar("T")


def on_citus(store: EventStore) -> bool:
    """Whether the store is on a Citus cluster (the suite runs there with ``$CALLTAPE_TEST_CITUS_URL``)."""
    from calltape.eventstore.citus import CitusEventStore

    return isinstance(store, CitusEventStore)


def atomic_across_sessions(store: EventStore) -> bool:
    """Whether one append of several sessions commits all or nothing (not on Citus, which commits each
    shard apart: see calltape/eventstore/citus.py)."""
    return not on_citus(store)


TRIGGERS_ON_CITUS = "SET LOCAL citus.enable_unsafe_triggers = on"
"""What a test's own trigger on a distributed table needs (Citus then creates it on every shard)."""


def skip_unless_atomic_across_sessions(store: EventStore) -> None:
    """Skips a test of a promise Citus does not make (atomicity and order across sessions in one append)."""
    import pytest

    if not atomic_across_sessions(store):
        pytest.skip("on Citus an append commits each shard apart: no atomicity or order across sessions")


def started(session: str, agent: str = "triage", **data: Any) -> Event:
    return make_event(session, "session.started", {"agent": agent, **data})


def text(session: str, value: str = "hi", **kw: Any) -> Event:
    return make_event(session, "user.text", {"text": value}, **kw)


def texts(session: str, n: int, prefix: str = "t") -> list[Event]:
    return [text(session, f"{prefix}{i}") for i in range(n)]


def asyncpg_dsn(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+asyncpg://``) as a plain libpq DSN for asyncpg.connect."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def raw_pg(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(asyncpg_dsn(url))


async def terminate_other_backends(url: str) -> int:
    """Kills every other connection to this test database (the shared server keeps running)."""
    conn = await raw_pg(url)
    try:
        killed: int = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return killed
    finally:
        await conn.close()


async def pg_append_in_txn(conn: asyncpg.Connection, events: Sequence[Event]) -> list[Event]:
    """Runs the store's own append steps on ``conn`` (which the caller keeps in an open transaction)."""
    return await PgWriter(conn).append(events)


async def insert_raw_event(store: EventStore, session: str, seq: int, event_type: str, data: dict[str, Any]) -> None:
    """Writes a row behind the store's back, as a newer calltape version would."""
    from sqlalchemy import text as sql

    payload = orjson.dumps(data).decode()
    data_expr = "CAST(:data AS jsonb)" if store.dialect == "postgresql" else ":data"
    engine = store.engine  # type: ignore[attr-defined]
    async with engine.begin() as conn:
        await conn.execute(
            sql(
                "INSERT INTO ct_events (session, seq, id, type, at_ms, agent, epoch, data) "
                f"VALUES (:session, :seq, :id, :type, :at_ms, NULL, NULL, {data_expr})"
            ),
            {"session": session, "seq": seq, "id": f"raw-{seq}", "type": event_type, "at_ms": 1_000, "data": payload},
        )
        await conn.execute(
            sql("UPDATE ct_sessions SET last_seq = :seq WHERE session = :session"), {"seq": seq, "session": session}
        )


async def settle(store: EventStore, timeout: float = 20.0) -> None:
    """Waits until everything committed so far is visible in the feed.

    PostgreSQL's feed stops at the oldest transaction still running anywhere in the cluster (other
    test runs share it), so a just-committed event may show up a moment later. SQLite: at once. On
    Citus the feed also waits for Citus to confirm two-phase commits (a test's own writes through the
    plain PostgreSQL steps commit that way): asked for here, as an import does, rather than waited for.
    """
    if store.dialect != "postgresql":
        return
    from sqlalchemy import text as sql

    engine = store.engine  # type: ignore[attr-defined]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with engine.connect() as conn:
        xmax = (await conn.execute(sql("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"))).scalar()
        await conn.commit()
        while True:
            if on_citus(store):
                await conn.execute(sql("SELECT recover_prepared_transactions()"))
                await conn.commit()
            if (await store.head()).txid >= xmax:
                return
            if loop.time() > deadline:
                raise AssertionError(f"a transaction older than xid {xmax} stays open in the cluster")
            await asyncio.sleep(0.01)


async def retrying(op: Callable[[], Awaitable[T]], *, attempts: int = 100, delay: float = 0.05) -> T:
    """Retries an idempotent store call while the database is unreachable."""
    for _ in range(attempts - 1):
        try:
            return await op()
        except StoreUnavailable:
            await asyncio.sleep(delay)
    return await op()


async def follow_feed(
    store: EventStore, position: Any, sessions: set[str], done: asyncio.Event, *, limit: int
) -> list[str]:
    """A follower polling the feed in pages of ``limit`` while writers run, until ``done`` is set and a
    page comes back empty; the ids of ``sessions``' events it saw, in order. Positions only rise."""
    seen: list[str] = []
    while True:
        finished = done.is_set()
        page = await store.feed(position, limit=limit)
        for p, e in page:
            assert p > position
            position = p
            if e.session in sessions:
                seen.append(e.id)
        if finished and not page:
            return seen
        if not page:
            await asyncio.sleep(0.002)


async def drain_feed(store: EventStore, after: Any, session_filter: set[str] | None = None) -> list[tuple[Any, Event]]:
    rows: list[tuple[Any, Event]] = []
    position = after
    while True:
        page = await store.feed(position, limit=50)
        if not page:
            return rows
        position = page[-1][0]
        rows += [(p, e) for p, e in page if session_filter is None or e.session in session_filter]


class TcpProxy:
    """A local TCP forwarder to PostgreSQL that a test can kill (listener and every connection) and restart."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host, self.target_port = target_host, target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        self._tasks.update(pipes)
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        for w in (writer, up_writer):
            w.transport.abort()
            self._writers.discard(w)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def kill(self) -> None:
        """Closes the listener and cuts every open connection (both sides)."""
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def restart(self) -> None:
        await self.start()


async def at_revision(url: str, revision: str) -> None:
    """A database migrated only as far as ``revision``, as an older calltape left it."""
    from alembic import command
    from sqlalchemy.ext.asyncio import create_async_engine

    from calltape.eventstore import resolve_url
    from calltape.migrations import alembic_config

    engine = create_async_engine(resolve_url(url))
    try:
        async with engine.begin() as conn:

            def run(sync_conn: object) -> None:
                cfg = alembic_config()
                cfg.attributes["connection"] = sync_conn
                command.upgrade(cfg, revision)

            await conn.run_sync(run)
    finally:
        await engine.dispose()
