"""Bulk import: any number of batches, one transaction, all or nothing.

``calltape import`` of a million-event file must write nothing when any line is invalid or any
event is refused (a stale epoch, a second ``session.started``), whatever its size. ``store.append``
commits each call, so an import built on it leaves the first batches behind when a later one fails.
Here every batch goes through the same append rules (:func:`plan_append`), inside one transaction
opened for the whole import; the caller commits by leaving the ``async with`` block normally and
rolls everything back by raising.

Per-dialect code only where speed needs it (the same reason the backends have their own append):
PostgreSQL takes rows by COPY, SQLite by one ``executemany``; the session rows are locked once
per import, kept in memory between batches and written back once at the end.

The transaction holds the SQLite write lock, and on PostgreSQL the locks of the imported sessions,
until it commits; on PostgreSQL the global feed also waits for it (readers never skip a
transaction still in flight). Import in the quiet hours if the file is very large.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import exc as sa_exc

from calltape.errors import CalltapeError
from calltape.events import Event
from calltape.eventstore.append_plan import SessionInfo, plan_append
from calltape.eventstore.errors import translate_errors
from calltape.eventstore.postgres import _INSERT_EVENTS, PostgresEventStore
from calltape.eventstore.store import EventStore
from calltape.eventstore.tenancy import NOTIFY_TENANTS, admit, refuse_foreign

_SESSION_FIELDS = (
    "session",
    "agent",
    "tenant",
    "modality",
    "framework",
    "status",
    "last_seq",
    "epoch",
    "first_at_ms",
    "last_at_ms",
    "started",
)
_SESSION_COLUMNS = ", ".join(_SESSION_FIELDS)

SQLITE_LOCK_WAIT = 600.0
"""Seconds an SQLite import waits for the write lock held by another import or writer."""


class ImportRefused(CalltapeError):
    """The store refused one event of an import (its rules, not its format); nothing was written.

    ``index`` is the event's position in the batch given to :meth:`BulkImport.add`."""

    def __init__(self, index: int, cause: CalltapeError) -> None:
        super().__init__(str(cause))
        self.index = index
        self.cause = cause


@dataclass(slots=True)
class ImportCounts:
    """What an import did (or would do, until it commits)."""

    new: int = 0
    """Events written."""
    stored: int = 0
    """Events skipped because the session already had their id."""
    sessions: set[str] = field(default_factory=set)
    """Sessions the imported events belong to (new or already stored)."""


class BulkImport(ABC):
    """One open import transaction; :meth:`add` batches, then leave the block to commit."""

    def __init__(self, conn: Any, tenant: str | None = None) -> None:
        self.conn = conn
        self.tenant = tenant
        """The store's tenant: the import writes only that tenant's sessions."""
        self.counts = ImportCounts()
        self._rows: dict[str, SessionInfo] = {}
        self._changed: dict[str, SessionInfo] = {}

    async def add(self, events: Sequence[Event]) -> int:
        """Appends ``events`` inside the import transaction; returns how many were new.

        Raises :class:`ImportRefused` (naming the event) when the append rules refuse one; the
        import must then be abandoned (raise out of the block)."""
        if not events:
            return 0
        events = admit(events, self.tenant)
        batch_sessions = {e.session for e in events}
        self.counts.sessions.update(batch_sessions)
        fresh = sorted(batch_sessions - self._rows.keys())
        if fresh:
            self._rows.update(await self._lock_sessions(fresh))
        stored = await self._stored(events)
        try:
            plan = plan_append(events, self._rows, stored)
        except CalltapeError as exc:
            raise ImportRefused(self._culprit(events, stored), exc) from None
        if plan.inserts:
            await self._insert(plan.inserts)
        self._rows.update(plan.rows)
        self._changed.update(plan.rows)
        self.counts.new += len(plan.inserts)
        self.counts.stored += len(events) - len(plan.inserts)
        return len(plan.inserts)

    def _culprit(self, events: Sequence[Event], stored: dict[tuple[str, str], Event]) -> int:
        """The index of the first event the rules refuse (planned one by one; only on failure)."""
        rows = dict(self._rows)
        for index, event in enumerate(events):
            try:
                plan = plan_append([event], rows, stored)
            except CalltapeError:
                return index
            rows.update(plan.rows)
            stored.update({(e.session, e.id): e for e in plan.inserts})
        return len(events) - 1  # pragma: no cover - the batch failed as a whole, so one event does

    async def finish(self) -> None:
        """Writes the session summaries back (called once, before the commit)."""
        if self._changed:
            await self._update_sessions(list(self._changed.values()))

    @abstractmethod
    async def _lock_sessions(self, sessions: list[str]) -> dict[str, SessionInfo]: ...

    @abstractmethod
    async def _stored(self, events: Sequence[Event]) -> dict[tuple[str, str], Event]: ...

    @abstractmethod
    async def _insert(self, events: Sequence[Event]) -> None: ...

    @abstractmethod
    async def _update_sessions(self, rows: list[SessionInfo]) -> None: ...

    async def stored_count(self, keys: Sequence[tuple[str, str]]) -> int:
        """How many of ``(session, id)`` the store already has (for the quick re-import check)."""
        return len(await self._stored_keys(keys))

    @abstractmethod
    async def _stored_keys(self, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]: ...


def _event_row(e: Event) -> tuple[Any, ...]:
    return (e.session, e.seq, e.id, e.type, e.at_ms, e.agent, e.epoch, orjson.dumps(e.data).decode())


def _stored_event(r: Sequence[Any]) -> Event:
    data = r[7]
    return Event(
        type=r[3],
        data=orjson.loads(data) if isinstance(data, (str, bytes)) else data,
        session=r[0],
        id=r[2],
        at_ms=r[4],
        agent=r[5],
        epoch=r[6],
        seq=r[1],
        checked=True,
    )


# ---------------------------------------------------------------------------------------------
# SQLite


_OWN_SESSION = " AND session IN (SELECT session FROM ct_sessions WHERE tenant = ?)"


class _SqliteImport(BulkImport):
    async def _lock_sessions(self, sessions: list[str]) -> dict[str, SessionInfo]:
        await self.conn.exec_driver_sql(
            "INSERT INTO ct_sessions (session, tenant, status, last_seq, epoch, started) "
            "VALUES (?, ?, 'active', 0, 1, 0) ON CONFLICT (session) DO NOTHING",
            [(s, self.tenant) for s in sessions],
        )
        rows: dict[str, SessionInfo] = {}
        for chunk in range(0, len(sessions), 500):
            part = sessions[chunk : chunk + 500]
            found = await self.conn.exec_driver_sql(
                f"SELECT {_SESSION_COLUMNS} FROM ct_sessions WHERE session IN ({','.join('?' * len(part))})",
                tuple(part),
            )
            for r in found:
                values = dict(zip(_SESSION_FIELDS, r, strict=True))
                values["started"] = bool(values["started"])
                rows[r[0]] = SessionInfo(**values)
        refuse_foreign(rows.values(), self.tenant)
        return rows

    async def _select_stored(self, keys: Iterable[tuple[str, str]], columns: str) -> list[Any]:
        by_session: dict[str, list[str]] = {}
        for session, id_ in keys:
            by_session.setdefault(session, []).append(id_)
        found: list[Any] = []
        for session, ids in by_session.items():
            for chunk in range(0, len(ids), 900):
                part = ids[chunk : chunk + 900]
                result = await self.conn.exec_driver_sql(
                    f"SELECT {columns} FROM ct_events WHERE session = ? AND id IN ({','.join('?' * len(part))})"
                    f"{_OWN_SESSION if self.tenant is not None else ''}",
                    (session, *part, *([self.tenant] if self.tenant is not None else [])),
                )
                found.extend(result)
        return found

    async def _stored(self, events: Sequence[Event]) -> dict[tuple[str, str], Event]:
        # Only sessions that have events (stored before, or by an earlier batch) can hold a duplicate.
        keys = [(e.session, e.id) for e in events if self._rows[e.session].last_seq > 0]
        if not keys:
            return {}
        rows = await self._select_stored(keys, "session, seq, id, type, at_ms, agent, epoch, data")
        return {(r[0], r[2]): _stored_event(r) for r in rows}

    async def _stored_keys(self, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        return {(r[0], r[1]) for r in await self._select_stored(keys, "session, id")}

    async def _insert(self, events: Sequence[Event]) -> None:
        await self.conn.exec_driver_sql(
            "INSERT INTO ct_events (session, seq, id, type, at_ms, agent, epoch, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [_event_row(e) for e in events],
        )

    async def _update_sessions(self, rows: list[SessionInfo]) -> None:
        await self.conn.exec_driver_sql(
            "UPDATE ct_sessions SET agent = ?, tenant = ?, modality = ?, framework = ?, status = ?, "
            "last_seq = ?, epoch = ?, first_at_ms = ?, last_at_ms = ?, started = ? WHERE session = ?",
            [
                (
                    r.agent,
                    r.tenant,
                    r.modality,
                    r.framework,
                    r.status,
                    r.last_seq,
                    r.epoch,
                    r.first_at_ms,
                    r.last_at_ms,
                    int(r.started),
                    r.session,
                )
                for r in rows
            ],
        )


# ---------------------------------------------------------------------------------------------
# PostgreSQL

_PG_LOCK = f"""
INSERT INTO ct_sessions (session, status, last_seq, epoch)
SELECT s, 'active', 0, 1 FROM unnest($1::text[]) AS s ORDER BY s
ON CONFLICT (session) DO UPDATE SET session = EXCLUDED.session
RETURNING {_SESSION_COLUMNS}
"""

_PG_STORED = """
SELECT session, seq, id, type, at_ms, agent, epoch, data::text
FROM ct_events e JOIN unnest($1::text[], $2::text[]) AS k(session, id) USING (session, id)
"""

_PG_STORED_KEYS = """
SELECT session, id FROM ct_events e JOIN unnest($1::text[], $2::text[]) AS k(session, id) USING (session, id)
"""

_PG_UPDATE = f"""
UPDATE ct_sessions s SET agent = v.agent, tenant = v.tenant, modality = v.modality,
    framework = v.framework, status = v.status, last_seq = v.last_seq, epoch = v.epoch,
    first_at_ms = v.first_at_ms, last_at_ms = v.last_at_ms, started = v.started
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::int[], $8::int[], $9::bigint[], $10::bigint[], $11::bool[]) AS v({_SESSION_COLUMNS})
WHERE s.session = v.session
"""

_PG_COPY_COLUMNS = ["session", "seq", "id", "type", "at_ms", "agent", "epoch", "data"]


class _PostgresImport(BulkImport):
    copy_in = True
    async def _lock_sessions(self, sessions: list[str]) -> dict[str, SessionInfo]:
        return {r["session"]: SessionInfo(**dict(r)) for r in await self.conn.fetch(_PG_LOCK, sessions)}

    async def _stored(self, events: Sequence[Event]) -> dict[tuple[str, str], Event]:
        keys = [e for e in events if self._rows[e.session].last_seq > 0]
        if not keys:
            return {}
        rows = await self.conn.fetch(_PG_STORED, [e.session for e in keys], [e.id for e in keys])
        return {(r[0], r[2]): _stored_event(r) for r in rows}

    async def _stored_keys(self, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        rows = await self.conn.fetch(_PG_STORED_KEYS, [k[0] for k in keys], [k[1] for k in keys])
        return {(r[0], r[1]) for r in rows}

    async def _insert(self, events: Sequence[Event]) -> None:
        if not self.copy_in:  # PostgreSQL refuses COPY FROM to a role held by row-level security
            await self.conn.execute(_INSERT_EVENTS, *PostgresEventStore._event_columns(events))
            return
        await self.conn.copy_records_to_table(
            "ct_events", records=[_event_row(e) for e in events], columns=_PG_COPY_COLUMNS
        )

    async def _update_sessions(self, rows: list[SessionInfo]) -> None:
        await self.conn.execute(_PG_UPDATE, *([getattr(r, f) for r in rows] for f in _SESSION_FIELDS))
        await self.conn.execute(
            f"WITH v AS (SELECT unnest($1::text[]) AS tenant) {NOTIFY_TENANTS}", [r.tenant for r in rows]
        )


@contextlib.asynccontextmanager
async def bulk_import(store: EventStore) -> AsyncIterator[BulkImport]:
    """``async with bulk_import(store) as imp: await imp.add(batch) ...``: one transaction for all
    batches; committed when the block ends normally, rolled back (nothing written) when it raises."""
    engine = getattr(store, "engine", None)
    if engine is None:
        raise CalltapeError(f"bulk import is not available for a {type(store).__name__}")
    if store.dialect == "sqlite":
        async with translate_errors(store.url):
            # Another import (or writer) may hold the write lock for a while: nothing is written yet,
            # so wait for it (beyond the driver's busy timeout) rather than fail.
            deadline = time.monotonic() + SQLITE_LOCK_WAIT
            while True:
                sa_conn = await engine.connect()
                try:
                    conn = await sa_conn.execution_options(calltape_begin="IMMEDIATE")
                    transaction = await conn.begin()
                    break
                except sa_exc.OperationalError as exc:
                    await sa_conn.invalidate()
                    await sa_conn.close()
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
            try:
                sqlite_import = _SqliteImport(conn, store.tenant)
                try:
                    yield sqlite_import
                    await sqlite_import.finish()
                except BaseException:
                    await transaction.rollback()
                    raise
                await transaction.commit()
            finally:
                await sa_conn.close()
        return
    async with translate_errors(store.url, tenant=store.tenant), engine.connect() as sa_conn:
        raw = await sa_conn.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        try:
            async with driver.transaction():
                pg_import = _PostgresImport(driver, store.tenant)
                pg_import.copy_in = getattr(store, "copy_in", True)
                yield pg_import
                await pg_import.finish()
        except BaseException:
            if driver.is_closed():
                await sa_conn.invalidate()
            raise


async def stored_keys(store: EventStore, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of ``(session, id)`` the store already has (a read; nothing is locked or written)."""
    if not keys:
        return set()
    engine = getattr(store, "engine", None)
    if engine is None:
        raise CalltapeError(f"bulk import is not available for a {type(store).__name__}")
    async with translate_errors(store.url), engine.connect() as sa_conn:
        if store.dialect == "sqlite":
            return await _SqliteImport(sa_conn, store.tenant)._stored_keys(keys)
        raw = await sa_conn.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        return await _PostgresImport(driver, store.tenant)._stored_keys(keys)
