"""The store queries both backends share, written once in SQLAlchemy Core over :mod:`schema`.

A :class:`Query` is built for a dialect on first use and compiled once, to SQL text and the order of
its parameters; after that a call costs a dict lookup and the driver's own execute (asyncpg on
PostgreSQL, SQLite through SQLAlchemy's driver-level execute), with rows read by position: no
per-row ORM objects on the read path. A backend supplies only a :class:`Db` (how to run a compiled
query on its connection) and the paths where speed needs its own SQL: the append, the feed and its
wake-ups (see ``postgres.py`` and ``sqlite.py``).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from functools import cache
from typing import Any, TypeVar

import orjson
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    LargeBinary,
    Text,
    any_,
    bindparam,
    cast,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import ClauseElement

from calltape.errors import SessionNotFound
from calltape.events import Event, load_stored, now_ms
from calltape.eventstore.append_plan import SessionInfo
from calltape.eventstore.schema import SESSION_COLUMNS, events, sessions, snapshots, tombstones
from calltape.eventstore.store import EventStore, Tombstone, note_erasure
from calltape.gcpause import gc_paused

Builder = Callable[[str], ClauseElement]
"""Builds a statement for a dialect name (``postgresql`` or ``sqlite``)."""


class Query:
    """A Core statement, built and compiled once per dialect; run through a :class:`Db`."""

    __slots__ = ("_build", "_compiled")

    def __init__(self, build: Builder) -> None:
        self._build = build
        self._compiled: dict[type[Dialect], tuple[str, tuple[str, ...], dict[str, Any]]] = {}

    def compiled(self, dialect: Dialect) -> tuple[str, tuple[str, ...], dict[str, Any]]:
        """SQL text in the driver's parameter style, parameter names in order, and bound defaults."""
        found = self._compiled.get(type(dialect))  # one per driver: they differ in parameter style
        if found is None:
            compiled = self._build(dialect.name).compile(dialect=dialect)
            names = tuple(getattr(compiled, "positiontup", None) or ())
            found = self._compiled[type(dialect)] = (str(compiled), names, compiled.params)
        return found

    def bind(self, dialect: Dialect, params: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """The SQL and its positional parameters for ``params`` (named)."""
        sql, names, defaults = self.compiled(dialect)
        return sql, tuple(params[n] if n in params else defaults[n] for n in names)


def insert_for(dialect: str) -> Any:
    """The dialect's ``insert`` (it carries ``on_conflict_do_nothing`` / ``on_conflict_do_update``)."""
    return postgresql.insert if dialect == "postgresql" else sqlite_dialect.insert


T = TypeVar("T")


class Db(ABC):
    """One connection (inside a transaction when opened for writing), running compiled queries.

    A backend's subclass narrows ``conn`` to its driver's connection."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn = conn
        self.dialect = dialect

    @abstractmethod
    async def fetch(self, query: Query, **params: Any) -> Sequence[Sequence[Any]]:
        """The rows, each indexable by position in the query's column order."""

    async def fetchrow(self, query: Query, **params: Any) -> Sequence[Any] | None:
        """The first row, or None."""
        rows = await self.fetch(query, **params)
        return rows[0] if rows else None

    @abstractmethod
    async def execute(self, query: Query, **params: Any) -> int:
        """Runs a statement; returns how many rows it changed."""

    @abstractmethod
    async def executemany(self, query: Query, rows: Iterable[Mapping[str, Any]]) -> None:
        """Runs a statement once per parameter set."""

    async def rebuildable(self) -> None:
        """Marks this write transaction as holding only what the log rebuilds (snapshots): a backend
        may then acknowledge its commit before it is on disk (a crash can lose it, never an event)."""
        return None


def dumps_data(data: Any) -> str:
    """An event's ``data`` as stored (JSON text; PostgreSQL converts it to ``jsonb``)."""
    return orjson.dumps(data).decode()


def to_session_info(row: Sequence[Any]) -> SessionInfo:
    """A ``ct_sessions`` row (columns in :data:`SESSION_COLUMNS` order) as a :class:`SessionInfo`."""
    return SessionInfo(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[9], bool(row[10]))


def to_event(row: Sequence[Any]) -> Event:
    """A stored event from a row of :data:`EVENT_SELECT`'s columns."""
    return load_stored(
        session=row[0], seq=row[1], id=row[2], type=row[3], at_ms=row[4], agent=row[5], epoch=row[6], data=row[7]
    )


DATA_TEXT = cast(events.c.data, Text).label("data")
"""``data`` as JSON text on both backends (PostgreSQL would otherwise hand ``jsonb`` to the codec)."""

EVENT_SELECT = (
    events.c.session,
    events.c.seq,
    events.c.id,
    events.c.type,
    events.c.at_ms,
    events.c.agent,
    events.c.epoch,
    DATA_TEXT,
)
"""A stored event's columns, in the order :func:`to_event` reads them."""


def _session_is(table: Any) -> Any:
    return table.c.session == bindparam("session")


def types_param(dialect: str, types: Collection[str]) -> Any:
    """``types`` as :func:`_read` binds them: a ``text[]`` on PostgreSQL, a JSON array on SQLite."""
    return list(types) if dialect == "postgresql" else orjson.dumps(list(types)).decode()


def _sqlite_typed_read(bounded: bool, limited: bool) -> str:
    """:func:`_read` of a few types on SQLite, by the index of migration 0006 (a JSON array ``:types``)."""
    sql = (
        "SELECT seq, id, type, at_ms, agent, epoch, data FROM ct_events INDEXED BY ct_events_session_type"
        " WHERE session = :session AND seq > :after_seq AND type IN (SELECT value FROM json_each(:types))"
    )
    if bounded:
        sql += " AND seq <= :to_seq"
    return sql + " ORDER BY seq" + (" LIMIT :limit" if limited else "")


@cache
def _read(bounded: bool, limited: bool, typed: bool = False) -> Query:
    def build(dialect: str) -> ClauseElement:
        c = events.c
        stmt = select(c.seq, c.id, c.type, c.at_ms, c.agent, c.epoch, DATA_TEXT).where(
            _session_is(events), c.seq > bindparam("after_seq")
        )
        if typed and dialect == "postgresql":
            stmt = stmt.where(c.type == any_(bindparam("types", type_=postgresql.ARRAY(Text))))
        elif typed:  # named: SQLite's planner would walk the session on (session, seq) without statistics
            return text(_sqlite_typed_read(bounded, limited))
        if bounded:
            stmt = stmt.where(c.seq <= bindparam("to_seq"))
        stmt = stmt.order_by(c.seq)
        return stmt.limit(bindparam("limit", type_=Integer)) if limited else stmt

    return Query(build)


_SEQ_AT_TIME = Query(
    lambda _: select(
        select(func.min(events.c.seq))
        .where(_session_is(events), events.c.at_ms > bindparam("at_ms"))
        .scalar_subquery(),
        select(sessions.c.last_seq).where(_session_is(sessions)).scalar_subquery(),
    )
)

_SESSION_INFO = Query(lambda _: select(*SESSION_COLUMNS).where(_session_is(sessions), sessions.c.last_seq > 0))

SESSION_ORDER = {
    "last_at": sessions.c.last_at_ms,
    "first_at": sessions.c.first_at_ms,
    "session": sessions.c.session,
    "events": sessions.c.last_seq,
}
"""``sessions(order=…)``: the column each order name sorts by."""

_SESSION_FILTERS: dict[str, Callable[[], ColumnElement[bool]]] = {
    "agent": lambda: sessions.c.agent == bindparam("agent"),
    "tenant": lambda: sessions.c.tenant == bindparam("tenant"),
    "untenanted": lambda: sessions.c.tenant.is_(None),
    "status": lambda: sessions.c.status == bindparam("status"),
    "since_ms": lambda: sessions.c.last_at_ms >= bindparam("since_ms"),
    "until_ms": lambda: sessions.c.first_at_ms <= bindparam("until_ms"),
}


@cache
def _sessions(filters: tuple[str, ...], order: str, descending: bool, limited: bool) -> Query:
    def build(_: str) -> ClauseElement:
        column = SESSION_ORDER[order]
        stmt = select(*SESSION_COLUMNS).where(sessions.c.last_seq > 0, *(_SESSION_FILTERS[f]() for f in filters))
        stmt = stmt.order_by((column.desc() if descending else column.asc()).nulls_last(), sessions.c.session)
        return stmt.limit(bindparam("limit", type_=Integer)) if limited else stmt

    return Query(build)


_OWN = Query(
    lambda _: select(sessions.c.session).where(_session_is(sessions), sessions.c.tenant == bindparam("tenant"))
)
_OWN_UNTENANTED = Query(lambda _: select(sessions.c.session).where(_session_is(sessions), sessions.c.tenant.is_(None)))


async def owns(db: Db, session: str, tenant: str | None) -> bool:
    """Whether ``session`` is a session of ``tenant`` (``None``: a session without a tenant)."""
    if tenant is None:
        return bool(await db.fetch(_OWN_UNTENANTED, session=session))
    return bool(await db.fetch(_OWN, session=session, tenant=tenant))


_SESSION_FOR_UPDATE = Query(
    lambda _: select(sessions.c.tenant, sessions.c.last_at_ms).where(_session_is(sessions)).with_for_update()
)


def _save_guard(dialect: str) -> ClauseElement:
    c = snapshots.c
    if dialect == "postgresql":
        kept = c.seq == any_(bindparam("kept", type_=postgresql.ARRAY(Integer)))
    else:
        kept = c.seq.in_(select(func.json_each(bindparam("kept")).table_valued("value").c.value))
    stored = select(func.count()).where(_session_is(snapshots), c.version == bindparam("version"), kept)
    return (
        select(sessions.c.tenant, stored.scalar_subquery())
        .where(_session_is(sessions))
        .with_for_update(read=True, key_share=True, of=sessions.c.session)
    )


_SAVE_GUARD = Query(_save_guard)
"""A snapshot save's one read before it writes: the session row's tenant and how many of the segment slots
in ``kept`` are stored, holding the row ``FOR KEY SHARE`` (one round trip for the lock, the tenancy check
and the slot check, each once a statement of its own).

The lock: an erasure or a rewrite (``FOR UPDATE``) waits for the save to commit, and then deletes what it
wrote; a save that waited for an erasure finds no row and writes nothing. Without it a save racing an
erasure could commit its rows after the erasure deleted the snapshots (PostgreSQL, read committed):
content of an erased session left in ``ct_snapshots``. ``FOR KEY SHARE``, the weakest lock that does this:
an append's update of the row (which leaves its key as it is) neither waits for a save nor holds one up,
so a live call's snapshot never stalls its own turn."""


def _kept_param(dialect: str, kept: Collection[int]) -> Any:
    """``kept`` as :data:`_SAVE_GUARD` binds it: an ``integer[]`` on PostgreSQL, a JSON array on SQLite."""
    return sorted(kept) if dialect == "postgresql" else orjson.dumps(sorted(kept)).decode()


_TOMBSTONE = Query(
    lambda _: select(tombstones.c.session, tombstones.c.erased_at_ms, tombstones.c.events, tombstones.c.tenant).where(
        _session_is(tombstones)
    )
)
_DELETE_EVENTS = Query(lambda _: delete(events).where(_session_is(events)))
_DELETE_SNAPSHOTS = Query(lambda _: delete(snapshots).where(_session_is(snapshots)))
_DELETE_SESSION = Query(lambda _: delete(sessions).where(_session_is(sessions)))


def _add_tombstone(dialect: str) -> ClauseElement:
    stmt: Any = insert_for(dialect)(tombstones).values(
        session=bindparam("session"),
        erased_at_ms=bindparam("erased_at_ms"),
        events=bindparam("events"),
        tenant=bindparam("tenant"),  # the session's: the tombstone stays with its tenant
    )
    upsert: ClauseElement = stmt.on_conflict_do_update(
        index_elements=[tombstones.c.session], set_={"events": tombstones.c.events + stmt.excluded.events}
    )
    return upsert


_ADD_TOMBSTONE = Query(_add_tombstone)
_REWRITE_DATA = Query(
    lambda _: (
        update(events)
        .where(events.c.session == bindparam("b_session"), events.c.seq == bindparam("b_seq"))
        .values(data=bindparam("data", type_=events.c.data.type))
    )
)
_SAVE_SNAPSHOT = Query(
    lambda d: (
        insert_for(d)(snapshots)
        .from_select(
            ["session", "version", "seq", "state", "created_at_ms", "tenant"],
            # the tenant from the session's row, in the same statement (no round trip more)
            select(
                sessions.c.session,
                cast(bindparam("version"), Integer),
                cast(bindparam("seq"), Integer),
                cast(bindparam("state"), LargeBinary),
                cast(bindparam("created_at_ms"), BigInteger),
                sessions.c.tenant,
            ).where(_session_is(sessions)),
        )
        .on_conflict_do_nothing()
    )
)


@cache
def _load_snapshot(bounded: bool) -> Query:
    def build(_: str) -> ClauseElement:
        c = snapshots.c
        # seq > 0: the rows at negative seqs are segments of snapshots (see save_snapshot_segments)
        stmt = select(c.seq, c.state).where(_session_is(snapshots), c.version == bindparam("version"), c.seq > 0)
        if bounded:
            stmt = stmt.where(c.seq <= bindparam("max_seq"))
        return stmt.order_by(c.seq.desc()).limit(1)

    return Query(build)


_LOAD_SEGMENTS = Query(
    lambda _: select(snapshots.c.seq, snapshots.c.state).where(
        _session_is(snapshots), snapshots.c.version == bindparam("version"), snapshots.c.seq < 0
    )
)


def _older(last_at_ms: int | None, before_ms: int | None) -> bool:
    """Whether a session whose last event is at ``last_at_ms`` is still one retention erases."""
    return before_ms is None or (last_at_ms is not None and last_at_ms < before_ms)


class SqlEventStore(EventStore):
    """The store methods both backends share; a backend adds :meth:`_db`, the append and the feed."""

    engine: AsyncEngine

    @abstractmethod
    def _db(self, *, write: bool = False) -> contextlib.AbstractAsyncContextManager[Db]:
        """A connection running compiled queries; ``write``: inside a write transaction."""

    async def _write(self, job: Callable[[Db], Awaitable[T]]) -> T:
        """``job`` in a write transaction: a short one that only queries (no other awaits), which a backend
        may run elsewhere (SQLite: on its writer thread, in line with the appends)."""
        async with self._db(write=True) as db:
            return await job(db)

    async def _fetch(self, query: Query, **params: Any) -> Sequence[Sequence[Any]]:
        async with self._db() as db:
            return await db.fetch(query, **params)

    # -- tenants: where the database does not keep them apart, calltape does ------------------

    def _filters(self) -> bool:
        """Whether calltape must keep this store to its tenant itself: on SQLite always, on PostgreSQL for
        a role that bypasses row-level security; never for a store opened for every tenant."""
        return not self.all_tenants

    async def _hidden(self, session: str) -> bool:
        """Whether this store must not see ``session`` (another tenant's; or a tenant's, for a store
        that declared none)."""
        if not self._filters():
            return False
        async with self._db() as db:
            return not await owns(db, session, self.tenant)

    # -- reading -----------------------------------------------------------------------------

    async def _read_events(
        self, session: str, after_seq: int, to_seq: int | None, limit: int | None, types: Collection[str] | None
    ) -> list[Event]:
        if await self._hidden(session):
            return []
        query = _read(to_seq is not None, limit is not None, types is not None)
        typed = types_param(self.engine.dialect.name, types) if types is not None else None
        rows = await self._fetch(query, session=session, after_seq=after_seq, to_seq=to_seq, limit=limit, types=typed)
        loads = orjson.loads
        with gc_paused(len(rows)):
            return [Event(r[2], loads(r[6]), session, r[1], r[3], r[4], r[5], r[0], True) for r in rows]

    async def seq_at_time(self, session: str, at_ms: int) -> int:
        if await self._hidden(session):
            return 0
        (first_after, last_seq), *_ = await self._fetch(_SEQ_AT_TIME, session=session, at_ms=at_ms)
        return int(first_after) - 1 if first_after is not None else int(last_seq or 0)

    async def session_info(self, session: str) -> SessionInfo | None:
        if await self._hidden(session):
            return None
        rows = await self._fetch(_SESSION_INFO, session=session)
        return to_session_info(rows[0]) if rows else None

    async def _list_sessions(
        self, filters: dict[str, Any], order: str, descending: bool, limit: int | None
    ) -> list[SessionInfo]:
        if self._filters():  # calltape keeps the store to its tenant (or to the sessions without one)
            if filters.get("tenant", self.tenant) != self.tenant:
                return []  # another tenant's sessions: none of them is this store's to list
            filters = {**filters, "tenant": self.tenant} if self.tenant is not None else {**filters, "untenanted": True}
        query = _sessions(tuple(filters), order, descending, limit is not None)
        return [to_session_info(r) for r in await self._fetch(query, **filters, limit=limit)]

    # -- erasure and rewriting ---------------------------------------------------------------

    async def erase(self, session: str) -> int:
        return await self._erase(session) or 0

    async def erase_in_steps(self, session: str, step: int, *, before_ms: int | None = None) -> int | None:
        return await self._erase(session, before_ms=before_ms)

    async def _erase(self, session: str, trimmed: int = 0, before_ms: int | None = None) -> int | None:
        """The erasing transaction; ``trimmed`` events of the session were deleted before it (retention
        on SQLite, :meth:`erase_in_steps`) and count in its tombstone and in what it returns. With
        ``before_ms``, a session whose last event is no longer before it is left alone (``None``)."""
        async with self._db(write=True) as db:
            owner = await db.fetchrow(_SESSION_FOR_UPDATE, session=session)
            if owner is not None and self._filters() and owner[0] != self.tenant:
                raise SessionNotFound(session)  # another tenant's (under row-level security it is not even seen)
            if owner is None:
                tomb = await db.fetchrow(_TOMBSTONE, session=session)
                if tomb is None or (self._filters() and tomb[3] != self.tenant):
                    raise SessionNotFound(session)
                return 0
            if not _older(owner[1], before_ms):
                return None  # it received an event since retention listed it (a resumed call): kept
            count = trimmed + await db.execute(_DELETE_EVENTS, session=session)
            await db.execute(_DELETE_SNAPSHOTS, session=session)
            await db.execute(_DELETE_SESSION, session=session)
            await db.execute(_ADD_TOMBSTONE, session=session, erased_at_ms=now_ms(), events=count, tenant=owner[0])
            await self._announce_erasure(db, owner[0])
        note_erasure()  # committed: this process's subscriptions re-check what they hold
        await self._erasure_committed()
        return count

    async def _still_due(self, db: Db, session: str, before_ms: int | None) -> bool:
        """Inside a deleting transaction: whether retention still erases the session (see :func:`_older`)."""
        row = await db.fetchrow(_SESSION_FOR_UPDATE, session=session)
        return row is None or _older(row[1], before_ms)

    async def _announce_erasure(self, db: Db, tenant: str | None) -> None:
        """Inside a transaction that erases or rewrites stored events: tells other processes'
        subscriptions, which read again the page they hold (PostgreSQL: NOTIFY)."""
        return None

    async def _erasure_committed(self) -> None:
        """After a transaction that erased or rewrote stored events: tells other processes'
        subscriptions (SQLite: a counter file)."""
        return None

    async def tombstone(self, session: str) -> Tombstone | None:
        rows = await self._fetch(_TOMBSTONE, session=session)
        if not rows or (self._filters() and rows[0][3] != self.tenant):
            return None
        return Tombstone(rows[0][0], rows[0][1], rows[0][2])

    async def rewrite_data(self, session: str, changes: Sequence[tuple[int, dict[str, Any]]]) -> None:
        if await self._hidden(session):
            raise SessionNotFound(session)
        async with self._db(write=True) as db:
            owner = await db.fetchrow(_SESSION_FOR_UPDATE, session=session)
            if owner is None:
                raise SessionNotFound(session)
            await db.executemany(
                _REWRITE_DATA, [{"b_session": session, "b_seq": seq, "data": dumps_data(data)} for seq, data in changes]
            )
            await db.execute(_DELETE_SNAPSHOTS, session=session)
            await self._announce_erasure(db, owner[0])  # a page read before holds the old data
        note_erasure()
        await self._erasure_committed()

    # -- snapshots ---------------------------------------------------------------------------

    async def save_snapshot(self, session: str, seq: int, version: int, state: bytes) -> None:
        await self._save_snapshots(session, version, [(seq, state)], set())

    async def load_snapshot(
        self, session: str, version: int, *, max_seq: int | None = None
    ) -> tuple[int, bytes] | None:
        if await self._hidden(session):
            return None
        query = _load_snapshot(max_seq is not None)
        rows = await self._fetch(query, session=session, version=version, max_seq=max_seq)
        return (rows[0][0], bytes(rows[0][1])) if rows else None

    async def save_snapshot_segments(self, session: str, version: int, segments: Sequence[tuple[int, bytes]]) -> None:
        """Stores snapshot segments (:mod:`calltape.projections.segments`) as snapshot rows at their
        negative slots, in one transaction; a slot already stored is left as it is."""
        if segments:
            await self._save_snapshots(session, version, segments, set())

    async def save_snapshot_over(
        self, session: str, version: int, rows: Sequence[tuple[int, bytes]], kept: set[int]
    ) -> bool:
        """Stores snapshot ``rows`` as ``(seq, state)`` (a header, and the new segments at their negative
        slots) in one transaction holding the session's row against a rewrite or an erasure (``FOR KEY
        SHARE``: appends go on), only while the session is there and every segment slot in ``kept``
        (written by an earlier save) is still stored. False, and nothing written, otherwise: the capture
        holds what a redaction or an erasure removed since, and a header naming segments the store lacks
        would be completed from a process's segment cache with the old content."""
        return await self._save_snapshots(session, version, rows, kept)

    async def _save_snapshots(
        self, session: str, version: int, rows: Sequence[tuple[int, bytes]], kept: set[int]
    ) -> bool:
        """Inserts snapshot rows (a slot already stored is kept) while the session is stored, this store
        may see it and the slots in ``kept`` are stored; two statements and a commit that need not wait
        for the disk (:meth:`Db.rebuildable`)."""
        common = {"session": session, "version": version, "created_at_ms": now_ms()}
        filters = self._filters()

        async def guarded(db: Db) -> bool:
            await db.rebuildable()
            guard = await db.fetchrow(
                _SAVE_GUARD, session=session, version=version, kept=_kept_param(db.dialect.name, kept)
            )
            if guard is None or (filters and guard[0] != self.tenant) or guard[1] != len(kept):
                return False
            await db.executemany(_SAVE_SNAPSHOT, [{**common, "seq": seq, "state": state} for seq, state in rows])
            return True

        return await self._write(guarded)

    async def load_snapshot_segments(self, session: str, version: int) -> Sequence[tuple[int, bytes]]:
        """Every stored snapshot segment of a session and fold version, as ``(slot, body)``."""
        if await self._hidden(session):
            return []
        rows = await self._fetch(_LOAD_SEGMENTS, session=session, version=version)
        return [(row[0], bytes(row[1])) for row in rows]

    async def close(self) -> None:
        await self.engine.dispose()
