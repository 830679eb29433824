"""PostgreSQL backend: the production store.

SQLAlchemy owns the engine and the pool; the append and feed paths speak to the asyncpg connection
underneath (``driver_connection``) with array parameters, so one batch costs a fixed handful of round
trips whatever its size.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import orjson
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from calltape.errors import ConcurrencyConflict, FencedWrite, InvalidEvent, SessionNotFound, StoreUnavailable
from calltape.events import Event, load_stored, now_ms
from calltape.eventstore.append_plan import SessionInfo, plan_append
from calltape.eventstore.errors import is_disconnect, translate_errors
from calltape.eventstore.store import SESSION_ORDER, ChangeWaiter, EventStore, FeedPosition, Tombstone
from calltape.eventstore.tenancy import NOTIFY_TENANTS, admit, channel, tenant_settings
from calltape.gcpause import gc_paused

_SESSION_COLUMNS = (
    "session, agent, tenant, modality, framework, status, last_seq, epoch, first_at_ms, last_at_ms, started"
)

_SESSION_FIELDS = _SESSION_COLUMNS.split(", ")

_LOCK_SESSIONS = f"""
INSERT INTO ct_sessions (session, status, last_seq, epoch)
SELECT s, 'active', 0, 1 FROM unnest($1::text[]) AS s ORDER BY s
ON CONFLICT (session) DO UPDATE SET session = EXCLUDED.session
RETURNING {_SESSION_COLUMNS}
"""

_INSERT_EVENTS = """
INSERT INTO ct_events (session, seq, id, type, at_ms, agent, epoch, data)
SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::int[],
                     $8::jsonb[])
ON CONFLICT (session, id) DO NOTHING
"""

_UPDATE_SESSIONS = f"""
WITH v AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                         $7::int[], $8::int[], $9::bigint[], $10::bigint[], $11::bool[])
        AS v({_SESSION_COLUMNS})
), u AS (
    UPDATE ct_sessions s SET agent = v.agent, tenant = v.tenant, modality = v.modality,
        framework = v.framework, status = v.status, last_seq = v.last_seq, epoch = v.epoch,
        first_at_ms = v.first_at_ms, last_at_ms = v.last_at_ms, started = v.started
    FROM v WHERE s.session = v.session
)
{NOTIFY_TENANTS}
"""

_FIND_STORED = """
SELECT session, seq, id, type, at_ms, agent, epoch, data::text
FROM ct_events e JOIN unnest($1::text[], $2::text[]) AS k(session, id) USING (session, id)
"""

_EVENT_COLUMNS = "session, seq, id, type, at_ms, agent, epoch, data::text AS data"
_COPY_COLUMNS = ["session", "seq", "id", "type", "at_ms", "agent", "epoch", "data"]

_FEED = f"""
SELECT txid::text::bigint AS txid, pos, {_EVENT_COLUMNS} FROM ct_events
WHERE (txid, pos) > ($1::text::xid8, $2) AND txid < pg_snapshot_xmin(pg_current_snapshot())
  AND ($4::text IS NULL OR session = $4)
ORDER BY txid, pos LIMIT $3
"""


class _StoredDuplicate(Exception):
    """The optimistic insert met an id the session already has: replan with the stored events."""


def _row_to_event(r: Any) -> Event:
    return load_stored(
        session=r["session"],
        seq=r["seq"],
        id=r["id"],
        type=r["type"],
        at_ms=r["at_ms"],
        agent=r["agent"],
        epoch=r["epoch"],
        data=r["data"],
    )


def _columns(rows: Sequence[Any], names: Sequence[str]) -> list[list[Any]]:
    return [[getattr(r, n) for r in rows] for n in names]


class PostgresEventStore(EventStore):
    """The PostgreSQL event log: the feed ordered by ``(txid, pos)``, LISTEN/NOTIFY wake-ups."""

    dialect = "postgresql"
    copy_in = True
    """Whether appends may COPY: PostgreSQL refuses COPY FROM to a role held by row-level security."""

    def __init__(self, engine: AsyncEngine, url: str) -> None:
        self.engine = engine
        self.url = url

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

    # -- writing -----------------------------------------------------------------------------

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        if not events:
            return []
        events = admit(self._redact(events), self.tenant)
        sessions = sorted({e.session for e in events})
        async with self._connection() as conn:
            # Attempt 0 is optimistic: no stored duplicates (one round trip fewer). Any surprise —
            # an insert that met a stored id, or a rule that failed — is decided again, for real,
            # with the stored events looked up under the same session locks.
            for attempt in range(2):
                try:
                    async with conn.transaction():
                        locked = await conn.fetch(_LOCK_SESSIONS, sessions)
                        rows = {r["session"]: SessionInfo(**dict(r)) for r in locked}
                        stored: dict[tuple[str, str], Event] = {}
                        if attempt:
                            found = await conn.fetch(_FIND_STORED, [e.session for e in events], [e.id for e in events])
                            stored = {(r["session"], r["id"]): _row_to_event(r) for r in found}
                        plan = plan_append(events, rows, stored, expected_seq)
                        if plan.inserts:
                            if attempt or not self.copy_in:
                                status = await conn.execute(_INSERT_EVENTS, *self._event_columns(plan.inserts))
                                if int(status.rsplit(" ", 1)[1]) != len(plan.inserts):
                                    raise _StoredDuplicate
                            else:
                                # COPY is the cheapest way in; a stored duplicate id aborts it
                                # (unique violation) and attempt 1 decides again with the lookup.
                                await conn.copy_records_to_table(
                                    "ct_events", records=self._event_rows(plan.inserts), columns=_COPY_COLUMNS
                                )
                            changed = list(plan.rows.values())
                            await conn.execute(_UPDATE_SESSIONS, *_columns(changed, _SESSION_FIELDS))
                    return plan.results
                except (_StoredDuplicate, asyncpg.UniqueViolationError, InvalidEvent, FencedWrite, ConcurrencyConflict):
                    if attempt:
                        raise
        raise AssertionError("unreachable")

    @staticmethod
    def _event_rows(events: Sequence[Event]) -> list[tuple[Any, ...]]:
        dumps = orjson.dumps
        return [(e.session, e.seq, e.id, e.type, e.at_ms, e.agent, e.epoch, dumps(e.data).decode()) for e in events]

    @staticmethod
    def _event_columns(events: Sequence[Event]) -> list[list[Any]]:
        return [
            [e.session for e in events],
            [e.seq for e in events],
            [e.id for e in events],
            [e.type for e in events],
            [e.at_ms for e in events],
            [e.agent for e in events],
            [e.epoch for e in events],
            [orjson.dumps(e.data).decode() for e in events],
        ]

    # -- reading -----------------------------------------------------------------------------

    async def read(
        self, session: str, *, after_seq: int = 0, to_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        async with self._connection() as conn:
            rows = await conn.fetch(
                "SELECT seq, id, type, at_ms, agent, epoch, data::text FROM ct_events "
                "WHERE session = $1 AND seq > $2 AND ($3::int IS NULL OR seq <= $3) ORDER BY seq LIMIT $4",
                session,
                after_seq,
                to_seq,
                limit,
            )
        loads = orjson.loads
        with gc_paused(len(rows)):
            return [Event(r[2], loads(r[6]), session, r[1], r[3], r[4], r[5], r[0], True) for r in rows]

    async def seq_at_time(self, session: str, at_ms: int) -> int:
        async with self._connection() as conn:
            row = await conn.fetchrow(
                "SELECT (SELECT min(seq) FROM ct_events WHERE session = $1 AND at_ms > $2) AS first_after, "
                "(SELECT last_seq FROM ct_sessions WHERE session = $1) AS last_seq",
                session,
                at_ms,
            )
        assert row is not None
        if row["first_after"] is not None:
            return int(row["first_after"]) - 1
        return int(row["last_seq"] or 0)

    async def session_info(self, session: str) -> SessionInfo | None:
        async with self._connection() as conn:
            row = await conn.fetchrow(f"SELECT {_SESSION_COLUMNS} FROM ct_sessions WHERE session = $1", session)
        return SessionInfo(**dict(row)) if row is not None and row["last_seq"] > 0 else None

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
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"SELECT {_SESSION_COLUMNS} FROM ct_sessions WHERE last_seq > 0 "
                "AND ($1::text IS NULL OR agent = $1) AND ($2::text IS NULL OR tenant = $2) "
                "AND ($3::text IS NULL OR status = $3) AND ($4::bigint IS NULL OR last_at_ms >= $4) "
                "AND ($5::bigint IS NULL OR first_at_ms <= $5) "
                f"ORDER BY {column} {direction} NULLS LAST, session LIMIT $6",
                agent,
                tenant,
                status,
                since_ms,
                until_ms,
                limit,
            )
        return [SessionInfo(**dict(r)) for r in rows]

    async def feed(
        self, after: FeedPosition | None = None, *, limit: int = 1000, session: str | None = None
    ) -> list[tuple[FeedPosition, Event]]:
        after = after or FeedPosition(0, 0)
        async with self._connection() as conn:
            rows = await conn.fetch(_FEED, str(after.txid), after.pos, limit, session)
        return [(FeedPosition(r["txid"], r["pos"]), _row_to_event(r)) for r in rows]

    async def head(self) -> FeedPosition:
        # Not the newest row: a transaction still in flight may hold a lower txid, and its events would
        # land behind that position. (xmin, 0) is after every settled row and before every row of a
        # transaction that was still running (or not yet begun) — exactly the feed's own horizon.
        async with self._connection() as conn:
            xmin = await conn.fetchval("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
        return FeedPosition(int(xmin), 0)

    def change_waiter(self) -> ChangeWaiter:
        return _NotifyWaiter(self.url, self.tenant)

    # -- snapshots ---------------------------------------------------------------------------

    async def erase(self, session: str) -> int:
        async with self._connection() as conn, conn.transaction():
            # The row is only there for this store's tenant: another tenant's session is "not found".
            owner = await conn.fetchrow("SELECT tenant FROM ct_sessions WHERE session = $1 FOR UPDATE", session)
            if owner is None:
                if await conn.fetchval("SELECT 1 FROM ct_tombstones WHERE session = $1", session) is None:
                    raise SessionNotFound(session)
                return 0
            status = await conn.execute("DELETE FROM ct_events WHERE session = $1", session)
            count = int(status.rsplit(" ", 1)[1])
            await conn.execute("DELETE FROM ct_snapshots WHERE session = $1", session)
            await conn.execute("DELETE FROM ct_sessions WHERE session = $1", session)
            await conn.execute(
                "INSERT INTO ct_tombstones (session, erased_at_ms, events, tenant) VALUES ($1, $2, $3, $4) "
                "ON CONFLICT (session) DO UPDATE SET events = ct_tombstones.events + EXCLUDED.events",
                session,
                now_ms(),
                count,
                owner["tenant"],
            )
            return count

    async def tombstone(self, session: str) -> Tombstone | None:
        async with self._connection() as conn:
            row = await conn.fetchrow(
                "SELECT session, erased_at_ms, events FROM ct_tombstones WHERE session = $1", session
            )
        return Tombstone(row[0], row[1], row[2]) if row is not None else None

    async def rewrite_data(self, session: str, changes: Sequence[tuple[int, dict[str, Any]]]) -> None:
        async with self._connection() as conn, conn.transaction():
            await conn.executemany(
                "UPDATE ct_events SET data = $3::jsonb WHERE session = $1 AND seq = $2",
                [(session, seq, orjson.dumps(data).decode()) for seq, data in changes],
            )
            await conn.execute("DELETE FROM ct_snapshots WHERE session = $1", session)

    async def save_snapshot(self, session: str, seq: int, version: int, state: bytes) -> None:
        async with self._connection() as conn:
            await conn.execute(
                "INSERT INTO ct_snapshots (session, version, seq, state, created_at_ms) "
                "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                session,
                version,
                seq,
                state,
                now_ms(),
            )

    async def load_snapshot(
        self, session: str, version: int, *, max_seq: int | None = None
    ) -> tuple[int, bytes] | None:
        async with self._connection() as conn:
            row = await conn.fetchrow(
                "SELECT seq, state FROM ct_snapshots WHERE session = $1 AND version = $2 "
                "AND ($3::int IS NULL OR seq <= $3) ORDER BY seq DESC LIMIT 1",
                session,
                version,
                max_seq,
            )
        return (row["seq"], bytes(row["state"])) if row else None

    async def close(self) -> None:
        await self.engine.dispose()


class _NotifyWaiter(ChangeWaiter):
    """LISTEN on a dedicated connection; reconnects lazily after it is lost (readers poll meanwhile)."""

    def __init__(self, url: str, tenant: str | None = None) -> None:
        self._dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._tenant = tenant
        self._conn: asyncpg.Connection | None = None
        self._woken = asyncio.Event()

    def _on_notify(self, *_: object) -> None:
        self._woken.set()

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
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._woken.wait(), seconds)
        self._woken.clear()

    async def close(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=2)
        self._conn = None


__all__ = ["PostgresEventStore", "StoreUnavailable"]
