"""calltape on Citus: the same schema, sharded by ``session``, every append committed on one shard.

Citus spreads PostgreSQL tables over worker nodes by a distribution column. calltape's data
partitions by session, so every calltape table is distributed by ``session`` and co-located with
``ct_sessions`` (a session's summary, events, snapshots and tombstone live on the same shard).
``calltape db upgrade`` does it when the database has the ``citus`` extension (see :func:`distribute`).

Three things differ from a single PostgreSQL, and :class:`CitusEventStore` handles them:

- **One shard per transaction.** An append of several sessions is split by shard, one transaction
  each (they run side by side on the pool). A transaction that writes one shard commits in one
  phase; one that writes several would commit by two-phase commit. Atomicity across sessions is
  not promised on Citus; each session's events still commit together and in order.
- **The global feed's horizon is read on the coordinator.** The feed orders by ``(txid, pos)``
  where ``txid`` is the coordinator's transaction id (the column's default is evaluated there). A
  one-phase Citus commit makes the worker's rows visible *before* the coordinator's transaction
  ends, so a row whose ``txid`` is below the coordinator's ``pg_snapshot_xmin`` is settled on its
  worker too: the feed reads the horizon on the coordinator first, then reads the shards below it.
  (Evaluated on a worker, that horizon compares the coordinator's ids with the worker's own; and a
  two-phase commit makes rows visible only after the coordinator's transaction ended, which is why
  every append must stay on one shard.)
- **Errors.** A worker's unique violation reaches the coordinator through COPY as SQLSTATE XX000
  (internal error), not 23505; it is read as the duplicate it is, so appends stay idempotent.

The session summary ``UPDATE`` names its sessions as constants (so it routes to their shard instead
of locking all of them) and the wake-up ``NOTIFY`` is a statement of its own, run on the coordinator
where subscribers LISTEN.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Any

import asyncpg
from sqlalchemy import Connection, text

from calltape.errors import CalltapeError
from calltape.events import Event
from calltape.eventstore import postgres
from calltape.eventstore.append_plan import SessionInfo
from calltape.eventstore.postgres import PgWriter, PostgresEventStore
from calltape.eventstore.queries import dumps_data, to_session_info
from calltape.eventstore.schema import EVENT_COLUMNS, SESSION_COLUMNS
from calltape.eventstore.tenancy import CHANNEL, refuse_foreign

DISTRIBUTION_COLUMN = "session"
"""Every calltape table is sharded by its session."""

ANCHOR = "ct_sessions"
"""The table the others are co-located with."""

DISTRIBUTED = (ANCHOR, "ct_events", "ct_snapshots", "ct_tombstones")
"""The tables :func:`distribute` shards, in order (the anchor first)."""

NO_TENANTS = (
    "calltape does not keep tenants apart on a Citus cluster yet: open the store without a tenant "
    "(one deployment per tenant), or use a single PostgreSQL"
)
"""Why a store on Citus refuses a tenant (the tenant policies read ct_sessions in a subquery: see :func:`_prepare`)."""

_HAS_CITUS = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
_IS_DISTRIBUTED = "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass(:t))"


def has_citus(conn: Connection) -> bool:
    """Whether the database has the ``citus`` extension."""
    return bool(conn.execute(text(_HAS_CITUS)).scalar())


def is_distributed(conn: Connection, table: str = "ct_events") -> bool:
    """Whether ``table`` is a Citus distributed table (False without the extension)."""
    return has_citus(conn) and bool(conn.execute(text(_IS_DISTRIBUTED), {"t": table}).scalar())


def distribute(conn: Connection, *, required: bool = False) -> list[str]:
    """Distributes the calltape tables by session, co-located with ``ct_sessions``; returns those it
    distributed now (none when they already are: it is idempotent).

    Without the ``citus`` extension it does nothing, unless ``required`` (``db upgrade --citus``), which
    then refuses in one sentence. Existing rows move to the shards (the tables are locked meanwhile)."""
    if not has_citus(conn):
        if required:
            raise CalltapeError(
                "the database has no citus extension: run CREATE EXTENSION citus (and add the workers) first"
            )
        return []
    done: list[str] = []
    for table in DISTRIBUTED:
        if is_distributed(conn, table):
            continue
        if not done:
            _prepare(conn)
        colocate = "default" if table == ANCHOR else ANCHOR
        conn.execute(
            text("SELECT create_distributed_table(CAST(:t AS regclass), :c, colocate_with => :w)"),
            {"t": table, "c": DISTRIBUTION_COLUMN, "w": colocate},
        )
        done.append(table)
    return done


# The erasure guard (migration 0002) fires on each shard of ct_sessions, on a worker, where a query of
# the distributed ct_tombstones would be a distributed query nested in a shard's (Citus refuses it): it
# reads the co-located shard of ct_tombstones instead, on the same node. Unchanged on a plain table.
_GUARD = """
CREATE OR REPLACE FUNCTION ct_refuse_erased() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path TO {path} AS $$
DECLARE
    tombstones text := 'ct_tombstones';
    erased boolean;
BEGIN
    IF TG_TABLE_NAME <> 'ct_sessions' THEN
        tombstones := 'ct_tombstones_' || get_shard_id_for_distribution_column('ct_tombstones', NEW.session);
    END IF;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I WHERE session = $1)', TG_TABLE_SCHEMA, tombstones)
        INTO erased USING NEW.session;
    IF erased THEN
        RAISE EXCEPTION 'calltape: session erased' USING ERRCODE = 'P0001', HINT = 'calltape-erased';
    END IF;
    RETURN NEW;
END $$
"""

_SUBQUERY_POLICIES = ("ct_events", "ct_snapshots")
"""Tables whose tenant policy (migration 0003) reads ct_sessions in a subquery, which Citus refuses."""


def _prepare(conn: Connection) -> None:
    """What Citus needs before the tables distribute: the shard-aware erasure guard (a trigger, which
    Citus then creates on every shard), and no subquery policies. Without those policies the database
    no longer keeps tenants apart, so a store on Citus refuses to be opened for a tenant."""
    path = conn.execute(text("SELECT current_setting('search_path')")).scalar()
    conn.execute(text(_GUARD.format(path=path)))
    conn.execute(text("SET LOCAL citus.enable_unsafe_triggers = on"))
    for table in _SUBQUERY_POLICIES:
        conn.execute(text(f"DROP POLICY IF EXISTS ct_tenant ON {table}"))
        conn.execute(text(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY"))
        conn.execute(text(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY"))


# -- appending on one shard ------------------------------------------------------------------

_SHARDS = f"""
SELECT s, get_shard_id_for_distribution_column('{ANCHOR}', s) FROM unnest($1::text[]) AS s
"""

# Rows travel as VALUES, not ``unnest`` arrays: Citus runs ``INSERT … SELECT FROM unnest(…)`` through
# intermediate results on the coordinator, and that commits by two-phase commit even on one shard.
_LOCK_SESSIONS = """
INSERT INTO ct_sessions (session, tenant, status, last_seq, epoch) VALUES {values}
ON CONFLICT (session) DO UPDATE SET session = EXCLUDED.session
RETURNING {returning}
"""

_INSERT_EVENTS = """
INSERT INTO ct_events ({columns}) VALUES {values}
ON CONFLICT (session, id) DO NOTHING
"""

_EVENT_TYPES = ("text", "integer", "text", "text", "bigint", "text", "integer", "text::jsonb")
"""``ct_events``' written columns (:data:`~calltape.eventstore.schema.EVENT_COLUMNS`), as parameter casts."""

_ROWS_PER_INSERT = 2000
"""Events per ``INSERT … VALUES`` (PostgreSQL takes at most 32,767 parameters a statement)."""


@functools.lru_cache(maxsize=256)
def _lock_sessions(count: int) -> str:
    values = ", ".join(f"(${i + 2}::text, $1::text, 'active', 0, 1)" for i in range(count))
    return _LOCK_SESSIONS.format(values=values, returning=postgres._names(SESSION_COLUMNS))


@functools.lru_cache(maxsize=256)
def _insert_events(count: int) -> str:
    width = len(_EVENT_TYPES)
    values = ", ".join(
        "(" + ", ".join(f"${row * width + i + 1}::{t}" for i, t in enumerate(_EVENT_TYPES)) + ")"
        for row in range(count)
    )
    return _INSERT_EVENTS.format(columns=postgres._names(EVENT_COLUMNS), values=values)


_UPDATE_SESSIONS = f"""
UPDATE ct_sessions s SET {", ".join(f"{c.name} = v.{c.name}" for c in SESSION_COLUMNS[1:])}
FROM unnest({postgres._arrays(SESSION_COLUMNS)}) AS v({postgres._names(SESSION_COLUMNS)})
WHERE s.session = v.session AND s.session = ANY($1::text[])
"""

_NOTIFY = f"""
SELECT pg_notify(c, '') FROM (SELECT '{CHANNEL}' AS c
UNION SELECT '{CHANNEL}_' || md5(coalesce(t, '')) FROM unnest($1::text[]) AS t) AS channels
"""

_DUPLICATE = "duplicate key value violates unique constraint"


def is_duplicate(exc: BaseException) -> bool:
    """Whether ``exc`` is a unique violation, as PostgreSQL reports it (23505) or as Citus relays a
    worker's through COPY (XX000 with the worker's message)."""
    if isinstance(exc, asyncpg.UniqueViolationError):
        return True
    return isinstance(exc, asyncpg.InternalServerError) and _DUPLICATE in str(exc)


class CitusWriter(PgWriter):
    """The append's steps on Citus: summaries routed to their shard, duplicates read as duplicates."""

    async def lock_sessions(self, sessions: Sequence[str]) -> dict[str, SessionInfo]:
        """Creates and locks the session rows, as on PostgreSQL, in one routed statement."""
        found = await self.conn.fetch(_lock_sessions(len(sessions)), self.tenant, *sessions)
        rows = {r[0]: to_session_info(r) for r in found}
        refuse_foreign(rows.values(), self.tenant, self.everyone)
        return rows

    async def insert_new(self, events: Sequence[Event]) -> int:
        """Inserts, skipping ids already stored; returns how many were written."""
        written = 0
        for start in range(0, len(events), _ROWS_PER_INSERT):
            chunk = events[start : start + _ROWS_PER_INSERT]
            args = [
                value
                for e in chunk
                for value in (e.session, e.seq, e.id, e.type, e.at_ms, e.agent, e.epoch, dumps_data(e.data))
            ]
            written += postgres._rowcount(await self.conn.execute(_insert_events(len(chunk)), *args))
        return written

    async def insert(self, events: Sequence[Event]) -> None:
        """INSERT, never COPY: Citus commits every COPY by two-phase commit, even on one shard. A stored
        id makes it raise, as on PostgreSQL (and a unique violation Citus relays as an internal error
        is read as the duplicate it is)."""
        try:
            written = await self.insert_new(events)
        except asyncpg.InternalServerError as exc:
            if is_duplicate(exc):
                raise postgres._StoredDuplicate from exc
            raise
        if written != len(events):
            raise postgres._StoredDuplicate

    async def update_sessions(self, rows: Sequence[SessionInfo]) -> None:
        """The summaries, on their shard only; then the wake-up, on the coordinator."""
        await self.conn.execute(_UPDATE_SESSIONS, *([getattr(r, c.name) for r in rows] for c in SESSION_COLUMNS))
        await self.conn.execute(_NOTIFY, sorted({r.tenant or "" for r in rows}))


# The single-node feed with its horizon as a parameter, read on the coordinator beforehand.
_FEED = postgres._FEED.replace("pg_snapshot_xmin(pg_current_snapshot())", "$6::text::xid8")
assert _FEED != postgres._FEED

_HORIZON = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"


class CitusEventStore(PostgresEventStore):
    """The PostgreSQL store on a Citus cluster (connect to the coordinator): appends split by shard,
    each committed in one phase; the feed's horizon read on the coordinator."""

    writer_class = CitusWriter
    parallel_shards = 8
    """Shard transactions of one append run side by side, at most this many (the pool keeps 10
    connections; more would open and close connections, each of which Citus connects to its workers)."""

    def _known_rows(self, sessions: Sequence[str]) -> dict[str, SessionInfo] | None:
        # No one-statement append from remembered rows here: that statement reads its rows from arrays
        # (Citus would run it through the coordinator, by two-phase commit). Every append locks its rows.
        return None

    async def shards(self, sessions: Sequence[str]) -> dict[str, int]:
        """The shard holding each session (asked of the coordinator's metadata, never cached, so a
        rebalance cannot leave a stale answer behind)."""
        async with self._connection() as conn:
            return {r[0]: r[1] for r in await conn.fetch(_SHARDS, list(sessions))}

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        """Appends ``events`` in one transaction per shard (see the module); returns the stored events."""
        sessions = {e.session for e in events}
        if len(sessions) < 2 or expected_seq is not None:  # (expected_seq refuses several sessions)
            return await super().append(events, expected_seq=expected_seq)
        shard_of = await self.shards(sorted(sessions))
        groups: dict[int, list[int]] = {}
        for i, event in enumerate(events):
            groups.setdefault(shard_of[event.session], []).append(i)
        if len(groups) == 1:
            return await super().append(events, expected_seq=expected_seq)
        # One transaction per shard, side by side; every group runs to its end, then the first error
        # (in the batch's order) is raised. Groups that committed stay committed: re-appending the
        # batch is harmless (ids make it idempotent), which is what the recorder does.
        parts = [[events[i] for i in idx] for idx in groups.values()]
        room = asyncio.Semaphore(self.parallel_shards)

        async def one(part: list[Event]) -> list[Event]:
            async with room:
                return await super(CitusEventStore, self).append(part)

        outcomes = await asyncio.gather(*(one(p) for p in parts), return_exceptions=True)
        results: list[Event | None] = [None] * len(events)
        for idx, outcome in zip(groups.values(), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                raise outcome
            for i, stored in zip(idx, outcome, strict=True):
                results[i] = stored
        return [e for e in results if e is not None]

    async def _feed_rows(self, conn: Any, args: tuple[Any, ...]) -> list[Any]:
        """The feed up to the coordinator's horizon, read before the shards are (see the module)."""
        horizon = await conn.fetchval(_HORIZON)
        return list(await conn.fetch(_FEED, *args, horizon))
