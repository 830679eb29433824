"""SQLite backend: the embedded default.

Writers take the database lock up front (``BEGIN IMMEDIATE``), so appends from several processes
serialize instead of failing on a lock upgrade, and ``pos`` order is commit order: the feed needs no
transaction ids here. Sets of keys travel as one JSON array (``json_each``), so a lookup is one
statement whatever its size, with no limit on the number of parameters.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import orjson
from sqlalchemy import ColumnElement, bindparam, delete, func, select, update
from sqlalchemy import event as sa_event
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import await_only

from calltape.errors import ConcurrencyConflict, FencedWrite, InvalidEvent
from calltape.events import Event
from calltape.eventstore._sqlite_thread import (
    WAL_CAP_BYTES,
    ThreadDb,
    WalCheckpoints,
    WriterThread,
    checkpoint,
    in_transaction,
    run_to_end,
)
from calltape.eventstore.append_plan import SessionInfo
from calltape.eventstore.errors import translate_errors
from calltape.eventstore.queries import (
    EVENT_SELECT,
    Db,
    Query,
    SqlEventStore,
    dumps_data,
    owns,
    to_event,
    to_session_info,
)
from calltape.eventstore.schema import ROW_COLUMNS, SESSION_COLUMNS, events, sessions
from calltape.eventstore.store import ChangeWaiter, FeedPosition, SleepWaiter, checked_batch
from calltape.eventstore.tenancy import admit, refuse_foreign
from calltape.eventstore.writer import AppendWriter, Key
from calltape.gcpause import BULK, gc_paused

log = logging.getLogger("calltape.eventstore")

T = TypeVar("T")


def _coro(awaitable: Awaitable[T]) -> Coroutine[Any, Any, T]:
    """A job's awaitable as the coroutine :func:`run_to_end` drives (a job is an ``async def``)."""
    assert isinstance(awaitable, Coroutine)
    return awaitable


BUSY_TIMEOUT_MS = 10_000
"""How long a writer waits for another process's write lock before the store reports the file locked."""


def _switch_to_wal(cursor: Any, sleep: Callable[[float], None]) -> None:
    """Switches the file to WAL, retrying while another process holds the lock. On a fresh file that
    several processes open at once, SQLite answers "database is locked" at once, without its busy
    handler, when the switch meets another process's lock (seen on a loaded machine, about one trial
    in twenty); once the file is in WAL the statement changes nothing and takes no write lock."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    delay = 0.002
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
        sleep(delay)
        delay = min(delay * 2, 0.05)


def configure_connection(dbapi_connection: Any, sleep: Callable[[float], None] = time.sleep) -> None:
    """Every connection of the file, the engine's and the writer thread's: explicit BEGIN, a busy
    timeout for writers, WAL for concurrent readers, ``synchronous=NORMAL``."""
    dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
    cursor = dbapi_connection.cursor()
    # The busy timeout first: switching a fresh file to WAL takes a lock that another process
    # opening the same file at the same instant may hold.
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    _switch_to_wal(cursor, sleep)
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def configure_writer(conn: sqlite3.Connection) -> None:
    """The writer thread's connection: as every other (:func:`configure_connection`), and no automatic
    WAL checkpoint inside its commits (:class:`~._sqlite_thread.WalCheckpoints` runs them when it is idle)."""
    configure_connection(conn)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute(f"PRAGMA journal_size_limit={WAL_CAP_BYTES}")


def _async_sleep(seconds: float) -> None:
    await_only(asyncio.sleep(seconds))  # the connect hook runs under SQLAlchemy's async bridge


def configure_engine(engine: AsyncEngine) -> None:
    """WAL for concurrent readers, a busy timeout for writers, and explicit BEGIN control."""

    @sa_event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        configure_connection(dbapi_connection, _async_sleep)

    @sa_event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("calltape_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


class SqliteDb(Db):
    """Compiled queries through SQLAlchemy's driver-level execute on an open transaction."""

    conn: AsyncConnection

    def __init__(self, conn: AsyncConnection) -> None:
        super().__init__(conn, conn.dialect)

    async def fetch(self, query: Query, **params: Any) -> Sequence[Sequence[Any]]:
        sql, args = query.bind(self.dialect, params)
        return (await self.conn.exec_driver_sql(sql, args)).all()

    async def execute(self, query: Query, **params: Any) -> int:
        sql, args = query.bind(self.dialect, params)
        return int((await self.conn.exec_driver_sql(sql, args)).rowcount)

    async def executemany(self, query: Query, rows: Iterable[Mapping[str, Any]]) -> None:
        binds = [query.bind(self.dialect, r) for r in rows]
        if binds:
            await self.conn.exec_driver_sql(binds[0][0], [args for _, args in binds])

    async def fetch_sql(self, sql: str, args: Sequence[Any]) -> Sequence[Sequence[Any]]:
        """Rows of SQL text written for SQLite alone."""
        return (await self.conn.exec_driver_sql(sql, tuple(args))).all()

    async def insert_rows(self, sql: str, records: Sequence[Sequence[Any]]) -> None:
        """``executemany`` of ready-made positional rows."""
        await self.conn.exec_driver_sql(sql, list(records))


_READ = "SELECT seq, id, type, at_ms, agent, epoch, data FROM ct_events WHERE session = ? AND seq > ?"
"""The start of :meth:`SqliteEventStore.read`'s statement (columns in the order it builds events from)."""

_READ_TYPED = (
    "SELECT seq, id, type, at_ms, agent, epoch, data FROM ct_events INDEXED BY ct_events_session_type"
    " WHERE session = ? AND seq > ? AND type IN (SELECT value FROM json_each(?))"
)
""":data:`_READ` for a few types. Without statistics SQLite would walk the session on ``(session, seq)``
and test every row's type; the index of migration 0006 finds those rows alone."""


def _in_json(name: str) -> Any:
    """The values of a JSON array parameter, as a subquery for ``IN``."""
    return select(func.json_each(bindparam(name)).table_valued("value").c.value)


_ENSURE_SESSIONS = Query(
    lambda _: (
        insert(sessions)
        .values(
            session=bindparam("session"),
            tenant=bindparam("tenant"),
            status="active",
            last_seq=0,
            epoch=1,
            started=False,
        )
        .on_conflict_do_nothing()
    )
)
_SESSIONS_IN = Query(lambda _: select(*SESSION_COLUMNS).where(sessions.c.session.in_(_in_json("sessions"))))
_STORED_SQL = (
    "SELECT {columns} FROM json_each(?) AS k CROSS JOIN ct_events AS e "
    "ON e.session = k.value ->> 0 AND e.id = k.value ->> 1"
)
"""The stored events among a JSON array of ``[session, id]`` pairs: one statement for the whole batch,
each pair one probe of the ``(session, id)`` unique index (CROSS JOIN keeps the pairs the outer loop)."""
_STORED = _STORED_SQL.format(columns="e.session, e.seq, e.id, e.type, e.at_ms, e.agent, e.epoch, CAST(e.data AS TEXT)")
_STORED_KEYS = _STORED_SQL.format(columns="e.session, e.id")
_INSERT_EVENTS = Query(lambda _: insert(events).values({c.name: bindparam(c.name) for c in ROW_COLUMNS}))
_UPDATE_SESSIONS = Query(
    lambda _: (
        update(sessions)
        .where(sessions.c.session == bindparam("b_session"))
        .values({c.name: bindparam(c.name) for c in SESSION_COLUMNS[1:]})
    )
)


_DECIDE_AGAIN = (sqlite3.IntegrityError, InvalidEvent, FencedWrite, ConcurrencyConflict)
"""What an attempt planned without the stored events may meet for a duplicate it did not look up (a
second ``session.started``, a stored id): the attempt with them looked up decides it for real."""


class SqliteWriter(AppendWriter):
    """The append's steps on SQLite, inside a ``BEGIN IMMEDIATE`` transaction: on the engine's
    connection (an import) or on the writer thread's (:mod:`._sqlite_thread`, the store's appends)."""

    def __init__(
        self, db: SqliteDb | ThreadDb, tenant: str | None = None, everyone: bool = False, *, optimistic: bool = False
    ) -> None:
        self.db = db
        self.tenant = tenant
        self.everyone = everyone
        self.optimistic = optimistic
        """Plan as if no event of the batch were stored yet (no lookup): a stored duplicate then fails the
        insert on the ``(session, id)`` index, and the append is made again without this."""
        self._mine: set[str] = set()
        """Sessions :meth:`lock_sessions` found to be this store's: no need to ask again."""

    async def lock_sessions(self, sessions: Sequence[str]) -> dict[str, SessionInfo]:
        await self.db.executemany(_ENSURE_SESSIONS, [{"session": s, "tenant": self.tenant} for s in sessions])
        found = await self.db.fetch(_SESSIONS_IN, sessions=orjson.dumps(sessions).decode())
        rows = {r[0]: to_session_info(r) for r in found}
        refuse_foreign(rows.values(), self.tenant, self.everyone)  # what PostgreSQL's policies refuse
        self._mine.update(rows)
        return rows

    async def lookup(self, events: Sequence[Event], rows: dict[str, SessionInfo]) -> dict[Key, Event]:
        return {} if self.optimistic else await super().lookup(events, rows)

    async def _select(self, sql: str, keys: Sequence[Key]) -> Sequence[Sequence[Any]]:
        visible: dict[str, bool] = {}
        for session, _ in keys:
            if session not in visible:
                visible[session] = (
                    self.everyone or session in self._mine or await owns(self.db, session, self.tenant)
                )  # not this store's: it sees none of the session's events
        pairs = [key for key in keys if visible[key[0]]]
        return await self.db.fetch_sql(sql, (orjson.dumps(pairs).decode(),)) if pairs else []

    async def stored(self, keys: Sequence[Key]) -> dict[Key, Event]:
        return {(r[0], r[2]): to_event(r) for r in await self._select(_STORED, keys)}

    async def stored_keys(self, keys: Sequence[Key]) -> set[Key]:
        return {(r[0], r[1]) for r in await self._select(_STORED_KEYS, keys)}

    async def insert(self, events: Sequence[Event], rows: Mapping[str, SessionInfo]) -> None:
        sql = _INSERT_EVENTS.compiled(self.db.dialect)[0]  # parameters in ROW_COLUMNS order
        records = [
            (e.session, e.seq, e.id, e.type, e.at_ms, e.agent, e.epoch, dumps_data(e.data), rows[e.session].tenant)
            for e in events
        ]
        await self.db.insert_rows(sql, records)

    async def update_sessions(self, rows: Sequence[SessionInfo]) -> None:
        # Followers poll: SQLite has no notifications to send.
        await self.db.executemany(_UPDATE_SESSIONS, [{"b_session": r.session, **_fields(r)} for r in rows])


def _fields(row: SessionInfo) -> dict[str, Any]:
    return {c.name: getattr(row, c.name) for c in SESSION_COLUMNS}


_FEED = Query(
    lambda _: (
        select(events.c.pos, *EVENT_SELECT)
        .where(events.c.pos > bindparam("pos"))
        .order_by(events.c.pos)
        .limit(bindparam("limit"))
    )
)
_FEED_SESSION = Query(
    lambda _: (
        select(events.c.pos, *EVENT_SELECT)
        .where(events.c.pos > bindparam("pos"), events.c.session == bindparam("session"))
        .order_by(events.c.pos)
        .limit(bindparam("limit"))
    )
)
_HEAD = Query(lambda _: select(func.max(events.c.pos)))
_COUNT = Query(lambda _: select(func.count()).select_from(events).where(events.c.session == bindparam("session")))
_TRIM = Query(
    lambda _: delete(events).where(
        events.c.pos.in_(
            select(events.c.pos)
            .where(events.c.session == bindparam("session"))
            .order_by(events.c.seq.desc())
            .limit(bindparam("step"))
        )
    )
)
"""Deletes a session's newest ``step`` events: what stays visible meanwhile is a prefix of the call."""


def _feed_of(tenant: ColumnElement[bool]) -> Query:
    """The feed of the sessions whose tenant matches (a store that calltape keeps to its tenant)."""
    return Query(
        lambda _: (
            select(events.c.pos, *EVENT_SELECT)
            .where(events.c.pos > bindparam("pos"), events.c.session.in_(select(sessions.c.session).where(tenant)))
            .order_by(events.c.pos)
            .limit(bindparam("limit"))
        )
    )


_FEED_TENANT = _feed_of(sessions.c.tenant == bindparam("tenant"))
_FEED_UNTENANTED = _feed_of(sessions.c.tenant.is_(None))


# -- erasures seen across processes ------------------------------------------------------------
#
# SQLite has no notifications, and a query before every event a subscription hands out would cost more
# than the event. So every erase (and every rewrite by redaction), once committed, bumps a counter in a
# small file beside the database (``calltape.db-erasures``: eight bytes, no content, owner-only); a
# subscription reads it (one pread) before each event and reads its page again only when it moved.


def _open_counter(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


def bump_erasures(path: str) -> None:
    """Adds one to the erasure counter at ``path`` (under an exclusive lock: no increment is lost)."""
    fd = _open_counter(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        count = int.from_bytes(os.pread(fd, 8, 0), "little")
        os.pwrite(fd, (count + 1).to_bytes(8, "little"), 0)
    finally:
        os.close(fd)  # releases the lock


class SqliteWaiter(SleepWaiter):
    """Polls (SQLite cannot notify), and watches the database's erasure counter file. It never creates
    the file (a reader creates nothing): until the first erase does, the count is 0."""

    def __init__(self, counter: str | None) -> None:
        self._counter = counter
        self._fd: int | None = None
        self._blind = 0

    async def ready(self) -> None:
        """Opens the counter file if an erase has created it."""
        self._open()

    def _open(self) -> bool:
        if self._fd is None and self._counter is not None:
            try:
                self._fd = os.open(self._counter, os.O_RDONLY)
            except FileNotFoundError:
                return False
            except OSError as exc:
                if not self._blind:
                    log.warning("subscription: cannot watch for erasures (%s); checking every event", exc.strerror)
                self._blind += 1
                return False
        return self._fd is not None

    def erasures(self) -> int:
        """The counter file's value: 0 while there is none; without access, a new number every call (so
        every event is checked)."""
        if self._fd is None and not self._open():
            if self._blind:
                self._blind += 1
                return -self._blind
            return 0  # no erase yet (or an in-memory database: only this process erases, and counts it)
        assert self._fd is not None
        return int.from_bytes(os.pread(self._fd, 8, 0), "little")

    async def close(self) -> None:
        """Closes the counter file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class SqliteEventStore(SqlEventStore):
    """The embedded SQLite event log: writers take the lock up front, so ``pos`` is commit order."""

    dialect = "sqlite"

    def __init__(self, engine: AsyncEngine, url: str) -> None:
        self.engine = engine
        self.url = url
        database = make_url(url).database or ":memory:"
        self._erasure_counter = None if database == ":memory:" else f"{database}-erasures"
        """The file every erase bumps (None for an in-memory database, which no other process can open)."""
        self._writer = None if database == ":memory:" else WriterThread(database, configure_writer)
        """Where appends run (:mod:`._sqlite_thread`). An in-memory database is one shared-cache database
        behind a pool of one connection (``connect.py``): its appends stay on that connection, the only
        one that waits its turn instead of failing on the shared cache's table locks."""
        self._reads = None if database == ":memory:" else WriterThread(database, configure_connection)
        """Where reads run: a thread of their own with its own ``sqlite3`` connection, as the writer's (WAL
        lets it read while a write is under way), so a read is one hop to a thread and back where aiosqlite
        took one per statement, and never waits behind a write. An in-memory database reads on its one
        pooled connection."""
        self._checkpoints = None if database == ":memory:" else WalCheckpoints(database, configure_connection)
        """Checkpoints the WAL off the commit path (the writer's connection has no automatic checkpoint)."""
        self._appending = 0
        """Appends handed to the writer and not returned yet: none, the writer is idle."""

    @contextlib.asynccontextmanager
    async def _db(self, *, write: bool = False) -> AsyncIterator[SqliteDb]:
        async with translate_errors(self.url), self.engine.connect() as conn:
            if write:
                conn = await conn.execution_options(calltape_begin="IMMEDIATE")
            async with conn.begin():
                yield SqliteDb(conn)

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        events = checked_batch(events)
        if not events:
            return []
        events = admit(self._redact(events), self.tenant, self.all_tenants)
        if self._writer is None:
            async with self._db(write=True) as db:
                return await SqliteWriter(db, self.tenant, self.all_tenants).append(events, expected_seq)
        dialect, tenant, everyone, wal = self.engine.dialect, self.tenant, self.all_tenants, self._checkpoints

        def attempt(conn: sqlite3.Connection, optimistic: bool) -> list[Event]:
            writer = SqliteWriter(ThreadDb(conn, dialect), tenant, everyone, optimistic=optimistic)
            return in_transaction(conn, lambda: run_to_end(writer.append(events, expected_seq)))

        def append(conn: sqlite3.Connection) -> tuple[list[Event], tuple[int, int, int] | None]:
            # Planned first without looking up the batch's ids (a probe of the index per event, a tenth of
            # the writer's time); a duplicate of a stored event is rare (an event emitted again after a
            # reconnect): its insert fails and the batch is decided again with the stored events looked up.
            try:
                stored = attempt(conn, optimistic=True)
            except _DECIDE_AGAIN:
                stored = attempt(conn, optimistic=False)
            # past the cap (a writer that never idles): checkpoint here, before the appends queued behind
            return stored, checkpoint(conn) if wal is not None and wal.over_cap() else None

        self._appending += 1
        try:
            async with translate_errors(self.url):
                stored, inline = await self._writer.run(append)
        finally:
            self._appending -= 1
        if wal is not None:
            wal.committed(idle=not self._appending, inline=inline)
        return stored

    async def _write(self, job: Callable[[Db], Awaitable[T]]) -> T:
        # On the writer thread, as one job between two appends: through the engine the transaction held
        # the write lock across several hops of the event loop, and an append meeting it slept in
        # SQLite's busy handler (a live call's snapshot save made a slow turn every ~1,000 events).
        writer = self._writer
        if writer is None:
            return await super()._write(job)
        dialect = self.engine.dialect

        def write(conn: sqlite3.Connection) -> T:
            return in_transaction(conn, lambda: run_to_end(_coro(job(ThreadDb(conn, dialect)))))

        async with translate_errors(self.url):
            return await writer.run(write)

    async def _read_events(
        self, session: str, after_seq: int, to_seq: int | None, limit: int | None, types: Collection[str] | None
    ) -> list[Event]:
        reads = self._reads
        if reads is None:
            return await super()._read_events(session, after_seq, to_seq, limit, types)
        sql = _READ
        args: list[Any] = [session, after_seq]
        if types is not None:  # a few of the call's events: the rest is neither copied out nor decoded
            sql = _READ_TYPED
            args.append(orjson.dumps(list(types)).decode())
        if to_seq is not None:
            sql += " AND seq <= ?"
            args.append(to_seq)
        if self._filters():  # the session's tenant checked in the same statement (one snapshot, one step)
            sql += " AND EXISTS (SELECT 1 FROM ct_sessions s WHERE s.session = ? AND s.tenant IS ?)"
            args += (session, self.tenant)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        expected = limit if limit is not None else to_seq - after_seq if to_seq is not None else BULK

        def read(conn: sqlite3.Connection) -> list[Event]:
            with gc_paused(expected):
                rows = conn.execute(sql, args).fetchall()
                loads = orjson.loads
                events = [Event(r[2], loads(r[6]), session, r[1], r[3], r[4], r[5], r[0], True) for r in rows]
                del rows  # freed before the GC runs again (see PostgresEventStore.read)
            return events

        async with translate_errors(self.url):
            return await reads.run(read)

    async def _fetch(self, query: Query, **params: Any) -> Sequence[Sequence[Any]]:
        reads = self._reads
        if reads is None:
            return await super()._fetch(query, **params)
        sql, args = query.bind(self.engine.dialect, params)
        async with translate_errors(self.url):
            return await reads.run(lambda conn: conn.execute(sql, args).fetchall())

    async def _hidden(self, session: str) -> bool:
        reads = self._reads
        if reads is None or not self._filters():
            return await super()._hidden(session)
        dialect, tenant = self.engine.dialect, self.tenant
        async with translate_errors(self.url):
            return not await reads.run(lambda conn: run_to_end(owns(ThreadDb(conn, dialect), session, tenant)))

    async def feed(
        self, after: FeedPosition | None = None, *, limit: int = 1000, session: str | None = None
    ) -> list[tuple[FeedPosition, Event]]:
        pos = (after or FeedPosition(0, 0)).pos
        if session is not None and await self._hidden(session):
            return []
        if session is None and self._filters():
            query = _FEED_UNTENANTED if self.tenant is None else _FEED_TENANT
            rows = await self._fetch(query, pos=pos, tenant=self.tenant, limit=limit)
        elif session is None:
            rows = await self._fetch(_FEED, pos=pos, limit=limit)
        else:
            rows = await self._fetch(_FEED_SESSION, pos=pos, session=session, limit=limit)
        return [(FeedPosition(0, r[0]), to_event(r[1:])) for r in rows]

    async def head(self) -> FeedPosition:
        rows = await self._fetch(_HEAD)
        return FeedPosition(0, rows[0][0] or 0)

    def change_waiter(self) -> ChangeWaiter:
        return SqliteWaiter(self._erasure_counter)

    async def _erasure_committed(self) -> None:
        if self._erasure_counter is None:
            return
        try:
            bump_erasures(self._erasure_counter)
        except OSError as exc:
            log.warning(
                "erase: could not tell other processes' subscriptions (%s): they see it at their next page",
                exc.strerror,
            )

    async def erase_in_steps(self, session: str, step: int, *, before_ms: int | None = None) -> int | None:
        # Every writer of the file waits on one lock: a transaction deleting a long call in one go would
        # keep a live recorder waiting for all of it. So at most ``step`` rows per transaction, the lock
        # released between them (a count, a read, comes first: live writers get their turn meanwhile).
        # The first deleting transaction decides (a session revived since it was listed is kept); after
        # it, the erasure goes through: keeping a call whose newest events are gone would be worse.
        trimmed = 0
        visible = not await self._hidden(session)  # another tenant's: erase refuses it below
        while visible and (await self._fetch(_COUNT, session=session))[0][0] > step:
            async with self._db(write=True) as db:
                if not trimmed and not await self._still_due(db, session, before_ms):
                    return None
                trimmed += await db.execute(_TRIM, session=session, step=step)
            await asyncio.sleep(0)
        return await self._erase(session, trimmed, before_ms if not trimmed else None)

    async def close(self) -> None:
        try:
            if self._checkpoints is not None:
                await self._checkpoints.close()
            if self._reads is not None:
                await self._reads.close()
            if self._writer is not None:
                await self._writer.close()
        finally:
            await super().close()
