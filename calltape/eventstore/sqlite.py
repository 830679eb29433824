"""SQLite backend: the embedded default.

Writers take the database lock up front (``BEGIN IMMEDIATE``), so appends from several processes
serialize instead of failing on a lock upgrade, and ``pos`` order is commit order: the feed needs no
transaction ids here.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from sqlalchemy import event as sa_event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from calltape.errors import SessionNotFound
from calltape.events import Event, now_ms
from calltape.eventstore.append_plan import SessionInfo, plan_append
from calltape.eventstore.errors import translate_errors
from calltape.eventstore.store import SESSION_ORDER, ChangeWaiter, EventStore, FeedPosition, SleepWaiter, Tombstone
from calltape.eventstore.tenancy import admit, refuse_foreign
from calltape.gcpause import gc_paused

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
_EVENT_COLUMNS = "session, seq, id, type, at_ms, agent, epoch, data"


def configure_engine(engine: AsyncEngine) -> None:
    """WAL for concurrent readers, a busy timeout for writers, and explicit BEGIN control."""

    @sa_event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        # The busy timeout first: switching a fresh file to WAL takes a lock that another process
        # opening the same file at the same instant may hold.
        cursor.execute("PRAGMA busy_timeout=10000")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @sa_event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("calltape_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


def _event(row: Any) -> Event:
    return Event(
        type=row[3],
        data=orjson.loads(row[7]),
        session=row[0],
        id=row[2],
        at_ms=row[4],
        agent=row[5],
        epoch=row[6],
        seq=row[1],
        checked=True,
    )


def _info(row: Any) -> SessionInfo:
    values = dict(zip(_SESSION_FIELDS, row, strict=True))
    values["started"] = bool(values["started"])
    return SessionInfo(**values)


class SqliteEventStore(EventStore):
    """The embedded SQLite event log: writers take the lock up front, so ``pos`` is commit order."""

    dialect = "sqlite"

    def __init__(self, engine: AsyncEngine, url: str) -> None:
        self.engine = engine
        self.url = url

    @contextlib.asynccontextmanager
    async def _connection(self, *, write: bool = False) -> AsyncIterator[AsyncConnection]:
        async with translate_errors(self.url), self.engine.connect() as conn:
            if write:
                conn = await conn.execution_options(calltape_begin="IMMEDIATE")
            async with conn.begin():
                yield conn

    async def _fetch(self, sql: str, *params: Any) -> list[Any]:
        async with self._connection() as conn:
            return list((await conn.exec_driver_sql(sql, params)).all())

    async def _hidden(self, session: str) -> bool:
        """Whether a store opened for a tenant must not see this session (calltape filters on SQLite)."""
        if self.tenant is None:
            return False
        rows = await self._fetch("SELECT tenant FROM ct_sessions WHERE session = ?", session)
        return not rows or rows[0][0] != self.tenant

    # -- writing -----------------------------------------------------------------------------

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        if not events:
            return []
        events = admit(self._redact(events), self.tenant)
        sessions = sorted({e.session for e in events})
        async with self._connection(write=True) as conn:
            await conn.exec_driver_sql(
                "INSERT INTO ct_sessions (session, tenant, status, last_seq, epoch, started) "
                "VALUES (?, ?, 'active', 0, 1, 0) ON CONFLICT (session) DO NOTHING",
                [(s, self.tenant) for s in sessions],
            )
            marks = ",".join("?" * len(sessions))
            found = await conn.exec_driver_sql(
                f"SELECT {_SESSION_COLUMNS} FROM ct_sessions WHERE session IN ({marks})", tuple(sessions)
            )
            rows = {r[0]: _info(r) for r in found}
            refuse_foreign(rows.values(), self.tenant)
            stored: dict[tuple[str, str], Event] = {}
            for session in sessions:
                ids = [e.id for e in events if e.session == session]
                for chunk in range(0, len(ids), 500):
                    part = ids[chunk : chunk + 500]
                    result = await conn.exec_driver_sql(
                        f"SELECT {_EVENT_COLUMNS} FROM ct_events WHERE session = ? "
                        f"AND id IN ({','.join('?' * len(part))})",
                        tuple([session, *part]),
                    )
                    found_rows: list[Any] = list(result)
                    stored.update({(r[0], r[2]): _event(r) for r in found_rows})
            plan = plan_append(events, rows, stored, expected_seq)
            if plan.inserts:
                await conn.exec_driver_sql(
                    f"INSERT INTO ct_events ({_EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            e.session,
                            e.seq,
                            e.id,
                            e.type,
                            e.at_ms,
                            e.agent,
                            e.epoch,
                            orjson.dumps(e.data).decode(),
                        )
                        for e in plan.inserts
                    ],
                )
                await conn.exec_driver_sql(
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
                        for r in plan.rows.values()
                    ],
                )
        return plan.results

    # -- reading -----------------------------------------------------------------------------

    async def read(
        self, session: str, *, after_seq: int = 0, to_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        if await self._hidden(session):
            return []
        rows = await self._fetch(
            f"SELECT {_EVENT_COLUMNS} FROM ct_events WHERE session = ? AND seq > ? "
            "AND (? IS NULL OR seq <= ?) ORDER BY seq LIMIT ?",
            session,
            after_seq,
            to_seq,
            to_seq,
            -1 if limit is None else limit,
        )
        with gc_paused(len(rows)):
            return [_event(r) for r in rows]

    async def seq_at_time(self, session: str, at_ms: int) -> int:
        if await self._hidden(session):
            return 0
        rows = await self._fetch(
            "SELECT (SELECT min(seq) FROM ct_events WHERE session = ? AND at_ms > ?), "
            "(SELECT last_seq FROM ct_sessions WHERE session = ?)",
            session,
            at_ms,
            session,
        )
        first_after, last_seq = rows[0]
        return int(first_after) - 1 if first_after is not None else int(last_seq or 0)

    async def session_info(self, session: str) -> SessionInfo | None:
        rows = await self._fetch(
            f"SELECT {_SESSION_COLUMNS} FROM ct_sessions WHERE session = ? AND last_seq > 0", session
        )
        return _info(rows[0]) if rows and (self.tenant is None or rows[0][2] == self.tenant) else None

    async def sessions(
        self,
        *,
        agent: str | None = None,
        tenant: str | None = None,
        status: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        order: str = "last_at",
        descending: bool = True,
        limit: int | None = None,
    ) -> list[SessionInfo]:
        column = SESSION_ORDER[order]
        direction = "DESC" if descending else "ASC"
        if self.tenant is not None:
            if tenant not in (None, self.tenant):
                return []
            tenant = self.tenant
        rows = await self._fetch(
            f"SELECT {_SESSION_COLUMNS} FROM ct_sessions WHERE last_seq > 0 "
            "AND (?1 IS NULL OR agent = ?1) AND (?2 IS NULL OR tenant = ?2) AND (?3 IS NULL OR status = ?3) "
            "AND (?4 IS NULL OR last_at_ms >= ?4) AND (?5 IS NULL OR first_at_ms <= ?5) "
            f"ORDER BY {column} IS NULL, {column} {direction}, session LIMIT ?6",
            agent,
            tenant,
            status,
            since_ms,
            until_ms,
            -1 if limit is None else limit,
        )
        return [_info(r) for r in rows]

    async def feed(
        self, after: FeedPosition | None = None, *, limit: int = 1000, session: str | None = None
    ) -> list[tuple[FeedPosition, Event]]:
        pos = (after or FeedPosition(0, 0)).pos
        rows = await self._fetch(
            f"SELECT pos, {_EVENT_COLUMNS} FROM ct_events WHERE pos > ?1 AND (?2 IS NULL OR session = ?2) "
            "AND (?4 IS NULL OR session IN (SELECT session FROM ct_sessions WHERE tenant = ?4)) "
            "ORDER BY pos LIMIT ?3",
            pos,
            session,
            limit,
            self.tenant,
        )
        return [(FeedPosition(0, r[0]), _event(r[1:])) for r in rows]

    async def head(self) -> FeedPosition:
        rows = await self._fetch("SELECT max(pos) FROM ct_events")
        return FeedPosition(0, rows[0][0] or 0)

    def change_waiter(self) -> ChangeWaiter:
        return SleepWaiter()

    # -- snapshots ---------------------------------------------------------------------------

    async def erase(self, session: str) -> int:
        async with self._connection(write=True) as conn:
            owner = (await conn.exec_driver_sql("SELECT tenant FROM ct_sessions WHERE session = ?", (session,))).first()
            if owner is None or (self.tenant is not None and owner[0] != self.tenant):
                tomb = (
                    await conn.exec_driver_sql(
                        "SELECT 1 FROM ct_tombstones WHERE session = ?1 AND (?2 IS NULL OR tenant = ?2)",
                        (session, self.tenant),
                    )
                ).first()
                if tomb is None or owner is not None:
                    raise SessionNotFound(session)
                return 0
            result = await conn.exec_driver_sql("DELETE FROM ct_events WHERE session = ?", (session,))
            count = int(result.rowcount)
            await conn.exec_driver_sql("DELETE FROM ct_snapshots WHERE session = ?", (session,))
            await conn.exec_driver_sql("DELETE FROM ct_sessions WHERE session = ?", (session,))
            await conn.exec_driver_sql(
                "INSERT INTO ct_tombstones (session, erased_at_ms, events, tenant) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (session) DO UPDATE SET events = ct_tombstones.events + excluded.events",
                (session, now_ms(), count, owner[0]),
            )
            return count

    async def tombstone(self, session: str) -> Tombstone | None:
        rows = await self._fetch(
            "SELECT session, erased_at_ms, events FROM ct_tombstones "
            "WHERE session = ?1 AND (?2 IS NULL OR tenant = ?2)",
            session,
            self.tenant,
        )
        return Tombstone(rows[0][0], rows[0][1], rows[0][2]) if rows else None

    async def rewrite_data(self, session: str, changes: Sequence[tuple[int, dict[str, Any]]]) -> None:
        if await self._hidden(session):
            raise SessionNotFound(session)
        async with self._connection(write=True) as conn:
            for seq, data in changes:
                await conn.exec_driver_sql(
                    "UPDATE ct_events SET data = ? WHERE session = ? AND seq = ?",
                    (orjson.dumps(data).decode(), session, seq),
                )
            await conn.exec_driver_sql("DELETE FROM ct_snapshots WHERE session = ?", (session,))

    async def save_snapshot(self, session: str, seq: int, version: int, state: bytes) -> None:
        if await self._hidden(session):
            return
        async with self._connection(write=True) as conn:
            await conn.exec_driver_sql(
                "INSERT INTO ct_snapshots (session, version, seq, state, created_at_ms) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (session, version, seq, state, now_ms()),
            )

    async def load_snapshot(
        self, session: str, version: int, *, max_seq: int | None = None
    ) -> tuple[int, bytes] | None:
        if await self._hidden(session):
            return None
        rows = await self._fetch(
            "SELECT seq, state FROM ct_snapshots WHERE session = ?1 AND version = ?2 "
            "AND (?3 IS NULL OR seq <= ?3) ORDER BY seq DESC LIMIT 1",
            session,
            version,
            max_seq,
        )
        return (rows[0][0], bytes(rows[0][1])) if rows else None

    async def close(self) -> None:
        await self.engine.dispose()
