"""PostgreSQL backend: the production store.

SQLAlchemy owns the engine and the pool; the append and feed paths speak to the asyncpg connection
underneath (``driver_connection``) with array parameters, so one batch costs a fixed handful of round
trips whatever its size.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from typing import Any, Final

import asyncpg
import orjson
from sqlalchemy import Column
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from calltape.errors import CalltapeError, ConcurrencyConflict, FencedWrite, InvalidEvent, StoreUnavailable
from calltape.events import Event
from calltape.eventstore.append_plan import AppendPlan, SessionInfo, plan_append
from calltape.eventstore.errors import is_disconnect, translate_errors
from calltape.eventstore.queries import Db, Query, SqlEventStore, dumps_data, to_event, to_session_info
from calltape.eventstore.schema import EVENT_COLUMNS, ROW_COLUMNS, SESSION_COLUMNS
from calltape.eventstore.store import ChangeWaiter, FeedPosition, _AppendNotAhead, checked_batch
from calltape.eventstore.tenancy import (
    CHANNEL,
    ERASED,
    NOTIFY_TENANTS,
    admit,
    channel,
    refuse_foreign,
    tenant_settings,
)
from calltape.eventstore.writer import AppendWriter, Key
from calltape.gcpause import BULK, gc_paused


def _names(columns: Sequence[Column[Any]]) -> str:
    return ", ".join(c.name for c in columns)


def _arrays(columns: Sequence[Column[Any]], first: int = 1) -> str:
    """``unnest`` arguments: one array parameter per column, typed from the table."""
    dialect = PGDialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves it unannotated
    return ", ".join(f"${first + i}::{c.type.compile(dialect)}[]" for i, c in enumerate(columns))


# Whole columns travel as arrays (``unnest``): one round trip and one parse per batch, whatever its size.
_LOCK_SESSIONS = f"""
INSERT INTO ct_sessions (session, tenant, status, last_seq, epoch)
SELECT s, $2::text, 'active', 0, 1 FROM unnest($1::text[]) AS s ORDER BY s
ON CONFLICT (session) DO UPDATE SET session = EXCLUDED.session
RETURNING {_names(SESSION_COLUMNS)}
"""

_INSERT_EVENTS = f"""
INSERT INTO ct_events ({_names(ROW_COLUMNS)})
SELECT * FROM unnest({_arrays(ROW_COLUMNS)})
ON CONFLICT (session, id) DO NOTHING
"""

_UPDATE_SESSIONS = f"""
WITH v AS (
    SELECT * FROM unnest({_arrays(SESSION_COLUMNS)}) AS v({_names(SESSION_COLUMNS)})
), u AS (
    UPDATE ct_sessions s SET {", ".join(f"{c.name} = v.{c.name}" for c in SESSION_COLUMNS[1:])}
    FROM v WHERE s.session = v.session
)
{NOTIFY_TENANTS}
"""


def _known_append(with_events: bool) -> str:
    """The append of a writer that knows its sessions' rows (cached from its own last append, or as an
    append in flight will leave them): one statement writes the summaries, checked to be still the ones
    it planned against (each row's ``last_seq``: every change to a session row goes through an append
    that moves it), inserts the events (``with_events``) and NOTIFYs. The check is in the ``SET``, whose
    value ``RETURNING`` reports as the server computed it on the row's newest version, once any writer
    holding the row has finished (a ``WHERE`` is judged on the statement's snapshot first, so a row an
    append in flight is about to move would be skipped, not waited for; and the ``SET`` is computed on
    that snapshot's version first too, so it marks a mismatch with -1 rather than failing there). A row
    that moved (another writer, an erasure, another tenant's row, the append in flight this one was
    planned behind rolled back) makes the guard divide by zero, which aborts the whole statement:
    nothing is written and the append is decided again."""
    n = len(SESSION_COLUMNS)
    insert = f"INSERT INTO ct_events ({_names(ROW_COLUMNS)}) SELECT * FROM unnest({_arrays(ROW_COLUMNS, n + 2)})"
    events = f", e AS ({insert})" if with_events else ""
    sets = [
        f"{c.name} = v.{c.name}"
        if c.name != "last_seq"
        else "last_seq = CASE WHEN s.last_seq = v.old_last_seq THEN v.last_seq ELSE -1 END"
        for c in SESSION_COLUMNS[1:]
    ]
    return f"""
WITH v AS (
    SELECT * FROM unnest({_arrays(SESSION_COLUMNS)}, ${n + 1}::int[]) AS v({_names(SESSION_COLUMNS)}, old_last_seq)
), u AS (
    UPDATE ct_sessions s SET {", ".join(sets)}
    FROM v WHERE s.session = v.session
    RETURNING s.last_seq
){events}, guard AS (
    SELECT 1 / (CASE WHEN (SELECT count(*) FROM u WHERE last_seq >= 0) = (SELECT count(*) FROM v)
                THEN 1 ELSE 0 END) AS ok
)
{NOTIFY_TENANTS}, guard WHERE guard.ok = 1
"""


_KNOWN_APPEND = _known_append(with_events=True)
_KNOWN_SUMMARIES = _known_append(with_events=False)
_BEGIN_BEHIND = "BEGIN; SET LOCAL lock_timeout = '500ms'"

COPY_FROM: Final = 200
"""A batch of this many events or more goes in by COPY (cheaper per row than arrays, one round trip more)."""

DEADLOCK_RETRIES: Final = 3
"""How many times an append the server picked to break a deadlock is decided again before it raises."""

SESSION_CACHE: Final = 20_000
"""Session rows a store remembers from its own appends (least recently written dropped first)."""

_KEYS = "unnest($1::text[], $2::text[]) AS k(session, id) USING (session, id)"
_FIND_STORED = f"SELECT {_names(EVENT_COLUMNS[:-1])}, data::text FROM ct_events JOIN {_KEYS}"
_FIND_STORED_KEYS = f"SELECT session, id FROM ct_events JOIN {_KEYS}"
_COPY_COLUMNS = [c.name for c in ROW_COLUMNS]

_FEED = f"""
SELECT txid::text::bigint AS txid, pos, {_names(EVENT_COLUMNS[:-1])}, data::text FROM ct_events
WHERE (txid, pos) > ($1::text::xid8, $2) AND txid < pg_snapshot_xmin(pg_current_snapshot())
  AND ($4::text IS NULL OR session = $4)
  AND ($5::text IS NULL OR EXISTS (
      SELECT 1 FROM ct_sessions s WHERE s.session = ct_events.session AND coalesce(s.tenant, '') = $5))
ORDER BY txid, pos LIMIT $3
"""
"""``$5``: the tenant calltape keeps the feed to (``''``: none) for a role that row-level security does not
hold; NULL when the database keeps it (or for a store opened for every tenant)."""


@functools.cache
def read_sql(bounded: bool, limited: bool, owner: bool, decoded: bool, typed: bool = False) -> str:
    """A session's events after a seq (``bounded``: to a seq; ``limited``: at most so many), in the order
    :meth:`PostgresEventStore.read` builds them from; parameters in that order, after the session and
    the first seq. ``owner``: only while the session is the last parameter's tenant (``NULL``: a session
    without one), checked in the same statement (calltape keeps the store to its tenant for a role that
    row-level security does not hold), where it was a query and a pool checkout of its own per read.
    ``decoded``: ``data`` as ``jsonb``, for the read connection, whose driver decodes it (see
    :func:`_decoding`); otherwise as JSON text. ``typed``: only the types of a ``text[]`` parameter, the
    first after the first seq (filtered by the server: the rest of the call is neither sent nor decoded)."""
    data = "data" if decoded else "data::text"
    sql = f"SELECT seq, id, type, at_ms, agent, epoch, {data} FROM ct_events WHERE session = $1 AND seq > $2"
    n = 2
    if typed:
        n += 1
        sql += f" AND type = ANY(${n}::text[])"
    if bounded:
        n += 1
        sql += f" AND seq <= ${n}"
    limit = ""
    if limited:
        n += 1
        limit = f" LIMIT ${n}"
    if owner:
        n += 1
        owned = f"SELECT 1 FROM ct_sessions s WHERE s.session = $1 AND s.tenant IS NOT DISTINCT FROM ${n}::text"
        sql += f" AND EXISTS ({owned})"
    return sql + " ORDER BY seq" + limit


class _StoredDuplicate(Exception):
    """The optimistic insert met an id the session already has: replan with the stored events."""


class _RowsMoved(Exception):
    """A session row moved since the writer knew it (Citus's known-rows append finds it so)."""


_DECIDE_AGAIN = (
    _StoredDuplicate,
    _RowsMoved,
    asyncpg.UniqueViolationError,  # a stored duplicate id (or seq: another writer got there first)
    asyncpg.DivisionByZeroError,  # the known-rows guard: a session row moved since it was cached
    asyncpg.DeadlockDetectedError,
    InvalidEvent,
    FencedWrite,
    ConcurrencyConflict,
)
"""What an optimistic attempt may meet that the locked, looked-up attempt decides for real."""


def _rowcount(status: str) -> int:
    """Rows changed, from a command status such as ``DELETE 3`` or ``INSERT 0 3``."""
    return int(status.rsplit(" ", 1)[1])


class _PgDb(Db):
    """Compiled queries on the asyncpg connection under SQLAlchemy's pool."""

    conn: asyncpg.Connection

    async def fetch(self, query: Query, **params: Any) -> Sequence[Sequence[Any]]:
        sql, args = query.bind(self.dialect, params)
        return await self.conn.fetch(sql, *args)  # type: ignore[no-any-return]

    async def execute(self, query: Query, **params: Any) -> int:
        sql, args = query.bind(self.dialect, params)
        return _rowcount(await self.conn.execute(sql, *args))

    async def executemany(self, query: Query, rows: Iterable[Mapping[str, Any]]) -> None:
        binds = [query.bind(self.dialect, r) for r in rows]
        if binds:
            await self.conn.executemany(binds[0][0], [args for _, args in binds])

    async def rebuildable(self) -> None:
        """``synchronous_commit`` off for this transaction: a snapshot save no longer waits for the disk
        (the WAL writer flushes it within ``wal_writer_delay``; a later durable commit flushes it first)."""
        await self.conn.execute("SET LOCAL synchronous_commit TO off")


class PgWriter(AppendWriter):
    """The append's steps on PostgreSQL: arrays in, COPY for the rows."""

    def __init__(
        self, conn: asyncpg.Connection, *, tenant: str | None = None, copy_in: bool = True, everyone: bool = False
    ) -> None:
        self.conn = conn
        self.tenant = tenant
        self.copy_in = copy_in
        """PostgreSQL refuses COPY FROM to a role held by row-level security: such a role INSERTs."""
        self.everyone = everyone

    async def lock_sessions(self, sessions: Sequence[str]) -> dict[str, SessionInfo]:
        rows = {r[0]: to_session_info(r) for r in await self.conn.fetch(_LOCK_SESSIONS, sessions, self.tenant)}
        # Row-level security refuses another tenant's rows before this; a role that bypasses it is held here.
        refuse_foreign(rows.values(), self.tenant, self.everyone)
        return rows

    async def stored(self, keys: Sequence[Key]) -> dict[Key, Event]:
        rows = await self.conn.fetch(_FIND_STORED, [k[0] for k in keys], [k[1] for k in keys])
        return {(r[0], r[2]): to_event(r) for r in rows}

    async def stored_keys(self, keys: Sequence[Key]) -> set[Key]:
        rows = await self.conn.fetch(_FIND_STORED_KEYS, [k[0] for k in keys], [k[1] for k in keys])
        return {(r[0], r[1]) for r in rows}

    async def insert(self, events: Sequence[Event], rows: Mapping[str, SessionInfo]) -> None:
        if not self.copy_in or len(events) < COPY_FROM:  # (a COPY costs a round trip more: few rows go as arrays)
            if await self.insert_new(events, rows) != len(events):
                raise _StoredDuplicate
            return
        # COPY is the cheapest way in; a stored duplicate id aborts it (unique violation).
        records = [
            (e.session, e.seq, e.id, e.type, e.at_ms, e.agent, e.epoch, dumps_data(e.data), rows[e.session].tenant)
            for e in events
        ]
        await self.conn.copy_records_to_table("ct_events", records=records, columns=_COPY_COLUMNS)

    async def insert_new(self, events: Sequence[Event], rows: Mapping[str, SessionInfo]) -> int:
        """Inserts, skipping ids already stored; returns how many were written."""
        return _rowcount(await self.conn.execute(_INSERT_EVENTS, *self._event_columns(events, rows)))

    async def update_sessions(self, rows: Sequence[SessionInfo]) -> None:
        await self.conn.execute(_UPDATE_SESSIONS, *([getattr(r, c.name) for r in rows] for c in SESSION_COLUMNS))

    async def insert_and_update(self, events: Sequence[Event], rows: Mapping[str, SessionInfo]) -> None:
        """The optimistic write under the locks: :meth:`insert` (a stored id raises), then the summaries
        (Citus writes both in one statement per shard)."""
        await self.insert(events, rows)
        await self.update_sessions(list(rows.values()))

    def _event_columns(self, events: Sequence[Event], rows: Mapping[str, SessionInfo]) -> list[list[Any]]:
        """``ROW_COLUMNS`` as arrays: the events' columns, then each one's session's tenant."""
        columns = [[getattr(e, c.name) for e in events] for c in EVENT_COLUMNS[:-1]]
        columns.append([dumps_data(e.data) for e in events])
        columns.append([rows[e.session].tenant for e in events])
        return columns

    async def append_known(self, plan: AppendPlan, known: Mapping[str, SessionInfo]) -> None:
        """Writes a plan made against ``known`` session rows: one statement (summaries checked and
        written, events inserted, NOTIFY), or for a large batch that statement's summaries and a COPY in
        one transaction. Raises ``DivisionByZeroError`` when a row is no longer what ``known`` says."""
        summaries = self._summaries(plan, known)
        if len(plan.inserts) < COPY_FROM or not self.copy_in:
            await self.conn.execute(_KNOWN_APPEND, *summaries, *self._event_columns(plan.inserts, plan.rows))
            return
        async with self.conn.transaction():
            await self.conn.execute(_KNOWN_SUMMARIES, *summaries)
            await self.insert(plan.inserts, plan.rows)

    async def append_behind(self, plan: AppendPlan, known: Mapping[str, SessionInfo]) -> None:
        """:meth:`append_known` for a plan made against the rows an append in flight will leave: the
        events go in first, beside that append's (the server does both at once), then the summaries,
        which wait for its row locks and check it left what was planned. ``lock_timeout`` bounds that
        wait, so a lock cycle with a writer that took the rows first (and waits on these events' unique
        keys) ends in well under the server's deadlock check."""
        summaries = self._summaries(plan, known)
        conn = self.conn
        await conn.execute(_BEGIN_BEHIND)  # (one round trip for both: asyncpg's transaction() sends BEGIN alone)
        try:
            await self.insert(plan.inserts, plan.rows)
            await conn.execute(_KNOWN_SUMMARIES, *summaries)
        except BaseException:
            if not conn.is_closed():
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
            raise
        await conn.execute("COMMIT")

    @staticmethod
    def _summaries(plan: AppendPlan, known: Mapping[str, SessionInfo]) -> list[list[Any]]:
        """``SESSION_COLUMNS`` as arrays, then each row's ``last_seq`` as planned against."""
        # in session order, as lock_sessions takes them: the update locks rows in the order it meets them
        rows = sorted(plan.rows.values(), key=lambda r: r.session)
        summaries = [[getattr(r, c.name) for r in rows] for c in SESSION_COLUMNS]
        summaries.append([known[r.session].last_seq for r in rows])
        return summaries


class PostgresEventStore(SqlEventStore):
    """The PostgreSQL event log: the feed ordered by ``(txid, pos)``, LISTEN/NOTIFY wake-ups."""

    dialect = "postgresql"
    copy_in = True
    """Whether appends may COPY (not for a role held by row-level security; set by ``open_store``)."""
    held_by_rls = False
    """Whether row-level security holds the connected role (set by ``open_store``): then the database keeps
    the store to its tenant, otherwise calltape filters as on SQLite."""
    writer_class: type[PgWriter] = PgWriter
    """The append's steps (Citus routes them its own way: see :mod:`.citus`)."""
    durable_lanes = 4
    """Appends of different sessions commit side by side, each on a pooled connection of its own (the
    session rows are the only locks an append takes); four lanes, the batch, the batch ahead of it and
    the read connection keep within the pool's 15 (5 kept, 10 overflow)."""
    pipelines = True
    """The recorder writes its next batch while one is in flight (:meth:`append_ahead`)."""
    inline_owner = True
    """Whether a read checks the session's tenant inside its own statement (Citus asks first, apart: a
    statement is routed to one shard only when every table in it is pinned to the session)."""
    _held: tuple[AsyncConnection, asyncpg.Connection, asyncio.AbstractEventLoop] | None = None
    """The connection reads run on (see :meth:`_reader`), with the loop it belongs to."""
    _held_busy = False

    def __init__(self, engine: AsyncEngine, url: str) -> None:
        self.engine = engine
        self.url = url
        self._known: dict[str, SessionInfo] = {}
        """Session rows as this store's own appends left them, oldest first: a batch whose sessions are
        all here is planned against them and written in one statement that checks they still hold."""
        self._ahead: dict[str, SessionInfo] = {}
        """Session rows as the appends in flight will leave them (see :meth:`append_ahead`)."""
        self._behind: set[asyncio.Future[None]] = set()
        """The :meth:`append_ahead` writes in flight, each done when its transaction has ended."""

    async def session_info(self, session: str) -> SessionInfo | None:
        """The session's summary; also kept as this store's known row of it (a resume reads it before
        its append, which is then one guarded statement, not a locked one: a row that moved since is
        found by the guard, and the append is decided again under the lock)."""
        info = await super().session_info(session)
        if info is not None and info.last_seq > 0 and (self.all_tenants or info.tenant == self.tenant):
            if session not in self._ahead:
                self._remember({session: info.copy()})
        return info

    def _known_rows(self, sessions: Sequence[str]) -> dict[str, SessionInfo] | None:
        known = self._known
        rows = {s: row for s in sessions if (row := known.get(s)) is not None}
        return rows if len(rows) == len(sessions) else None

    def _remember(self, rows: Mapping[str, SessionInfo]) -> None:
        known = self._known
        for session, row in rows.items():
            old = known.pop(session, None)
            if old is not None and old.last_seq > row.last_seq:
                row = old  # an append that committed after this one (ahead of it) left it newer
            if row.last_seq > 0:  # a row only locked, never written, may still be another writer's to start
                known[session] = row
        while len(known) > SESSION_CACHE:
            del known[next(iter(known))]

    def _forget(self, sessions: Iterable[str]) -> None:
        for session in sessions:
            self._known.pop(session, None)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        async with translate_errors(self.url, tenant=self.tenant), self.engine.connect() as sa_conn:
            raw = await sa_conn.get_raw_connection()
            conn = raw.driver_connection
            assert conn is not None
            try:
                yield conn
            except BaseException as exc:
                if is_disconnect(exc) or conn.is_closed():
                    await sa_conn.invalidate()  # never hand a dead connection to the next caller
                raise

    @contextlib.asynccontextmanager
    async def _reader(self) -> AsyncIterator[tuple[asyncpg.Connection, bool]]:
        """The store's own read connection, taken from the pool once and kept (a pool checkout and its
        context managers cost a read of a few events more than its query), and whether it decodes
        ``jsonb`` itself (it does: see :func:`_decoding`). A read that finds it busy, or runs on another
        event loop than the one it was opened on, checks one out of the pool as before (``data`` read
        as text there). A connection that failed under a read is closed, never kept."""
        loop = asyncio.get_running_loop()
        held = self._held
        if self._held_busy or (held is not None and held[2] is not loop):
            async with self._connection() as conn:
                yield conn, False
            return
        self._held_busy = True
        try:
            async with translate_errors(self.url, tenant=self.tenant):
                if held is None or held[1].is_closed():
                    if held is not None:
                        self._held = None
                        await _release(held)
                    sa_conn = await self.engine.connect()
                    try:
                        conn = (await sa_conn.get_raw_connection()).driver_connection
                        assert conn is not None
                        await _decoding(conn)
                    except BaseException:
                        await _release((sa_conn, None, loop))
                        raise
                    held = self._held = (sa_conn, conn, loop)
                try:
                    yield held[1], True
                except BaseException as exc:
                    # A query error leaves the connection as it was; a lost connection, or a read
                    # cancelled mid-result, may not: the next read starts on a fresh one.
                    if isinstance(exc, asyncpg.PostgresError) and not held[1].is_closed():
                        raise
                    self._held = None
                    await _release(held)
                    raise
        finally:
            self._held_busy = False

    def tenant_scope(self) -> str | None:
        """The statement that hands this connection's tenant to the other nodes a transaction reaches,
        run first in every transaction; None on a single node (the connection-start setting is read
        where the rows are). Citus overrides it: its workers never see the coordinator's setting."""
        return None

    @contextlib.asynccontextmanager
    async def transaction(self, conn: asyncpg.Connection) -> AsyncIterator[None]:
        """A transaction on ``conn``, with the tenant handed on where it must be (:meth:`tenant_scope`)."""
        scope = self.tenant_scope()
        async with conn.transaction():
            if scope is not None:
                await conn.execute(scope)
            yield

    @contextlib.asynccontextmanager
    async def reading(self, conn: asyncpg.Connection) -> AsyncIterator[None]:
        """Where reads outside a write run: as they are on a single node; in a :meth:`transaction` when
        the tenant must be handed on (a statement on its own would reach the workers without it)."""
        if self.tenant_scope() is None:
            yield
            return
        async with self.transaction(conn):
            yield

    def appending(
        self, conn: asyncpg.Connection, writer: PgWriter, tenants: Iterable[str | None], *, known: bool
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """The transaction an append writes in, for rows of ``tenants`` (the store's guess for an append
        under the locks: the writer wakes any other tenant's followers itself; read only on Citus). On a single node the
        known-rows append (``known``) is one statement, a transaction of its own, and every append's
        statements wake the followers; Citus writes in several statements (see :mod:`.citus`)."""
        return contextlib.nullcontext() if known else self.transaction(conn)

    @contextlib.asynccontextmanager
    async def _db(self, *, write: bool = False) -> AsyncIterator[Db]:
        if not write:  # reads (summaries, snapshots, tenancy checks) run on the read connection
            async with self._reader() as (conn, _), self.reading(conn):
                yield _PgDb(conn, self.engine.dialect)
            return
        async with self._connection() as conn:
            async with self.transaction(conn):
                yield _PgDb(conn, self.engine.dialect)

    # -- writing -----------------------------------------------------------------------------

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        events = checked_batch(events)
        if not events:
            return []
        events = admit(self._redact(events), self.tenant, self.all_tenants)
        sessions = sorted({e.session for e in events})
        known = self._known_rows(sessions)
        self._forget(sessions)  # remembered again below only from a committed append
        plan: AppendPlan | None = None
        first = 0
        if known is not None:
            # The writer's own sessions, as its last append left them: planned before any await, so an
            # append ahead of this one (:meth:`append_ahead`) can plan against what this one leaves.
            try:
                plan = plan_append(events, known, {}, expected_seq)
            except _DECIDE_AGAIN:
                first = 1  # decided again under the locks, with the stored events looked up
        held = self._hold_ahead(known, plan)
        try:
            async with self._connection() as conn:
                writer = self.writer_class(conn, tenant=self.tenant, copy_in=self.copy_in, everyone=self.all_tenants)
                if plan is not None:
                    assert known is not None  # (planned against them)
                    # Written in one statement that checks the rows still hold (no lock, no lookup).
                    try:
                        async with self.appending(conn, writer, (r.tenant for r in known.values()), known=True):
                            await writer.append_known(plan, known)
                        self._remember({**known, **plan.rows})
                        return plan.results
                    except _DECIDE_AGAIN:
                        first = 1
                        # A write planned behind this one ends (its check fails) before this one takes
                        # the locks: it holds unique keys this one may be about to insert.
                        await self._behind_settled()
                return await self._append_locked(conn, writer, events, sessions, expected_seq, first)
        finally:
            self._release_ahead(held)

    async def _append_locked(
        self,
        conn: asyncpg.Connection,
        writer: PgWriter,
        events: Sequence[Event],
        sessions: list[str],
        expected_seq: int | None,
        attempt: int,
    ) -> list[Event]:
        """The append under the session locks. Attempt 0 is optimistic: no stored duplicates (one round
        trip fewer). Any surprise (an insert that met a stored id, or a rule that failed) is decided
        again, for real, with the stored events looked up under the same session locks."""
        deadlocks = 0
        while True:
            try:
                async with self.appending(conn, writer, {self.tenant}, known=False):
                    rows = await writer.lock_sessions(sessions)
                    stored = await writer.lookup(events, rows) if attempt else {}
                    plan = plan_append(events, rows, stored, expected_seq)
                    if plan.inserts:
                        if not attempt:
                            await writer.insert_and_update(plan.inserts, plan.rows)
                        else:
                            if await writer.insert_new(plan.inserts, plan.rows) != len(plan.inserts):
                                raise _StoredDuplicate
                            await writer.update_sessions(list(plan.rows.values()))
                self._remember({**rows, **plan.rows})
                return plan.results
            except asyncpg.DeadlockDetectedError:
                # The server broke a lock cycle with another writer by rolling this transaction back
                # whole: nothing of it was written, so it is decided again under the locks.
                deadlocks += 1
                if deadlocks > DEADLOCK_RETRIES:
                    raise
                attempt = 1
            except _DECIDE_AGAIN:
                if attempt:
                    raise
                attempt = 1

    async def append_ahead(self, events: Sequence[Event]) -> list[Event]:
        """Planned against the rows the appends in flight will leave (or this store's own last ones) and
        written in one transaction (:meth:`PgWriter.append_behind`): the events beside those appends',
        then the summaries, which wait for their row locks and commit only if they left what was
        planned. Raises :class:`_AppendNotAhead`, having written nothing, when its sessions are not all
        known or the rows turn out otherwise."""
        events = checked_batch(events)
        if not events:
            return []
        events = admit(self._redact(events), self.tenant, self.all_tenants)
        sessions = sorted({e.session for e in events})
        ahead, known = self._ahead, self._known
        rows: dict[str, SessionInfo] = {}
        for session in sessions:
            row = ahead.get(session) or known.get(session)
            if row is None:
                raise _AppendNotAhead
            rows[session] = row
        try:
            plan = plan_append(events, rows, {}, None)
        except CalltapeError as exc:
            raise _AppendNotAhead from exc
        self._forget(sessions)
        held = self._hold_ahead(rows, plan)
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._behind.add(ended)
        try:
            async with self._connection() as conn:
                writer = self.writer_class(conn, tenant=self.tenant, copy_in=self.copy_in, everyone=self.all_tenants)
                try:
                    await writer.append_behind(plan, rows)
                except (*_DECIDE_AGAIN, asyncpg.LockNotAvailableError) as exc:
                    raise _AppendNotAhead from exc
        finally:
            self._behind.discard(ended)
            ended.set_result(None)
            self._release_ahead(held)
        self._remember({**rows, **plan.rows})
        return plan.results

    async def _behind_settled(self) -> None:
        """Waits until the :meth:`append_ahead` writes now in flight have ended."""
        if self._behind:
            await asyncio.wait(list(self._behind))

    def _hold_ahead(self, known: Mapping[str, SessionInfo] | None, plan: AppendPlan | None) -> dict[str, SessionInfo]:
        """Marks the rows an append in flight will leave, for :meth:`append_ahead`; returns what it marked."""
        if known is None or plan is None:
            return {}
        held = {**known, **plan.rows}
        self._ahead.update(held)
        return held

    def _release_ahead(self, held: Mapping[str, SessionInfo]) -> None:
        ahead = self._ahead
        for session, row in held.items():
            if ahead.get(session) is row:
                del ahead[session]

    # -- reading -----------------------------------------------------------------------------

    async def _read_events(
        self, session: str, after_seq: int, to_seq: int | None, limit: int | None, types: Collection[str] | None
    ) -> list[Event]:
        owner = self._filters()
        if owner and not self.inline_owner and await self._hidden(session):
            return []
        args: list[Any] = [session, after_seq]
        typed = types is not None
        if types is not None:
            args.append(list(types))
        if to_seq is not None:
            args.append(to_seq)
        if limit is not None:
            args.append(limit)
        inline = owner and self.inline_owner
        if inline:
            args.append(self.tenant)
        bounded, limited = to_seq is not None, limit is not None
        expected = limit if limit is not None else to_seq - after_seq if to_seq is not None else BULK
        # The cyclic GC is paused over the fetch too: the driver's rows are as many acyclic objects as
        # the events, and collections they trigger would rescan everything the process holds.
        with gc_paused(expected):
            async with self._reader() as (conn, decoded), self.reading(conn):
                rows = await conn.fetch(read_sql(bounded, limited, inline, decoded, typed), *args)
            if decoded:  # the driver decoded ``data`` as each row arrived, while the server was still sending
                events = [Event(r[2], r[6], session, r[1], r[3], r[4], r[5], r[0], True) for r in rows]
            else:
                loads = orjson.loads
                events = [Event(r[2], loads(r[6]), session, r[1], r[3], r[4], r[5], r[0], True) for r in rows]
            # Dropped here, but freed only when this task next suspends: asyncio keeps the callback that
            # woke it, and through the driver's finished future the rows. The pause hands them to the
            # oldest generation with the events (see calltape.gcpause), so no young collection scans them.
            del rows
        return events

    async def feed(
        self, after: FeedPosition | None = None, *, limit: int = 1000, session: str | None = None
    ) -> list[tuple[FeedPosition, Event]]:
        after = after or FeedPosition(0, 0)
        if session is not None and await self._hidden(session):
            return []
        scope = (self.tenant or "") if self._filters() else None
        async with self._connection() as conn, self.reading(conn):
            rows = await self._feed_rows(conn, (str(after.txid), after.pos, limit, session, scope))
        return [(FeedPosition(r[0], r[1]), to_event(r[2:])) for r in rows]

    async def _feed_rows(self, conn: Any, args: tuple[Any, ...]) -> list[Any]:
        """The feed's query (``$1`` to ``$5``); Citus reads its horizon on the coordinator first."""
        return list(await conn.fetch(_FEED, *args))

    async def head(self) -> FeedPosition:
        # Not the newest row: a transaction still in flight may hold a lower txid, and its events would
        # land behind that position. (xmin, 0) is after every settled row and before every row of a
        # transaction that was still running (or not yet begun) — exactly the feed's own horizon.
        async with self._connection() as conn:
            xmin = await conn.fetchval("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
        return FeedPosition(int(xmin), 0)

    def change_waiter(self) -> ChangeWaiter:
        return _NotifyWaiter(self.url, self.tenant)

    async def close(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            if held[2] is asyncio.get_running_loop():
                await _release(held)
            else:
                held[1].terminate()  # its loop is not this one: nothing can be awaited on it here
        await super().close()

    def _filters(self) -> bool:
        return not self.held_by_rls and super()._filters()

    async def _announce_erasure(self, db: Db, tenant: str | None) -> None:
        # Delivered at commit to every LISTENing subscription that could hold the session's events.
        assert isinstance(db, _PgDb)
        await db.conn.execute(_ANNOUNCE_ERASURE, CHANNEL, channel(tenant), ERASED)


async def _decoding(conn: asyncpg.Connection) -> None:
    """Has the driver decode ``jsonb`` (as text, with orjson) as each row arrives: in C, and while the
    server is still sending the rest, where a text column was decoded in a Python loop after the last row.
    Only the store's own read connection decodes so; the pool never gets it back (:func:`_release`)."""
    await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=dumps_data, decoder=orjson.loads, format="text")


async def _release(held: tuple[AsyncConnection, asyncpg.Connection | None, Any]) -> None:
    """Closes a kept read connection: invalidated, so the pool never hands out its ``jsonb`` decoding."""
    with contextlib.suppress(Exception):
        await held[0].invalidate()
        await held[0].close()


_ANNOUNCE_ERASURE = "SELECT pg_notify(c, $3) FROM (VALUES ($1::text), ($2::text)) AS channels(c)"


class _NotifyWaiter(ChangeWaiter):
    """LISTEN on a dedicated connection; reconnects lazily after it is lost (readers poll meanwhile).

    An erasure's or a redaction's notification (payload :data:`ERASED`) moves :meth:`erasures`; so does
    every moment the connection is not listening, since one then could go unheard."""

    def __init__(self, url: str, tenant: str | None = None) -> None:
        self._dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._tenant = tenant
        self._conn: asyncpg.Connection | None = None
        self._woken = asyncio.Event()
        self._erasures = 0

    def _on_notify(self, _conn: object, _pid: object, _channel: object, payload: object) -> None:
        if payload == ERASED:
            self._erasures += 1
        self._woken.set()

    async def ready(self) -> None:
        """LISTENs now, before the subscription's first read."""
        await self._ensure()

    def erasures(self) -> int:
        """Erasures heard; while not listening, a new number every call (every event is checked)."""
        if self._conn is None or self._conn.is_closed():
            self._erasures += 1
        return self._erasures

    async def _ensure(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            return
        self._conn = None
        try:
            conn = await asyncpg.connect(self._dsn, timeout=5, server_settings=tenant_settings(self._tenant))
            await conn.add_listener(channel(self._tenant), self._on_notify)
        except (TimeoutError, OSError, asyncpg.PostgresError):
            return
        conn.add_termination_listener(lambda _c: self._woken.set())
        self._conn = conn
        self._woken.set()  # anything committed while we were away: read again at once

    async def wait(self, seconds: float) -> None:
        await self._ensure()
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancellation that arrives as the
        # wait ends (a NOTIFY), and a subscriber stopped at that instant (tail on SIGTERM) waited forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._woken.wait()
        self._woken.clear()

    async def close(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=2)
        self._conn = None


__all__ = ["PostgresEventStore", "StoreUnavailable"]
