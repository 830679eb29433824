"""calltape on Citus: the same schema, sharded by ``session``, every append committed on one shard.

Citus spreads PostgreSQL tables over worker nodes by a distribution column. calltape's data
partitions by session, so every calltape table is distributed by ``session`` and co-located with
``ct_sessions`` (a session's summary, events, snapshots and tombstone live on the same shard).
``calltape db upgrade`` does it when the database has the ``citus`` extension (see :func:`distribute`).

Three things differ from a single PostgreSQL, and :class:`CitusEventStore` handles them:

- **One worker per transaction, one shard per statement.** An append of several sessions is split
  by the worker node holding their shards, one transaction each (they run side by side on the pool),
  and inside it every statement names the sessions of one shard. Citus then runs the whole transaction
  over one connection to that worker and commits it in one phase (it turns to two-phase commit when a
  modifying transaction reaches a second node, or when one statement modifies several shards:
  ``Activate2PCIfModifyingTransactionExpandsToNewNode`` and ``TaskListRequires2PC`` in Citus's
  executor). A batch of 200 sessions is two transactions on two workers, not one per shard touched.
  Atomicity across sessions is not promised on Citus; each session's events still commit together
  and in order.
- **The global feed's horizon is read on the coordinator.** The feed orders by ``(txid, pos)``
  where ``txid`` is the coordinator's transaction id (the column's default is evaluated there). A
  one-phase Citus commit makes the worker's rows visible *before* the coordinator's transaction
  ends, so a row whose ``txid`` is below the coordinator's ``pg_snapshot_xmin`` is settled on its
  worker too: the feed reads the horizon on the coordinator first, then reads the shards below it.
  (Evaluated on a worker, that horizon compares the coordinator's ids with the worker's own.) A
  two-phase commit makes rows visible only after the coordinator's transaction ended, so appends stay
  in one phase, and the horizon is also held below every two-phase commit Citus has not yet confirmed
  on its workers (an import's: see ``_HORIZON``).
- **Errors.** A worker's unique violation reaches the coordinator through COPY as SQLSTATE XX000
  (internal error), not 23505; it is read as the duplicate it is, so appends stay idempotent.

Tenants are kept apart by the database, as on one node, with two changes:

- **Policies read the row.** Citus refuses row-level-security policies with subqueries, and on one node
  the policies of ``ct_events`` and ``ct_snapshots`` read ``ct_sessions``. Their rows carry their
  session's tenant (migration 0005, written from the session's summary row by every append), and on
  Citus their policy compares that column as ``ct_sessions``' does (:func:`_row_policies`). What the
  subquery also did, refusing a row under another tenant's session id, a foreign key
  ``(session, tenant)`` to ``ct_sessions`` does between the co-located shards (:func:`_session_keys`):
  checked on the worker that holds both, deferred to the commit, about 7 µs a row (a 40,000-row insert
  on this cluster), against a Citus append's milliseconds. A shard-aware trigger (as the erasure guard
  is) would cost a PL/pgSQL call and a dynamic query per row. The key skips rows whose tenant is NULL,
  so a connection without a tenant can still add rows under a tenant's session id (stated in docs/operations/citus.md).
- **The tenant travels with each transaction.** The policies run on the workers, and the setting
  ``calltape.tenant`` a calltape connection starts with is the coordinator's alone: a worker reads no
  tenant. A store held to a tenant begins every transaction with ``SET LOCAL`` of it, which Citus
  hands to the workers it reaches (``citus.propagate_set_commands = 'local'``, set in the same
  message, which is the transaction's BEGIN too), and runs its reads in such a transaction
  (:meth:`CitusEventStore.tenant_scope`): no round trip more per append, two more per read (the
  opening, COMMIT). A statement outside such
  a transaction reaches the workers without a tenant: it sees the sessions without one, never another
  tenant's. (Stores without a tenant, and the operator's, are unchanged.)

The session summary ``UPDATE`` names its sessions as constants (so it routes to their shard instead
of locking all of them), and a shard's events travel with its summaries in one statement
(:func:`_locked_write` under the session locks, :func:`_known_write` without them), or from
:data:`PUSH_FROM` events on, as arrays in a statement of their own that Citus pushes down to the shard
whole (:data:`_PUSHED`). :func:`distribute` makes two shards a worker (:data:`SHARDS_PER_WORKER`): each
shard a batch touches is a statement of its transaction.
The wake-up ``NOTIFY`` runs on the coordinator, where subscribers LISTEN, in the message that begins
the transaction (:meth:`CitusEventStore.appending`): every statement is a round trip through the
coordinator, so an append sends as few as it can.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

import asyncpg
from sqlalchemy import Connection, text

from calltape.errors import CalltapeError
from calltape.events import Event
from calltape.eventstore import postgres
from calltape.eventstore.append_plan import AppendPlan, SessionInfo
from calltape.eventstore.postgres import PgWriter, PostgresEventStore
from calltape.eventstore.queries import dumps_data, to_event, to_session_info
from calltape.eventstore.schema import ROW_COLUMNS, SESSION_COLUMNS
from calltape.eventstore.store import FeedPosition, checked_batch
from calltape.eventstore.tenancy import CHANNEL, SETTING, channel, execute_each, refuse_foreign
from calltape.eventstore.writer import Key

DISTRIBUTION_COLUMN = "session"
"""Every calltape table is sharded by its session."""

ANCHOR = "ct_sessions"
"""The table the others are co-located with."""

DISTRIBUTED = (ANCHOR, "ct_events", "ct_snapshots", "ct_tombstones")
"""The tables :func:`distribute` shards, in order (the anchor first)."""

CONNECTION_SETTINGS = {
    "citus.override_table_visibility": "off",
    "citus.max_adaptive_executor_pool_size": "2",
    "citus.max_cached_conns_per_worker": "2",
}
"""Started with by every calltape PostgreSQL connection (a plain server keeps them as unused placeholders).

Citus hides shards from ``pg_class`` by checking every row a catalog query reads, and asyncpg's type
look-up, run on each new connection, took 350 ms so on a coordinator with 128 shards (4 ms without),
queued on the lock manager behind each other: 20 writers on fresh pool connections appended 70 times a
second. calltape never lists ``pg_class``, so seeing the shards there changes nothing for it.

A query over every shard (a page of the feed) may open up to 16 connections to each worker, of which
Citus keeps one when the transaction ends: every page opened and closed 15. Two, both kept, read the feed
twice as fast here; on a worker that is up to two connections for each of calltape's (the pool's 30 at
most), where Citus's defaults could open 16.
"""

_HAS_CITUS = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
_IS_DISTRIBUTED = "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass(:t))"


def has_citus(conn: Connection) -> bool:
    """Whether the database has the ``citus`` extension."""
    return bool(conn.execute(text(_HAS_CITUS)).scalar())


def is_distributed(conn: Connection, table: str = "ct_events") -> bool:
    """Whether ``table`` is a Citus distributed table (False without the extension)."""
    return has_citus(conn) and bool(conn.execute(text(_IS_DISTRIBUTED), {"t": table}).scalar())


_WORKER_GROUPS = f"""
SELECT count(DISTINCT p.groupid) FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)
WHERE s.logicalrelid = '{ANCHOR}'::regclass
"""


def worker_groups(conn: Connection) -> int:
    """How many worker nodes hold calltape's shards: the transactions one append of every session
    commits side by side (:attr:`~calltape.eventstore.store.EventStore.write_groups`)."""
    return max(1, int(conn.execute(text(_WORKER_GROUPS)).scalar() or 1))


SHARDS_PER_WORKER = 2
"""The shards :func:`distribute` gives each worker node, unless told otherwise (``db upgrade --shards N``,
or ``citus.shard_count`` set by the operator).

A recorder batch, or any append of many sessions, writes one statement per shard it touches in each
worker's transaction (a statement that wrote two shards would commit by two-phase commit), so the shards
a worker holds are the statements each of its transactions sends, each a round trip and a planning on the
coordinator; the rows of a batch spread over them, and a shard's part of 100 events or more goes in as
arrays, whose cost per row is a third of VALUES'. Measured on a 2-worker cluster (200 sessions x 50
events through the recorder, against a single PostgreSQL on the same machine): 4 shards 1.5x the single
node's time, 8 shards 1.9x, Citus's default of 32 2.8x. Every other calltape query names its session
(one shard whatever the count), but a page of the global feed asks every shard. A cluster that grows
past this many shards per worker splits them (``citus_split_shard_by_split_points``) and rebalances;
Citus merges no shards and redistributes no table with an identity column (``ct_events.pos``)."""

_WORKER_NODES = "SELECT count(*) FROM pg_dist_node WHERE isactive AND noderole = 'primary' AND shouldhaveshards"
_SHARD_COUNT_SET = "SELECT setting::int FROM pg_settings WHERE name = 'citus.shard_count' AND source <> 'default'"
_SHARD_COUNT = "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = to_regclass(:t)"


def shard_count(conn: Connection) -> int:
    """The shards :func:`distribute` makes when not told: ``citus.shard_count`` where the operator set it
    (the database's, the role's or the server's setting), else :data:`SHARDS_PER_WORKER` per worker node."""
    chosen = conn.execute(text(_SHARD_COUNT_SET)).scalar()
    if chosen is not None:
        return int(chosen)
    return SHARDS_PER_WORKER * max(1, int(conn.execute(text(_WORKER_NODES)).scalar() or 0))


def distribute(conn: Connection, *, required: bool = False, shards: int | None = None) -> list[str]:
    """Distributes the calltape tables by session, co-located with ``ct_sessions``, in ``shards`` shards
    (else :func:`shard_count`'s); returns those it distributed now (none when they already are: it is
    idempotent).

    Without the ``citus`` extension it does nothing, unless ``required`` (``db upgrade --citus``) or
    ``shards`` is given, which then refuse in one sentence, as does a ``shards`` other than the count the
    tables already have. Existing rows move to the shards (the tables are locked meanwhile)."""
    if not has_citus(conn):
        if required or shards is not None:
            raise CalltapeError(
                "the database has no citus extension: run CREATE EXTENSION citus (and add the workers) first"
            )
        return []
    if shards is not None and is_distributed(conn, ANCHOR):
        have = int(conn.execute(text(_SHARD_COUNT), {"t": ANCHOR}).scalar() or 0)
        if have != shards:
            raise CalltapeError(
                f"the calltape tables are distributed in {have} shards already, and Citus cannot redistribute "
                f"them (ct_events has an identity column): split shards with citus_split_shard_by_split_points, "
                f"or distribute a new database with --shards {shards} and move the sessions there"
            )
    guard = _guard_outdated(conn)
    if guard and is_distributed(conn, ANCHOR):
        # Citus runs a function's DDL over one connection per node, and refuses it in a transaction that
        # used several for a command on the shards before (here: a policy rewritten for every shard).
        conn.execute(text("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'"))
    _row_policies(conn)
    conn.execute(text("SET LOCAL citus.enable_unsafe_triggers = on"))  # (Citus distributes no table with triggers else)
    if guard:
        _erasure_guard(conn)
    done: list[str] = []
    for table in DISTRIBUTED:
        if is_distributed(conn, table):
            continue
        if table == ANCHOR:  # (the others take its shards)
            conn.execute(
                text("SELECT create_distributed_table(CAST(:t AS regclass), :c, shard_count => :n)"),
                {"t": table, "c": DISTRIBUTION_COLUMN, "n": shards or shard_count(conn)},
            )
        else:
            conn.execute(
                text("SELECT create_distributed_table(CAST(:t AS regclass), :c, colocate_with => :w)"),
                {"t": table, "c": DISTRIBUTION_COLUMN, "w": ANCHOR},
            )
        done.append(table)
    _session_keys(conn)
    return done


# The erasure guard (migration 0002) fires on each shard of ct_sessions, on a worker, where a query of
# the distributed ct_tombstones would be a distributed query nested in a shard's (Citus refuses it): it
# reads the co-located shard of ct_tombstones instead, on the same node, by a dynamic query. On Citus it
# runs once per statement over the rows the statement inserted (a transition table), not per row before
# each insert as on one node: the dynamic query cost about 100 us a row on a worker, and a BEFORE INSERT
# trigger fires even for the rows ON CONFLICT then finds (every session an append locks). One dynamic
# query for a statement's new sessions costs about 10 us a row, none when all were there already.
_GUARD = """
CREATE OR REPLACE FUNCTION ct_refuse_erased() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path TO {path} AS $$
DECLARE
    tombstones text := 'ct_tombstones';
    one text;
    erased boolean;
BEGIN
    IF TG_TABLE_NAME <> 'ct_sessions' THEN
        SELECT session INTO one FROM ct_new_sessions LIMIT 1;
        IF one IS NULL THEN
            RETURN NULL;
        END IF;
        tombstones := 'ct_tombstones_' || get_shard_id_for_distribution_column('ct_tombstones', one);
    END IF;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM ct_new_sessions JOIN %I.%I USING (session))',
                   TG_TABLE_SCHEMA, tombstones) INTO erased;
    IF erased THEN
        RAISE EXCEPTION 'calltape: session erased' USING ERRCODE = 'P0001', HINT = 'calltape-erased';
    END IF;
    RETURN NULL;
END $$
"""

_GUARD_TRIGGER = (
    "CREATE TRIGGER ct_sessions_not_erased AFTER INSERT ON ct_sessions REFERENCING NEW TABLE AS ct_new_sessions "
    "FOR EACH STATEMENT EXECUTE FUNCTION ct_refuse_erased()"
)
_GUARD_KIND = (
    "SELECT tgtype FROM pg_trigger WHERE tgrelid = 'ct_sessions'::regclass AND tgname = 'ct_sessions_not_erased'"
)


def _guard_outdated(conn: Connection) -> bool:
    """Whether ct_sessions lacks the statement trigger :func:`_erasure_guard` gives it (migration 0002's
    guard runs per row, as did the one an older calltape distributed)."""
    kind = conn.execute(text(_GUARD_KIND)).scalar()
    return kind is None or bool(kind & 1)  # (bit 0 of tgtype: a row trigger)


def _erasure_guard(conn: Connection) -> None:
    """Gives ct_sessions the shard-aware erasure guard, a statement trigger (``citus.enable_unsafe_triggers``
    must be on). Before the tables distribute, Citus then creates it on every shard; on a cluster
    distributed by an older calltape, whose guard ran per row, Citus replaces it on every shard. The
    function comes first: Citus refuses a function's DDL after a command run on the shards in parallel."""
    path = conn.execute(text("SELECT current_setting('search_path')")).scalar()
    conn.execute(text(_GUARD.format(path=path)))
    conn.execute(text("DROP TRIGGER IF EXISTS ct_sessions_not_erased ON ct_sessions"))
    conn.execute(text(_GUARD_TRIGGER))


ROW_POLICIES = ("ct_events", "ct_snapshots")
"""Tables whose single-node tenant policy (migration 0003) reads ct_sessions in a subquery, which Citus
refuses: on Citus their policy compares the row's own ``tenant`` (migration 0005)."""

_OWN_ROW = "coalesce(tenant, '') = coalesce(current_setting('calltape.tenant', true), '')"
_POLICY = (
    "SELECT qual FROM pg_policies WHERE schemaname = current_schema() AND tablename = :t AND policyname = 'ct_tenant'"
)


def _row_policies(conn: Connection) -> None:
    """Gives :data:`ROW_POLICIES` the per-row policy ct_sessions has (idempotent: a table that has it
    is left alone). Runs before the tables distribute (Citus copies the policies to every shard), and
    on a cluster distributed by an older calltape, which had dropped the subquery policies."""
    for table in ROW_POLICIES:
        qual = conn.execute(text(_POLICY), {"t": table}).scalar()
        if qual is not None and "ct_sessions" not in qual:
            continue
        execute_each(
            conn,
            f"DROP POLICY IF EXISTS ct_tenant ON {table}",
            f"CREATE POLICY ct_tenant ON {table} USING ({_OWN_ROW}) WITH CHECK ({_OWN_ROW})",
            f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
            f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY",
        )


_KEY = "ct_sessions_tenant"
"""``UNIQUE (session, tenant)`` on ct_sessions: what the rows of events and snapshots reference."""

_REFERENCES = (
    ("ct_events", "ct_events_session_tenant"),
    ("ct_snapshots", "ct_snapshots_session_tenant"),
)
"""The foreign keys that keep events and snapshots under a session row of their own tenant."""

_HAS_CONSTRAINT = "SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = :n AND conrelid = to_regclass(:t))"


def _session_keys(conn: Connection) -> None:
    """What the subquery policies also did on one node: a row of ``ct_events`` or ``ct_snapshots`` names
    a session row of its own tenant, ``(session, tenant)``, by a foreign key between the co-located
    shards (checked on the worker, deferred to the commit: an append writes its events before the
    summary that may set a new session's tenant). Added once the tables are distributed (idempotent).

    A foreign key skips a row whose ``tenant`` is NULL (``MATCH SIMPLE``): a connection without a
    tenant, whose rows the policies keep NULL, can still add rows under a tenant's session id."""
    if not conn.execute(text(_HAS_CONSTRAINT), {"n": _KEY, "t": ANCHOR}).scalar():
        conn.execute(text(f"ALTER TABLE {ANCHOR} ADD CONSTRAINT {_KEY} UNIQUE (session, tenant)"))
    for table, name in _REFERENCES:
        if not conn.execute(text(_HAS_CONSTRAINT), {"n": name, "t": table}).scalar():
            conn.execute(
                text(
                    f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY (session, tenant) "
                    f"REFERENCES {ANCHOR} (session, tenant) DEFERRABLE INITIALLY DEFERRED"
                )
            )


# -- appending on one shard ------------------------------------------------------------------

_PLACEMENTS = f"""
SELECT s, sh.shard, p.groupid FROM unnest($1::text[]) AS s
CROSS JOIN LATERAL (SELECT get_shard_id_for_distribution_column('{ANCHOR}', s) AS shard) AS sh
JOIN pg_dist_placement p ON p.shardid = sh.shard
"""
"""Each session's shard and the worker (group) holding it (one placement per shard: calltape's tables
are not replicated by Citus, which would make every write two-phase)."""

_SHARD_OF: ContextVar[Mapping[str, int] | None] = ContextVar("calltape_citus_shard_of", default=None)
"""The shard of each session of the append under way (set by :meth:`CitusEventStore.append` for an
append that spans shards; the writer then issues one statement per shard)."""

T = TypeVar("T")


def _by_shard(items: Iterable[T], session_of: Any) -> list[list[T]]:
    """``items`` split by their session's shard, shards in ascending order (every writer locks in
    the same order, so two appends on one worker never deadlock); one part when no split is asked."""
    shard_of = _SHARD_OF.get()
    if shard_of is None:
        return [list(items)]
    parts: dict[int, list[T]] = {}
    for item in items:
        parts.setdefault(shard_of[session_of(item)], []).append(item)
    return [parts[shard] for shard in sorted(parts)]


# Rows travel as VALUES, or as arrays joined to their shard's session rows (``_PUSHED``), never as
# ``INSERT … SELECT FROM unnest(…)`` alone: Citus runs that through intermediate results on the
# coordinator, and commits it by two-phase commit even on one shard.
_LOCK_SESSIONS = """
INSERT INTO ct_sessions (session, tenant, status, last_seq, epoch) VALUES {values}
ON CONFLICT (session) DO UPDATE SET session = EXCLUDED.session
RETURNING {returning}
"""

_INSERT_EVENTS = """
INSERT INTO ct_events ({columns}) VALUES {values}
ON CONFLICT (session, id) DO NOTHING
"""


_ROWS_PER_INSERT = 2000
"""Events per ``INSERT … VALUES`` (PostgreSQL takes at most 32,767 parameters a statement)."""

PUSH_FROM = 100
"""A shard's part of this many events or more goes in as arrays (:data:`_PUSHED`), a smaller one as
``INSERT … VALUES``: arrays cost the coordinator a planning over every shard and a round trip for the
positions, VALUES cost it every row, evaluated and deparsed for its worker, and the worker parses that
text again. Measured on one shard of a 2-worker cluster, the two take as long at 60
to 80 events and the arrays half as long at 300; their coordinator's CPU is the smaller from fewer rows on."""

_WIDTH = len(ROW_COLUMNS)

# A shard's events as arrays: ``INSERT … SELECT`` from ``unnest`` joined to the shard's own session rows
# (the partition column comes from a distributed table, so Citus pushes the statement down to that shard
# whole, one task, its parameters intact: no row evaluated or deparsed on the coordinator). Citus pulls an
# ``INSERT … SELECT`` through the coordinator, by two-phase commit, when a column takes a volatile
# default, so the positions and the transaction id come as values, read on the coordinator first
# (:data:`_POSITIONS`): the same values the defaults would have given there.
_PUSHED = f"""
INSERT INTO ct_events (pos, txid, {postgres._names(ROW_COLUMNS)}) OVERRIDING SYSTEM VALUE
SELECT v.pos, ${_WIDTH + 2}::text::xid8, s.session, {", ".join(f"v.{c.name}" for c in ROW_COLUMNS[1:])}
FROM ct_sessions s
JOIN unnest({postgres._arrays(ROW_COLUMNS)}, ${_WIDTH + 1}::bigint[]) AS v({postgres._names(ROW_COLUMNS)}, pos)
    ON v.session = s.session
WHERE s.session = ANY(${_WIDTH + 3}::text[])
ON CONFLICT (session, id) DO NOTHING
"""

_POSITIONS = """
SELECT pg_current_xact_id()::text,
       array(SELECT nextval(pg_get_serial_sequence('ct_events', 'pos')) FROM generate_series(1, $1))
"""
"""The transaction's id on the coordinator and ``$1`` positions from the coordinator's sequence."""


@functools.lru_cache(maxsize=256)
def _lock_sessions(count: int) -> str:
    values = ", ".join(f"(${i + 2}::text, $1::text, 'active', 0, 1)" for i in range(count))
    return _LOCK_SESSIONS.format(values=values, returning=postgres._names(SESSION_COLUMNS))


def _values(count: int, first: int = 1) -> str:
    # No casts: the parameters take their columns' types, and the coordinator, which evaluates and
    # deparses every row for its worker, spent a third less on a row without them (300-row statements).
    width = len(ROW_COLUMNS)
    return ", ".join("(" + ", ".join(f"${first + row * width + i}" for i in range(width)) + ")" for row in range(count))


@functools.lru_cache(maxsize=256)
def _insert_events(count: int) -> str:
    return _INSERT_EVENTS.format(columns=postgres._names(ROW_COLUMNS), values=_values(count))


_UPDATE_SESSIONS = f"""
UPDATE ct_sessions s SET {", ".join(f"{c.name} = v.{c.name}" for c in SESSION_COLUMNS[1:])}
FROM unnest({postgres._arrays(SESSION_COLUMNS)}) AS v({postgres._names(SESSION_COLUMNS)})
WHERE s.session = v.session AND s.session = ANY($1::text[])
"""

_KNOWN_SUMMARIES = f"""
UPDATE ct_sessions s SET {", ".join(f"{c.name} = v.{c.name}" for c in SESSION_COLUMNS[1:])}
FROM unnest({postgres._arrays(SESSION_COLUMNS)}, ${len(SESSION_COLUMNS) + 1}::int[])
    AS v({postgres._names(SESSION_COLUMNS)}, old_last_seq)
WHERE s.session = v.session AND s.last_seq = v.old_last_seq AND s.session = ANY($1::text[])
"""
"""The known-rows append's summaries, written only over rows that are still what the writer knew."""

_KNOWN_SUMMARY = f"""
UPDATE ct_sessions SET {", ".join(f"{c.name} = ${i + 1}" for i, c in enumerate(SESSION_COLUMNS) if i)}
WHERE session = $1 AND last_seq = ${len(SESSION_COLUMNS) + 1}
"""
"""The same for one session, as plain parameters: Citus plans ``session = $1`` on one table by its fast
path, a third cheaper than the join with ``unnest`` (one-session appends are the common case)."""


def _events_cte(count: int, first: int) -> str:
    """The INSERT of ``count`` events whose parameters start at ``$first`` (after the UPDATE's), as a CTE
    of a shard's one statement: Citus runs each CTE as a task of its own on the same worker connection,
    in order, so the statement stays one-phase. A stored id raises."""
    return f"INSERT INTO ct_events ({postgres._names(ROW_COLUMNS)}) VALUES {_values(count, first)}"


@functools.lru_cache(maxsize=256)
def _locked_write(count: int) -> str:
    """A shard's part of an append under the session locks: its ``count`` events, then its summaries
    (``_UPDATE_SESSIONS``, whose parameters come first); the rows are locked already, so the events may
    go first. The statement's row count is the UPDATE's."""
    return f"WITH e AS ({_events_cte(count, len(SESSION_COLUMNS) + 1)}){_UPDATE_SESSIONS}"


@functools.lru_cache(maxsize=512)
def _known_write(one_session: bool, count: int) -> str:
    """A shard's part of the known-rows append: the guarded summaries first (``_KNOWN_SUMMARY`` or
    ``_KNOWN_SUMMARIES``, whose parameters come first), so the row's lock is taken before any event
    exists, as under the session locks; then the ``count`` events; the result is how many summaries the
    UPDATE wrote (counted on the coordinator)."""
    summaries = _KNOWN_SUMMARY if one_session else _KNOWN_SUMMARIES
    insert = _events_cte(count, len(SESSION_COLUMNS) + 2)
    return f"WITH u AS ({summaries} RETURNING 1), e AS ({insert}) SELECT count(*) FROM u"


def wake_statement(tenants: Iterable[str | None]) -> str:
    """The wake-up of the followers of rows of ``tenants``: the all-sessions channel and each tenant's
    (``NOTIFY_TENANTS``' channels; a row without a tenant wakes the empty name's, as its ``coalesce``
    does), inline, since they are hashes with nothing to quote, so it can share a message with BEGIN."""
    channels = [CHANNEL, *sorted({channel(t or "") for t in tenants})]
    return "SELECT " + ", ".join(f"pg_notify('{c}', '')" for c in channels)


@contextlib.asynccontextmanager
async def _begun(conn: asyncpg.Connection, statements: str) -> AsyncIterator[None]:
    """A transaction begun in the same message as ``statements`` (the simple query protocol runs them
    together: one round trip). A connection whose rollback fails is closed, never handed back with its
    transaction open."""
    try:
        await conn.execute(f"BEGIN; {statements}" if statements else "BEGIN")
        yield
    except BaseException:
        try:
            await conn.execute("ROLLBACK")
        except BaseException:
            conn.terminate()
        raise
    await conn.execute("COMMIT")


# The stored-id lookups name their sessions as constants too: joined to ``unnest`` alone, Citus cannot
# prune and reads every shard; with the sessions, one session's lookup is routed to its shard.
_ROUTED = " WHERE ct_events.session = ANY($3::text[])"
_FIND_STORED = postgres._FIND_STORED + _ROUTED
_FIND_STORED_KEYS = postgres._FIND_STORED_KEYS + _ROUTED

_SCOPE = f"SET LOCAL citus.propagate_set_commands = 'local'; SET LOCAL {SETTING} = "
"""Citus hands a transaction's ``SET LOCAL`` to its workers when asked to (one round trip: simple query)."""


def tenant_scope(tenant: str) -> str:
    """The statements that hold a transaction to ``tenant`` on every node it reaches (run first in it)."""
    return _SCOPE + "'" + tenant.replace("'", "''") + "'"


_DUPLICATE = "duplicate key value violates unique constraint"


def is_duplicate(exc: BaseException) -> bool:
    """Whether ``exc`` is a unique violation, as PostgreSQL reports it (23505) or as Citus relays a
    worker's through COPY (XX000 with the worker's message)."""
    if isinstance(exc, asyncpg.UniqueViolationError):
        return True
    return isinstance(exc, asyncpg.InternalServerError) and _DUPLICATE in str(exc)


@contextlib.contextmanager
def _relayed_duplicates() -> Iterator[None]:
    """A unique violation Citus relays as an internal error raises as the stored duplicate it is."""
    try:
        yield
    except asyncpg.InternalServerError as exc:
        if is_duplicate(exc):
            raise postgres._StoredDuplicate from exc
        raise


def _row_args(events: Sequence[Event], rows: Mapping[str, SessionInfo]) -> list[Any]:
    """The parameters of ``events``' rows in a VALUES list (:data:`ROW_COLUMNS`, row after row)."""
    return [
        value
        for e in events
        for value in (
            e.session,
            e.seq,
            e.id,
            e.type,
            e.at_ms,
            e.agent,
            e.epoch,
            dumps_data(e.data),
            rows[e.session].tenant,
        )
    ]


def _by_session(events: Iterable[Event]) -> dict[str, list[Event]]:
    """``events`` grouped by session, each session's in their order."""
    grouped: dict[str, list[Event]] = {}
    for event in events:
        grouped.setdefault(event.session, []).append(event)
    return grouped


def _key_arrays(keys: Sequence[Key]) -> tuple[list[str], list[str], list[str]]:
    """The lookup's parameters: the keys' sessions and ids, then each session once (for routing)."""
    return [k[0] for k in keys], [k[1] for k in keys], sorted({k[0] for k in keys})


class CitusWriter(PgWriter):
    """The append's steps on Citus: one statement per shard (see the module), summaries routed to their
    shard, duplicates read as duplicates."""

    woken: frozenset[str | None] = frozenset()
    """The tenants whose followers the transaction's opening woke already."""

    async def lock_sessions(self, sessions: Sequence[str]) -> dict[str, SessionInfo]:
        """Creates and locks the session rows, as on PostgreSQL, one routed statement per shard."""
        rows: dict[str, SessionInfo] = {}
        for part in _by_shard(sorted(sessions), str):
            found = await self.conn.fetch(_lock_sessions(len(part)), self.tenant, *part)
            rows.update((r[0], to_session_info(r)) for r in found)
        refuse_foreign(rows.values(), self.tenant, self.everyone)
        return rows

    async def stored(self, keys: Sequence[Key]) -> dict[Key, Event]:
        """The stored events of ``keys``, read shard by shard, each read routed by its sessions."""
        found: dict[Key, Event] = {}
        for part in _by_shard(keys, lambda k: k[0]):
            found.update({(r[0], r[2]): to_event(r) for r in await self.conn.fetch(_FIND_STORED, *_key_arrays(part))})
        return found

    async def stored_keys(self, keys: Sequence[Key]) -> set[Key]:
        """Which of ``keys`` are stored, read shard by shard, each read routed by its sessions."""
        found: set[Key] = set()
        for part in _by_shard(keys, lambda k: k[0]):
            found |= {(r[0], r[1]) for r in await self.conn.fetch(_FIND_STORED_KEYS, *_key_arrays(part))}
        return found

    async def insert_new(self, events: Sequence[Event], rows: Mapping[str, SessionInfo]) -> int:
        """Inserts, skipping ids already stored; returns how many were written. Each row carries its
        session's tenant, from ``rows``."""
        return sum([await self._insert_part(part, rows) for part in _by_shard(events, lambda e: e.session)])

    async def _insert_part(self, events: Sequence[Event], rows: Mapping[str, SessionInfo]) -> int:
        """One shard's events, skipping ids already stored (as arrays from :data:`PUSH_FROM` events on,
        else as VALUES); how many were written. Events not split by shard (a bulk import's, which commits
        over every shard anyway) go as VALUES, which Citus routes row by row: as arrays, every shard's
        task would receive all of them."""
        one_shard = _SHARD_OF.get() is not None or len({e.session for e in events}) == 1
        if len(events) < PUSH_FROM or not one_shard:
            written = 0
            for start in range(0, len(events), _ROWS_PER_INSERT):
                chunk = events[start : start + _ROWS_PER_INSERT]
                status = await self.conn.execute(_insert_events(len(chunk)), *_row_args(chunk, rows))
                written += postgres._rowcount(status)
            return written
        xid, positions = await self.conn.fetchrow(_POSITIONS, len(events))
        columns = self._event_columns(events, rows)
        return postgres._rowcount(await self.conn.execute(_PUSHED, *columns, positions, xid, sorted(set(columns[0]))))

    async def insert(self, events: Sequence[Event], rows: Mapping[str, SessionInfo]) -> None:
        """INSERT, never COPY: Citus commits every COPY by two-phase commit, even on one shard. A stored
        id makes it raise, as on PostgreSQL (and a unique violation Citus relays as an internal error
        is read as the duplicate it is)."""
        with _relayed_duplicates():
            written = await self.insert_new(events, rows)
        if written != len(events):
            raise postgres._StoredDuplicate

    async def update_sessions(self, rows: Sequence[SessionInfo]) -> None:
        """The summaries, shard by shard; then the wake-up, on the coordinator."""
        for part in _by_shard(rows, lambda r: r.session):
            await self.conn.execute(_UPDATE_SESSIONS, *([getattr(r, c.name) for r in part] for c in SESSION_COLUMNS))
        await self._wake(rows)

    async def _wake(self, rows: Iterable[SessionInfo]) -> None:
        """The wake-up of the sessions' subscribers, on the coordinator, delivered at commit; none for
        the tenants the transaction's opening woke already (:meth:`CitusEventStore.appending`)."""
        rest = {r.tenant for r in rows} - self.woken
        if rest:
            await self.conn.execute(wake_statement(rest))

    async def insert_and_update(self, events: Sequence[Event], rows: Mapping[str, SessionInfo]) -> None:
        """The optimistic append under the locks: per shard, its events and its summaries in one statement
        (:func:`_locked_write`), or from :data:`PUSH_FROM` events on, its events as arrays and then its
        summaries; then the wake-up. A stored id raises, as :meth:`insert` does."""
        by_session = _by_session(events)
        ordered = sorted(rows.values(), key=lambda r: r.session)
        for part in _by_shard(ordered, lambda r: r.session):
            inserts = [e for r in part for e in by_session.get(r.session, ())]
            summaries = [[getattr(r, c.name) for r in part] for c in SESSION_COLUMNS]
            if len(inserts) >= PUSH_FROM:
                await self.insert(inserts, rows)
                await self.conn.execute(_UPDATE_SESSIONS, *summaries)
                continue
            sql = _locked_write(len(inserts)) if inserts else _UPDATE_SESSIONS
            with _relayed_duplicates():
                await self.conn.execute(sql, *summaries, *_row_args(inserts, rows))
        await self._wake(ordered)

    async def append_known(self, plan: AppendPlan, known: Mapping[str, SessionInfo]) -> None:
        """Writes a plan made against ``known`` session rows without locking them first, one statement
        per shard (:func:`_known_write`): its summaries only where each row is still what ``known`` says
        (its ``last_seq``), then its events; then the wake-up, all in the store's transaction
        (:meth:`CitusEventStore.appending`). A row that moved raises ``_RowsMoved`` and a stored id
        ``_StoredDuplicate`` (or the unique violation): the transaction rolls back and the store decides
        the append again under the locks. The summary must come first: it takes the row's lock before
        any event exists, as an append under the locks does (events first, a writer under the locks that
        planned the same ``seq`` would wait for these events while this one waited for its lock: a
        deadlock). (The single-node statement does it all at once for every session, but Citus commits a
        statement that writes several shards by two-phase commit.)"""
        rows = sorted(plan.rows.values(), key=lambda r: r.session)  # in the order lock_sessions takes them
        by_session = _by_session(plan.inserts)
        for part in _by_shard(rows, lambda r: r.session):
            if len(part) == 1:
                summary: list[Any] = [getattr(part[0], c.name) for c in SESSION_COLUMNS]
                summary.append(known[part[0].session].last_seq)
            else:
                summary = [[getattr(r, c.name) for r in part] for c in SESSION_COLUMNS]
                summary.append([known[r.session].last_seq for r in part])
            inserts = [e for r in part for e in by_session.get(r.session, ())]
            if not inserts or len(inserts) >= PUSH_FROM:  # (the summaries, then the events as arrays)
                guarded = _KNOWN_SUMMARY if len(part) == 1 else _KNOWN_SUMMARIES
                if postgres._rowcount(await self.conn.execute(guarded, *summary)) != len(part):
                    raise postgres._RowsMoved
                if inserts:
                    await self.insert(inserts, plan.rows)
                continue
            with _relayed_duplicates():
                written = await self.conn.fetchval(
                    _known_write(len(part) == 1, len(inserts)), *summary, *_row_args(inserts, plan.rows)
                )
            if written != len(part):
                raise postgres._RowsMoved
        await self._wake(rows)


# -- the feed's horizon -----------------------------------------------------------------------

# The single-node feed with its horizon as a parameter, read on the coordinator beforehand.
_FEED = postgres._FEED.replace("pg_snapshot_xmin(pg_current_snapshot())", "$6::text::xid8")
assert _FEED != postgres._FEED

# A page in two steps: Citus runs ``ORDER BY … LIMIT n`` over every shard by asking each for n rows, so a
# page of 1,000 moved 32,000 whole events to the coordinator. First the page's last position, from each
# shard's first n positions alone (an index-only read); then the events up to it, which are the page.
_PAGE_END = _FEED.replace(_FEED[: _FEED.index("FROM ct_events")], "SELECT txid::text, pos ").replace(
    "ORDER BY txid, pos LIMIT $3", "ORDER BY txid, pos LIMIT 1 OFFSET $3 - 1"
)
_FEED_TO = _FEED.replace("ORDER BY txid", "AND (txid, pos) <= ($7::text::xid8, $8) ORDER BY txid")
assert _PAGE_END.count("OFFSET") == 1 and _FEED_TO.count("<= ($7") == 1

# A two-phase commit (an import over several shards, or any other statement that writes several) ends
# its coordinator transaction before its workers' rows become visible. Citus sends COMMIT PREPARED from
# its XACT_EVENT_COMMIT callback (src/backend/distributed/transaction/transaction_management.c,
# CoordinatedTransactionCallback -> CoordinatedRemoteTransactionsCommit in remote_transaction.c, which
# sends to every worker and waits for every reply), and PostgreSQL runs that callback after
# ProcArrayEndTransaction: from then on the coordinator's snapshots no longer hold its xid back, while
# the workers may still show its rows as in progress. A reader in that window would pass the xid for ever.
# (When a COMMIT PREPARED fails, Citus only warns, and its 2PC recovery commits the rows later.)
#
# What closes the window: before it prepares, the coordinator transaction writes one pg_dist_transaction
# record per worker (remote_transaction.c, CoordinatedRemoteTransactionsPrepare -> LogTransactionRecord
# in transaction_recovery.c), so the record's xmin is the coordinator's xid and it becomes visible exactly
# when that xid leaves the snapshot. Only 2PC recovery (recover_prepared_transactions, run by the
# maintenance daemon every citus.recover_2pc_interval, and by an import as it ends) deletes it, and only
# once the worker no longer holds the prepared transaction, i.e. once its rows are committed. The horizon
# is therefore the snapshot's xmin, lowered to the oldest xid that still has such a record: in one
# statement, one snapshot. A record's xmin is a 32-bit xid; it is widened against the snapshot's xmin
# (a live record's xid is within 2**31 of it), and a frozen one (xmin 2) only lowers the horizon further.
_HORIZON = """
WITH s AS (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS h)
SELECT least(h, (
    SELECT min(h + (t.xmin::text::bigint - h % 4294967296 + 6442450944) % 4294967296 - 2147483648)
    FROM pg_dist_transaction t
))::text FROM s
"""

_RECOVER = "SELECT recover_prepared_transactions()"


async def settle_two_phase(conn: asyncpg.Connection) -> bool:
    """After a transaction that may have committed by two-phase commit (an import): asks Citus to confirm
    its workers' commits now, so the feed, which waits for that confirmation (see ``_HORIZON``), moves on
    at once instead of at Citus's next recovery round. Returns whether it could: Citus lets only a
    superuser (or the extension's owner) run its recovery, and otherwise the round comes within
    ``citus.recover_2pc_interval`` (a minute by default). Never raises: the import has committed, and
    whatever stops the confirmation here (no right to it, a lost connection) only delays the feed."""
    try:
        await conn.fetchval(_RECOVER)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        return False
    return True


class CitusEventStore(PostgresEventStore):
    """The PostgreSQL store on a Citus cluster (connect to the coordinator): appends split by shard,
    each committed in one phase; the feed's horizon read on the coordinator."""

    writer_class = CitusWriter
    inline_owner = False
    durable_lanes = 1
    """One session's durable append beside the batch (whose worker transactions take up to 8 of the
    pool's 10 connections)."""
    pipelines = False
    """A batch asks for its sessions' placements before it plans: nothing to plan ahead against."""
    parallel_shards = 8
    """Worker transactions of one append run side by side, at most this many (the pool keeps 10
    connections; more would open and close connections, each of which Citus connects to its workers)."""

    def tenant_scope(self) -> str | None:
        """``SET LOCAL`` of the tenant, propagated to the workers: the policies run on the shards, where
        the coordinator's connection-start setting never arrives (a worker would read no tenant)."""
        if self.tenant is None or not self.held_by_rls:
            return None  # no tenant is what a worker reads anyway; a bypassing role is not held
        return tenant_scope(self.tenant)

    @contextlib.asynccontextmanager
    async def transaction(self, conn: asyncpg.Connection) -> AsyncIterator[None]:
        """A transaction whose BEGIN carries the tenant's ``SET LOCAL`` in the same message (one round
        trip where they were two: a tenant's read is two more than a bare statement, not three)."""
        async with _begun(conn, self.tenant_scope() or ""):
            yield

    def appending(
        self, conn: asyncpg.Connection, writer: PgWriter, tenants: Iterable[str | None], *, known: bool
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Every append is several statements here: one transaction, begun by one message that also
        hands the tenant on and wakes the followers of ``tenants``' rows (delivered at the commit, as
        ever), where BEGIN, the ``SET LOCAL`` and the wake-up were a round trip each. The writer wakes
        only the tenants left over (an operator's store may write any tenant's sessions)."""
        assert isinstance(writer, CitusWriter)
        writer.woken = frozenset(tenants)
        return _begun(conn, "; ".join(s for s in (self.tenant_scope(), wake_statement(writer.woken)) if s))

    async def placements(self, sessions: Sequence[str]) -> dict[str, tuple[int, int]]:
        """Each session's shard and worker group (asked of the coordinator's metadata, never cached, so a
        rebalance cannot leave a stale answer behind)."""
        async with self._connection() as conn:
            return {r[0]: (r[1], r[2]) for r in await conn.fetch(_PLACEMENTS, list(sessions))}

    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        """Appends ``events`` in one transaction per worker, one statement per shard (see the module);
        returns the stored events."""
        events = checked_batch(events)
        sessions = {e.session for e in events}
        if len(sessions) < 2 or expected_seq is not None:  # (expected_seq refuses several sessions)
            return await super().append(events, expected_seq=expected_seq)
        placed = await self.placements(sorted(sessions))
        shard_of = {s: shard for s, (shard, _) in placed.items()}
        groups: dict[int, list[int]] = {}
        for i, event in enumerate(events):
            groups.setdefault(placed[event.session][1], []).append(i)
        parts = [[events[i] for i in idx] for idx in groups.values()]
        room = asyncio.Semaphore(self.parallel_shards)

        async def one(part: list[Event]) -> list[Event]:
            async with room:
                _SHARD_OF.set(shard_of)  # (this task's own context: the caller's is untouched)
                return await super(CitusEventStore, self).append(part)

        if len(parts) == 1:
            return await asyncio.create_task(one(parts[0]))
        # One transaction per worker, side by side; every group runs to its end, then the first error
        # (in the batch's order) is raised. Groups that committed stay committed: re-appending the
        # batch is harmless (ids make it idempotent), which is what the recorder does.
        outcomes = await asyncio.gather(*(one(p) for p in parts), return_exceptions=True)
        results: list[Event | None] = [None] * len(events)
        for idx, outcome in zip(groups.values(), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                raise outcome
            for i, stored in zip(idx, outcome, strict=True):
                results[i] = stored
        return [e for e in results if e is not None]

    async def _feed_rows(self, conn: Any, args: tuple[Any, ...]) -> list[Any]:
        """The feed up to the coordinator's horizon, read before the shards are (see the module); a full
        page of every session in two steps (``_PAGE_END``). Both read below one horizon, so they see the
        same rows, but for an erasure in between: a page it emptied is read again in one step."""
        horizon = await conn.fetchval(_HORIZON)
        session = args[3]
        end = None if session is not None else await conn.fetchrow(_PAGE_END, *args, horizon)  # (one shard)
        if end is not None:
            rows = list(await conn.fetch(_FEED_TO, *args, horizon, end[0], end[1]))
            if rows:
                return rows
        return list(await conn.fetch(_FEED, *args, horizon))

    async def head(self) -> FeedPosition:
        """The feed's own horizon (a two-phase commit not yet confirmed holds it back, as it holds the feed):
        following from the snapshot's xmin alone would start past such a commit's events."""
        async with self._connection() as conn:
            return FeedPosition(int(await conn.fetchval(_HORIZON)), 0)
