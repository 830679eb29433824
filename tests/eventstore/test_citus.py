"""calltape on Citus (calltape/eventstore/citus.py).

The schema and the error mapping are checked on every run; the tests marked ``citus`` need a cluster
(``$CALLTAPE_TEST_CITUS_URL``, see tests/conftest.py) and are skipped without one. The rest of the store
suite runs on the cluster too when that variable is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import asyncpg
import pytest
from eventstore_support import asyncpg_dsn, follow_feed, settle, started, text
from sqlalchemy import text as sql_text

from calltape.errors import CalltapeError, SessionErased, TenantRefused
from calltape.eventstore import citus, open_store, upgrade
from calltape.eventstore.bulk import bulk_import
from calltape.eventstore.citus import DISTRIBUTED, CitusEventStore, is_duplicate, settle_two_phase, tenant_scope
from calltape.eventstore.connect import create_engine, resolve_url
from calltape.eventstore.postgres import PostgresEventStore
from calltape.eventstore.tenancy import ALL_TENANTS, CHANNEL, NOTIFY_TENANTS, channel

pytestmark = pytest.mark.postgres


def test_a_unique_violation_relayed_by_citus_is_a_duplicate() -> None:
    relayed = asyncpg.InternalServerError(
        'duplicate key value violates unique constraint "ct_events_session_id_102009"'
    )
    assert is_duplicate(relayed)
    assert is_duplicate(asyncpg.UniqueViolationError("duplicate key value violates unique constraint"))
    assert not is_duplicate(asyncpg.InternalServerError("could not connect to worker"))


async def test_an_import_that_may_not_confirm_its_two_phase_commit_still_succeeds() -> None:
    # Citus lets only a superuser run its 2PC recovery: for any other role the import has committed all
    # the same, and the feed waits for Citus's own recovery round instead.
    class Refusing:
        async def fetchval(self, query: str) -> None:
            raise asyncpg.InsufficientPrivilegeError("permission denied for function recover_prepared_transactions")

    class Lost:
        async def fetchval(self, query: str) -> None:
            raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")

    assert await settle_two_phase(Refusing()) is False  # type: ignore[arg-type]
    assert await settle_two_phase(Lost()) is False  # type: ignore[arg-type]


async def test_events_are_keyed_by_session_and_pos(pg_url: str) -> None:
    # Citus accepts only unique keys that include the distribution column (migration 0004).
    conn = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        key = await conn.fetchval(
            "SELECT array_agg(a.attname ORDER BY k.n) FROM pg_index i "
            "CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = 'ct_events'::regclass AND i.indisprimary"
        )
    finally:
        await conn.close()
    assert key == ["session", "pos"]


async def test_citus_is_required_only_when_asked(pg_url: str, tmp_path) -> None:
    if os.environ.get("CALLTAPE_TEST_CITUS_URL"):
        pytest.skip("the cluster has the extension")
    assert await upgrade(pg_url) == await upgrade(pg_url, citus=False)  # no extension: nothing to distribute
    with pytest.raises(CalltapeError, match="no citus extension: run CREATE EXTENSION citus"):
        await upgrade(pg_url, citus=True)
    with pytest.raises(CalltapeError, match="an SQLite file is not one"):
        await upgrade(f"sqlite:///{tmp_path}/x.db", citus=True)
    # A shard count is a Citus setting: refused, in one sentence, where there is nothing to distribute.
    with pytest.raises(CalltapeError, match="no citus extension: run CREATE EXTENSION citus"):
        await upgrade(pg_url, shards=4)
    with pytest.raises(CalltapeError, match="--no-citus leaves them local"):
        await upgrade(pg_url, citus=False, shards=4)
    with pytest.raises(CalltapeError, match="a count of 1 or more, not 0"):
        await upgrade(pg_url, shards=0)
    with pytest.raises(CalltapeError, match="an SQLite file is not one"):
        await upgrade(f"sqlite:///{tmp_path}/y.db", shards=4)
    assert not (tmp_path / "y.db").exists()
    async with await open_store(pg_url) as store:
        assert not isinstance(store, CitusEventStore)


# -- on the cluster ----------------------------------------------------------------------------


@pytest.mark.citus
async def test_the_tables_get_two_shards_a_worker_unless_told(pg_url: str) -> None:
    # The suite's database is distributed by db upgrade without --shards: two shards a worker node (where
    # the operator set no citus.shard_count), every table the same; asking for another count is refused
    # (Citus redistributes no table with an identity column), and for the count they have changes nothing.
    conn = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        workers = await conn.fetchval(
            "SELECT count(*) FROM pg_dist_node WHERE isactive AND noderole = 'primary' AND shouldhaveshards"
        )
        operator_set = await conn.fetchval(
            "SELECT source <> 'default' FROM pg_settings WHERE name = 'citus.shard_count'"
        )
        counts = await conn.fetch(
            "SELECT logicalrelid::text, count(*) FROM pg_dist_shard WHERE logicalrelid::text = ANY($1::text[]) "
            "GROUP BY 1",
            list(DISTRIBUTED),
        )
    finally:
        await conn.close()
    assert len(counts) == len(DISTRIBUTED) and len({n for _, n in counts}) == 1
    have = counts[0][1]
    if not operator_set:
        assert have == citus.SHARDS_PER_WORKER * workers
    # A shard count the operator set (here the session's) is the one a distribution would take.
    engine = create_engine(resolve_url(pg_url))
    try:
        async with engine.connect() as conn:
            if not operator_set:
                assert await conn.run_sync(citus.shard_count) == citus.SHARDS_PER_WORKER * workers
            await conn.execute(sql_text("SET citus.shard_count = 7"))
            assert await conn.run_sync(citus.shard_count) == 7
    finally:
        await engine.dispose()
    with pytest.raises(CalltapeError, match=rf"distributed in {have} shards already.*--shards {have + 1} and move"):
        await upgrade(pg_url, shards=have + 1)
    assert await upgrade(pg_url, shards=have) == await upgrade(pg_url)


@pytest.mark.citus
async def test_upgrade_confirms_the_two_phase_commits_the_feed_waits_for(pg_url: str) -> None:
    # A statement over every shard commits by two-phase commit; its records hold the feed's horizon
    # until Citus confirms them (within a minute on its own): db upgrade confirms them at once (it
    # distributes the tables by such commits, and the feed stood still for a minute after it)
    conn = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        await conn.execute("DELETE FROM ct_tombstones WHERE session = ANY($1::text[])", ["none-1", "none-2"])
        await conn.execute("UPDATE ct_tombstones SET events = events WHERE events < 0")
        assert await _two_phase_commits(pg_url) > 0
        await upgrade(pg_url)
        assert await _two_phase_commits(pg_url) == 0
    finally:
        await conn.close()


@pytest.mark.citus
async def test_the_tables_are_distributed_by_session_and_colocated(pg_url: str) -> None:
    assert await upgrade(pg_url, citus=True) == await upgrade(pg_url)  # idempotent
    conn = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        rows = await conn.fetch(
            "SELECT logicalrelid::text, column_to_column_name(logicalrelid, partkey), colocationid "
            "FROM pg_dist_partition WHERE logicalrelid::text = ANY($1::text[])",
            list(DISTRIBUTED),
        )
    finally:
        await conn.close()
    assert sorted(r[0] for r in rows) == sorted(DISTRIBUTED)
    assert {r[1] for r in rows} == {"session"}
    assert len({r[2] for r in rows}) == 1
    async with await open_store(pg_url) as store:
        assert isinstance(store, CitusEventStore)


async def _two_phase_commits(url: str) -> int:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return int(await conn.fetchval("SELECT count(*) FROM pg_dist_transaction"))
    finally:
        await conn.close()


@pytest.mark.citus
async def test_an_append_over_many_shards_commits_one_transaction_per_worker_in_one_phase(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = [f"citus-{uuid.uuid4().hex[:12]}" for _ in range(40)]
    transactions: list[int] = []
    single_node_append = PostgresEventStore.append

    async def counted(self: PostgresEventStore, events: Any, **kw: Any) -> Any:
        transactions.append(len(events))
        return await single_node_append(self, events, **kw)

    monkeypatch.setattr(PostgresEventStore, "append", counted)
    async with await open_store(pg_url) as store:
        assert isinstance(store, CitusEventStore)
        placed = await store.placements(sessions)
        assert len({shard for shard, _ in placed.values()}) > 2
        workers = {group for _, group in placed.values()}
        before = await _two_phase_commits(pg_url)
        batch = [started(s) for s in sessions] + [text(s, "hello") for s in reversed(sessions)]
        stored = await store.append(batch)
        assert len(transactions) == len(workers) and sum(transactions) == len(batch)
        assert [(e.session, e.type) for e in stored] == [(e.session, e.type) for e in batch]
        assert [e.seq for e in stored] == [1] * 40 + [2] * 40
        assert await _two_phase_commits(pg_url) == before  # no transaction prepared on two shards
        # Re-appending is idempotent: Citus relays the workers' unique violations from COPY.
        again = await store.append(batch)
        assert [(e.session, e.seq, e.id) for e in again] == [(e.session, e.seq, e.id) for e in stored]


@pytest.mark.citus
async def test_the_feed_reads_below_the_coordinators_horizon(pg_url: str) -> None:
    # A transaction open on the coordinator holds the horizon: rows appended after it are not handed out
    # until it ends, even though their shards committed them.
    session = f"citus-{uuid.uuid4().hex[:12]}"
    async with await open_store(pg_url) as store:
        head = await store.head()
        holder = await asyncpg.connect(asyncpg_dsn(pg_url))
        try:
            tx = holder.transaction()
            await tx.start()
            await holder.fetchval("SELECT pg_current_xact_id()")
            await store.append([started(session)])
            assert [e.session for _, e in await store.feed(head) if e.session == session] == []
            await tx.rollback()
        finally:
            await holder.close()
        # Released: handed out as soon as no older transaction is open on the coordinator (other
        # databases' included: the horizon is the server's), so allow a busy cluster a few seconds.
        for _ in range(100):
            if [e.session for _, e in await store.feed(head) if e.session == session] == [session]:
                break
            await asyncio.sleep(0.1)
        assert [e.session for _, e in await store.feed(head) if e.session == session] == [session]


# -- tenants on the cluster (the tenant suite, tests/eventstore/test_tenants.py, runs here too) ----------


@contextlib.asynccontextmanager
async def app_role(url: str) -> AsyncIterator[str]:
    """A login role prepared by ``db upgrade --grant`` on the cluster; yields its URL, dropped afterwards."""
    role = f"calltape_citus_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')  # Citus creates it on the workers too
        try:
            await upgrade(url, grant=role)
            yield url.replace("postgres@", f"{role}@", 1)
        finally:
            await admin.execute(f'DROP OWNED BY "{role}"')
            await admin.execute(f'DROP ROLE "{role}"')
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def held(url: str, tenant: str) -> AsyncIterator[asyncpg.Connection]:
    """Raw SQL in one transaction, held to ``tenant`` the way calltape holds its own on Citus."""
    conn = await asyncpg.connect(asyncpg_dsn(url), server_settings={"calltape.tenant": tenant})
    try:
        async with conn.transaction():
            await conn.execute(tenant_scope(tenant))
            yield conn
    finally:
        await conn.close()


@pytest.mark.citus
async def test_tenants_are_kept_apart_by_the_cluster(pg_url: str) -> None:
    assert pg_url.startswith("postgresql://postgres@")
    tag = uuid.uuid4().hex[:8]
    a, b, acme, globex = f"a-{tag}", f"b-{tag}", f"acme-{tag}", f"globex-{tag}"
    async with await open_store(pg_url, tenant=ALL_TENANTS) as operator:
        await operator.append([started(a, tenant=acme), text(a, "for acme")])
        await operator.append([started(b, tenant=globex), text(b, "for globex")])
        await operator.save_snapshot(b, 2, 1, b"state")
    async with app_role(pg_url) as url:
        async with await open_store(url, tenant=acme) as store:
            assert isinstance(store, CitusEventStore)
            assert [i.session for i in await store.sessions()] == [a]
            assert await store.read(b) == [] and await store.load_snapshot(b, 1) is None
            with pytest.raises(TenantRefused):
                await store.append([text(b, "intruder")])
            assert [e.seq for e in await store.append([text(a, "again")])] == [3]
        # Raw SQL held to acme: other tenants' rows are invisible on the workers.
        async with held(url, acme) as conn:
            for table in ("ct_sessions", "ct_events", "ct_snapshots"):
                assert {r[0] for r in await conn.fetch(f"SELECT DISTINCT session FROM {table}")} <= {a}, table
            assert await conn.fetchval("SELECT count(*) FROM ct_events WHERE tenant IS DISTINCT FROM $1", acme) == 0
        # ... and it cannot add rows under globex's session id: not with globex's tenant (the policy) ...
        for sql in (
            "INSERT INTO ct_events (session, seq, id, type, at_ms, data, tenant) "
            "VALUES ($1, 99, 'x', 'user.text', 0, '{}', $2)",
            "INSERT INTO ct_snapshots (session, version, seq, state, created_at_ms, tenant) "
            "VALUES ($1, 9, 9, 'x', 0, $2)",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
                async with held(url, acme) as conn:
                    await conn.execute(sql, b, globex)
            # ... nor with its own: there is no session row (b, acme), so the foreign key refuses it at the
            # commit (where Citus reports the worker's refusal as a failed commit of that shard).
            with pytest.raises(asyncpg.PostgresError, match="could not commit transaction for shard"):
                async with held(url, acme) as conn:
                    await conn.execute(sql, b, acme)
    async with await open_store(pg_url, tenant=ALL_TENANTS) as operator:
        assert [e.data.get("text") for e in await operator.read(b)] == [None, "for globex"]
        assert await operator.load_snapshot(b, 1) == (2, b"state")


# -- two-phase commits and the feed ------------------------------------------------------------


async def _feed_of(store: CitusEventStore, after, sessions: set[str]) -> list:
    rows, position = [], after
    while page := await store.feed(position, limit=200):
        rows += [(p, e) for p, e in page if e.session in sessions]
        position = page[-1][0]
    return rows


@pytest.mark.citus
async def test_the_feed_waits_for_a_two_phase_commit_its_workers_have_not_committed(pg_url: str) -> None:
    # The window, held open: the coordinator's transaction has committed (with its pg_dist_transaction
    # record, as Citus writes it before PREPARE), while the worker still holds the prepared transaction
    # with the event, as between Citus's COMMIT and its COMMIT PREPARED. A later append commits in one
    # phase above it. The feed must hand out neither until the worker commits: handing out the later one
    # would move the reader past the prepared event for ever.
    late, after = f"citus-{uuid.uuid4().hex[:12]}", f"citus-{uuid.uuid4().hex[:12]}"
    gid = f"citus_0_999999_{uuid.uuid4().int % 10**12}_0"  # Citus's own format: its recovery may commit it too
    coordinator = await asyncpg.connect(asyncpg_dsn(pg_url))
    worker: asyncpg.Connection | None = None
    try:
        group, host, port, events_shard, sessions_shard, pos = await coordinator.fetchrow(
            "SELECT n.groupid, n.nodename, n.nodeport, get_shard_id_for_distribution_column('ct_events', $1::text),"
            " get_shard_id_for_distribution_column('ct_sessions', $1::text), nextval('ct_events_pos_seq')"
            " FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)"
            " WHERE p.shardid = get_shard_id_for_distribution_column('ct_events', $1::text)",
            late,
        )
        async with await open_store(pg_url) as store:
            assert isinstance(store, CitusEventStore)
            head = await store.head()
            tx = coordinator.transaction()
            await tx.start()
            xid = int(await coordinator.fetchval("SELECT pg_current_xact_id()::text"))
            worker = await asyncpg.connect(asyncpg_dsn(pg_url), host=host, port=port)
            await worker.execute("BEGIN")
            await worker.execute(
                f"INSERT INTO ct_sessions_{sessions_shard} (session, status, last_seq, epoch) "
                "VALUES ($1, 'active', 1, 1)",
                late,
            )
            await worker.execute(
                f"INSERT INTO ct_events_{events_shard} (session, seq, id, type, at_ms, epoch, data, txid, pos) "
                "OVERRIDING SYSTEM VALUE VALUES ($1, 1, 'e1', 'session.started', 0, 1, '{}', $2::text::xid8, $3)",
                late,
                str(xid),
                pos,
            )
            await worker.execute(f"PREPARE TRANSACTION '{gid}'")
            await coordinator.execute("INSERT INTO pg_dist_transaction (groupid, gid) VALUES ($1, $2)", group, gid)
            await tx.commit()  # the coordinator's xid has ended; the worker's rows are not yet visible

            await store.append([started(after)])
            assert (await store.head()).txid <= xid
            pending = "SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1"
            seen = await _feed_of(store, head, {late, after})
            if await worker.fetchval(pending, gid):  # still prepared after the read (Citus's recovery may commit it)
                assert seen == []

            await worker.execute(f"COMMIT PREPARED '{gid}'")
            await settle(store)  # Citus's recovery confirms it (the record goes); other backends' transactions end
            seen = await _feed_of(store, head, {late, after})
            assert [e.session for _, e in seen] == [late, after]
            assert seen[0][0].txid == xid
    finally:
        if worker is not None:
            with contextlib.suppress(asyncpg.PostgresError):
                await worker.execute(f"ROLLBACK PREPARED '{gid}'")
            await worker.close()
        await coordinator.execute("DELETE FROM pg_dist_transaction WHERE gid = $1", gid)
        await coordinator.close()


@pytest.mark.citus
async def test_a_follower_sees_every_event_of_a_multi_shard_import_exactly_once(pg_url: str) -> None:
    # An import is one transaction over every shard it touches, committed by two-phase commit, while
    # other sessions append around it and a follower reads the feed all along.
    imported = [f"citus-imp-{uuid.uuid4().hex[:10]}" for _ in range(30)]
    live = [f"citus-live-{uuid.uuid4().hex[:10]}" for _ in range(4)]
    async with await open_store(pg_url) as store:
        assert isinstance(store, CitusEventStore)
        assert len({shard for shard, _ in (await store.placements(imported)).values()}) > 1
        head = await store.head()
        expected = len(imported) * 3 + len(live) * 10
        seen: list = []
        done = asyncio.Event()

        async def follow() -> None:
            position = head
            while len(seen) < expected:
                page = await store.feed(position, limit=100)
                seen.extend((p, e) for p, e in page if e.session in set(imported) | set(live))
                position = page[-1][0] if page else position
                if not page:
                    await asyncio.sleep(0.005)
            done.set()

        async def write_live() -> None:
            for i in range(10):
                await store.append([started(s) if i == 0 else text(s, f"l{i}") for s in live])
                await asyncio.sleep(0.01)

        follower = asyncio.create_task(follow())
        writer = asyncio.create_task(write_live())
        try:
            async with bulk_import(store) as imp:
                await imp.add([started(s) for s in imported])
                await asyncio.sleep(0.05)
                await imp.add([text(s, "one") for s in imported] + [text(s, "two") for s in imported])
            await writer
            await asyncio.wait_for(done.wait(), 30)
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        keys = [(e.session, e.seq) for _, e in seen]
        assert len(keys) == len(set(keys)) == expected
        positions = [p for p, _ in seen]
        assert positions == sorted(positions)
        # The import asked Citus to confirm its commits as it ended: its 2PC records are gone already.
        (xid,) = {p.txid for p, e in seen if e.session in set(imported)}
        conn = await asyncpg.connect(asyncpg_dsn(pg_url))
        try:
            left = await conn.fetchval(
                "SELECT count(*) FROM pg_dist_transaction WHERE xmin::text::bigint = $1", xid % 2**32
            )
        finally:
            await conn.close()
        assert left == 0


# -- every per-session path on one shard -------------------------------------------------------

_DISTRIBUTED_SQL = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH")


@contextlib.contextmanager
def _statements() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """Every statement the store sends through asyncpg meanwhile, with its arguments."""
    seen: list[tuple[str, tuple[Any, ...]]] = []
    cls = asyncpg.connection.Connection
    originals = {name: getattr(cls, name) for name in ("fetch", "fetchrow", "fetchval", "execute", "executemany")}

    def recording(name: str) -> Any:
        original = originals[name]

        async def call(self: Any, query: str, *args: Any, **kw: Any) -> Any:
            if name == "executemany":
                seen.extend((query, tuple(a)) for a in args[0])
            else:
                seen.append((query, args))
            return await original(self, query, *args, **kw)

        return call

    for name in originals:
        setattr(cls, name, recording(name))
    try:
        yield seen
    finally:
        for name, original in originals.items():
            setattr(cls, name, original)


async def _task_counts(url: str, statements: list[tuple[str, tuple[Any, ...]]]) -> list[tuple[int, str]]:
    """Citus's task count for each statement that reads or writes a distributed table (EXPLAIN, which
    plans DML without running it); statements of the coordinator alone (NOTIFY, the horizon) have none."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    counts = []
    try:
        for sql, args in statements:
            if not sql.lstrip().upper().startswith(_DISTRIBUTED_SQL):
                continue
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN (COSTS OFF) " + sql, *args))
            found = re.findall(r"Task Count: (\d+)", plan)
            if found:
                counts.append((max(int(n) for n in found), " ".join(sql.split())[:80]))
    finally:
        await conn.close()
    return counts


@pytest.mark.citus
async def test_every_per_session_path_is_routed_to_one_shard(pg_url: str) -> None:
    session = f"citus-{uuid.uuid4().hex[:12]}"
    async with await open_store(pg_url) as store:
        assert isinstance(store, CitusEventStore)
        first = [started(session), text(session, "one")]
        paths: dict[str, Callable[[], Awaitable[Any]]] = {
            "append": lambda: store.append(first),
            "append again (stored ids looked up)": lambda: store.append(first),
            "append expected_seq (resume)": lambda: store.append([text(session, "two")], expected_seq=2),
            "read": lambda: store.read(session),
            "read range": lambda: store.read(session, after_seq=1, to_seq=3, limit=2),
            "seq_at_time": lambda: store.seq_at_time(session, first[1].at_ms),
            "session summary": lambda: store.session_info(session),
            "snapshot save": lambda: store.save_snapshot(session, 2, 1, b"state"),
            "snapshot load": lambda: store.load_snapshot(session, 1, max_seq=3),
            "rewrite data": lambda: store.rewrite_data(session, [(2, {"text": "x"})]),
            "erase": lambda: store.erase(session),
            "tombstone": lambda: store.tombstone(session),
        }
        fanned: dict[str, list[tuple[int, str]]] = {}
        for name, path in paths.items():
            with _statements() as seen:
                await path()
            counts = await _task_counts(pg_url, seen)
            assert counts, f"{name}: no distributed statement seen"
            if any(n != 1 for n, _ in counts):
                fanned[name] = [c for c in counts if c[0] != 1]
        assert fanned == {}


@pytest.mark.citus
async def test_a_statement_outside_a_held_transaction_reaches_the_workers_without_a_tenant(pg_url: str) -> None:
    # The residual the README states: the workers read the tenant from the transaction's SET LOCAL (what
    # calltape runs first in each of its transactions), never from the coordinator's connection setting.
    # A bare statement on a tenant's connection sees the sessions without a tenant there, no other tenant's.
    tag = uuid.uuid4().hex[:8]
    mine, nobody = f"a-{tag}", f"n-{tag}"
    async with await open_store(pg_url, tenant=ALL_TENANTS) as operator:
        await operator.append([started(mine, tenant=f"acme-{tag}")])
        await operator.append([started(nobody)])
    async with app_role(pg_url) as url:
        conn = await asyncpg.connect(asyncpg_dsn(url), server_settings={"calltape.tenant": f"acme-{tag}"})
        try:
            seen = {
                r[0]
                for r in await conn.fetch("SELECT session FROM ct_sessions WHERE session = ANY($1)", [mine, nobody])
            }
        finally:
            await conn.close()
    assert seen == {nobody}


@pytest.mark.citus
async def test_store_connections_skip_citus_shard_hiding(pg_url: str) -> None:
    # Citus hides shards from pg_class by checking each catalog row a query reads, and asyncpg's type
    # look-up on every new pool connection took 350 ms so (20 writers on fresh connections appended 70
    # times a second). On the store's connections a catalog query carries no such check.
    plan = "EXPLAIN (VERBOSE, COSTS OFF) SELECT oid FROM pg_class"
    plain = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        assert "relation_is_a_known_shard" in "\n".join(r[0] for r in await plain.fetch(plan))  # Citus's default
    finally:
        await plain.close()
    async with await open_store(pg_url) as store:
        assert isinstance(store, CitusEventStore)
        async with store.engine.connect() as sa_conn:
            raw = await sa_conn.get_raw_connection()
            conn = raw.driver_connection
            assert conn is not None
            assert "relation_is_a_known_shard" not in "\n".join(r[0] for r in await conn.fetch(plan))


class _Watched:
    """A connection whose queries the test sees first: ``seen`` gets each one, and what ``answer`` gives
    (other than None) is returned instead of running it."""

    def __init__(self, conn: Any, seen: Callable[[str], None], answer: Callable[[str], Any] = lambda q: None) -> None:
        self.conn, self.seen, self.answer = conn, seen, answer

    async def _run(self, method: str, query: str, *args: Any) -> Any:
        self.seen(query)
        answer = self.answer(query)
        return answer if answer is not None else await getattr(self.conn, method)(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self._run("fetchval", query, *args)

    async def fetchrow(self, query: str, *args: Any) -> Any:
        return await self._run("fetchrow", query, *args)

    async def fetch(self, query: str, *args: Any) -> Any:
        return await self._run("fetch", query, *args)


@pytest.mark.citus
async def test_a_feed_page_over_every_shard_is_read_in_two_steps_in_log_order(pg_url: str) -> None:
    # Citus asks every shard for a whole page: the page's end is found from positions alone first,
    # then only the page's events are read. Pages of 7 over 40 sessions match the log's own order.
    sessions = [f"page-{uuid.uuid4().hex[:10]}" for _ in range(40)]
    async with await open_store(pg_url) as store:
        assert isinstance(store, CitusEventStore)
        start = await store.head()
        for round_ in range(3):
            await store.append([text(s, f"r{round_}") if round_ else started(s) for s in sessions])
        await settle(store)
        names = {citus._HORIZON: "horizon", citus._PAGE_END: "end", citus._FEED_TO: "to", citus._FEED: "one"}
        steps: list[str] = []
        real = store._feed_rows

        async def watched(conn: Any, args: tuple[Any, ...]) -> list[Any]:
            return await real(_Watched(conn, lambda q: steps.append(names.get(q, "?"))), args)

        store._feed_rows = watched  # type: ignore[method-assign]
        paged: list[tuple[str, int]] = []
        position = start
        while rows := await store.feed(position, limit=7):
            paged += [(e.session, e.seq) for _, e in rows if e.session in sessions]
            position = rows[-1][0]
        conn = await asyncpg.connect(asyncpg_dsn(pg_url))
        try:
            logged = await conn.fetch(
                "SELECT session, seq FROM ct_events WHERE session = ANY($1::text[]) ORDER BY txid, pos", sessions
            )
        finally:
            await conn.close()
        assert paged == [(r[0], r[1]) for r in logged] and len(paged) == 120
        assert steps.count("end") >= 120 // 7 and steps.count("to") >= 120 // 7 and "?" not in steps


@pytest.mark.citus
async def test_a_feed_page_emptied_between_its_two_steps_is_read_again_in_one(pg_url: str) -> None:
    # An erasure between the page's end and its events leaves nothing up to that end: the page is read
    # again in one step rather than returned empty (an empty page means "nothing more" to a follower).
    session = f"gone-{uuid.uuid4().hex[:10]}"
    async with await open_store(pg_url) as store:
        assert isinstance(store, CitusEventStore)
        start = await store.head()
        await store.append([started(session), text(session, "a"), text(session, "b")])
        await settle(store)
        real = store._feed_rows

        async def erased_between(conn: Any, args: tuple[Any, ...]) -> list[Any]:
            return await real(_Watched(conn, lambda q: None, lambda q: [] if q == citus._FEED_TO else None), args)

        store._feed_rows = erased_between  # type: ignore[method-assign]
        rows = await store.feed(start, limit=2)
        assert len(rows) == 2


@pytest.mark.citus
async def test_a_writers_one_event_append_is_three_statements_summary_first(pg_url: str) -> None:
    # A writer's own session (its row as the writer's last append left it): the transaction's opening
    # (BEGIN and the wake-up in one message), one statement for the shard, COMMIT; it was five (BEGIN, the
    # summary, the event, the wake-up, COMMIT), each a round trip through the coordinator. In the shard's
    # statement the summary comes before the event (CTEs, which Citus runs in order): it takes the row's
    # lock first, as an append under the locks does (see the deadlock test below). A new session's first
    # append: the opening, the lock of its row, the event and the summary in one statement, COMMIT (six
    # before).
    session = f"citus-{uuid.uuid4().hex[:12]}"
    async with await open_store(pg_url) as store:
        assert isinstance(store, CitusEventStore)
        with _statements() as seen:
            await store.append([started(session)])
        first = [" ".join(q.split()) for q, _ in seen]
        assert len(first) == 4, first
        assert first[0].startswith("BEGIN; SELECT pg_notify(") and first[1].startswith("INSERT INTO ct_sessions")
        assert first[2].startswith("WITH e AS (INSERT INTO ct_events") and "UPDATE ct_sessions s" in first[2]
        assert first[3] == "COMMIT"
        await store.append([text(session, "warm")])  # (the statements are prepared once)
        with _statements() as seen:
            stored = await store.append([text(session, "hello")])
        assert [e.seq for e in stored] == [3]
        assert [e.data.get("text") for e in await store.read(session)][1:] == ["warm", "hello"]
        queries = [" ".join(q.split()) for q, _ in seen]
        assert len(queries) == 3, queries
        assert queries[0].startswith("BEGIN; SELECT pg_notify(")
        assert (
            queries[1].startswith("WITH u AS ( UPDATE ct_sessions SET")
            and ", e AS (INSERT INTO ct_events" in queries[1]
        )
        assert queries[2] == "COMMIT"
        info = await store.session_info(session)
        assert info is not None and info.last_seq == 3


async def test_the_wake_statement_names_the_channels_the_single_node_statement_wakes(pg_url: str) -> None:
    # Citus wakes the followers in the transaction's opening message, with channels computed in Python; on
    # one node NOTIFY_TENANTS computes them in SQL, and a tenant's store LISTENs on channel(tenant).
    tenants = [None, "acme", "acme", "ünïcode"]
    named = re.findall(r"pg_notify\('([^']*)', ''\)", citus.wake_statement(tenants))
    assert len(named) == len(set(named)) == 4
    conn = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        woken = NOTIFY_TENANTS.replace("pg_notify(c, '')", "c")
        in_sql = await conn.fetch(f"WITH v AS (SELECT * FROM unnest($1::text[]) AS v(tenant)) {woken}", tenants)
    finally:
        await conn.close()
    assert set(named) == {r[0] for r in in_sql} == {CHANNEL, channel(""), channel("acme"), channel("ünïcode")}


async def test_a_transaction_begun_with_its_statements_never_stays_open(pg_url: str) -> None:
    # citus._begun replaces asyncpg's transaction for the append: what fails inside rolls back, and a task
    # cancelled in the middle of a statement leaves the connection closed or out of its transaction,
    # never handed back with the transaction open.
    conn = await asyncpg.connect(asyncpg_dsn(pg_url))
    table = f"ct_begun_{uuid.uuid4().hex[:8]}"
    try:
        await conn.execute(f"CREATE TABLE {table} (x int)")
        with pytest.raises(ZeroDivisionError):
            async with citus._begun(conn, f"INSERT INTO {table} VALUES (1)"):
                await conn.execute(f"INSERT INTO {table} VALUES (2)")
                raise ZeroDivisionError
        assert not conn.is_in_transaction()
        assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0
        async with citus._begun(conn, f"INSERT INTO {table} VALUES (1)"):
            await conn.execute(f"INSERT INTO {table} VALUES (2)")
        assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 2

        async def slow() -> None:
            async with citus._begun(conn, ""):
                await conn.execute("SELECT pg_sleep(10)")

        task = asyncio.create_task(slow())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert conn.is_closed() or not conn.is_in_transaction()
    finally:
        if conn.is_closed():
            conn = await asyncpg.connect(asyncpg_dsn(pg_url))
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await conn.close()


_GUARD_KINDS = """
SELECT result FROM run_command_on_shards('ct_sessions', $$SELECT tgtype FROM pg_trigger
    WHERE tgrelid = '%s'::regclass AND tgname LIKE 'ct_sessions_not_erased%%'$$)
"""


@pytest.mark.citus
async def test_the_erasure_guard_runs_once_per_statement_on_every_shard(pg_url: str) -> None:
    # Per row, the guard's dynamic query cost about 100 us on a worker for every session an append locked
    # (a BEFORE INSERT trigger fires before ON CONFLICT finds the row). On Citus it is a statement trigger
    # over the inserted rows; db upgrade replaces the row trigger an older calltape created.
    conn = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        await upgrade(pg_url, citus=True)
        assert {int(r[0]) & 1 for r in await conn.fetch(_GUARD_KINDS)} == {0}  # every shard: per statement
        await conn.execute(
            "CREATE OR REPLACE FUNCTION ct_test_row_guard() RETURNS trigger LANGUAGE plpgsql "
            "AS $$ BEGIN RETURN NEW; END $$"
        )
        async with conn.transaction():  # the guard as an older calltape left it: per row
            await conn.execute("SET LOCAL citus.enable_unsafe_triggers = on")
            await conn.execute("DROP TRIGGER ct_sessions_not_erased ON ct_sessions")
            await conn.execute(
                "CREATE TRIGGER ct_sessions_not_erased BEFORE INSERT ON ct_sessions "
                "FOR EACH ROW EXECUTE FUNCTION ct_test_row_guard()"
            )
        assert {int(r[0]) & 1 for r in await conn.fetch(_GUARD_KINDS)} == {1}
        await upgrade(pg_url, citus=True)
        assert {int(r[0]) & 1 for r in await conn.fetch(_GUARD_KINDS)} == {0}
        await conn.execute("DROP FUNCTION ct_test_row_guard()")
    finally:
        await conn.close()
    session = f"citus-{uuid.uuid4().hex[:12]}"
    async with await open_store(pg_url) as store:
        await store.append([started(session)])
        await store.erase(session)
        with pytest.raises(SessionErased):
            await store.append([started(session)])
        other = f"citus-{uuid.uuid4().hex[:12]}"
        await store.append([started(other), text(other, "fine")])  # new sessions still start
        with pytest.raises(SessionErased):  # one erased session among new ones refuses the batch
            await store.append([started(f"citus-{uuid.uuid4().hex[:12]}"), started(session)], expected_seq=None)


@pytest.mark.citus
async def test_a_tenants_store_hands_its_tenant_on_in_the_begin(pg_url: str) -> None:
    # The workers read the tenant from the transaction's SET LOCAL, sent in the same message as BEGIN: a
    # tenant's append needs no statement more than anyone's (three), a read two (the opening and COMMIT),
    # not three.
    tag = uuid.uuid4().hex[:8]
    session, tenant = f"t-{tag}", f"acme-{tag}"
    async with app_role(pg_url) as url, await open_store(url, tenant=tenant) as store:
        assert isinstance(store, CitusEventStore) and store.held_by_rls
        await store.append([started(session)])
        await store.append([text(session, "warm")])
        with _statements() as appended:
            await store.append([text(session, "hello")])
        with _statements() as read:
            events = await store.read(session)
    assert [e.data.get("text") for e in events][1:] == ["warm", "hello"]
    for seen, count in ((appended, 3), (read, 3)):
        queries = [" ".join(q.split()) for q, _ in seen]
        assert len(queries) == count, queries
        assert queries[0].startswith("BEGIN; SET LOCAL citus.propagate_set_commands = 'local'; SET LOCAL")
        assert queries[-1] == "COMMIT"


@pytest.mark.citus
async def test_a_writer_that_knows_a_row_and_one_that_locks_it_never_deadlock() -> None:
    # Two writers of one session, both planning the same next seq: one from the row its last append left
    # (no lock), one under the lock. The first writes the summary before the event, so it takes the row's
    # lock before the event exists; events first, the locking writer's insert of the same seq would wait
    # for that event while the first waited for the lock (a deadlock, found by the worker after a second).
    url = os.environ["CALLTAPE_TEST_CITUS_URL"]
    session = f"citus-{uuid.uuid4().hex[:12]}"
    deadlocks: list[BaseException] = []
    cls = asyncpg.connection.Connection
    real = cls.execute

    async def watched(self: Any, query: str, *args: Any, **kw: Any) -> Any:
        try:
            return await real(self, query, *args, **kw)
        except asyncpg.DeadlockDetectedError as exc:
            deadlocks.append(exc)
            raise

    async with await open_store(url) as a, await open_store(url) as b:
        assert isinstance(a, CitusEventStore) and isinstance(b, CitusEventStore)
        await a.append([started(session)])
        cls.execute = watched  # type: ignore[method-assign]
        try:
            for i in range(30):
                await a.append([text(session, f"a-{i}")])  # a knows the row now
                b._forget([session])  # b locks it
                await asyncio.gather(a.append([text(session, f"a2-{i}")]), b.append([text(session, f"b-{i}")]))
        finally:
            cls.execute = real  # type: ignore[method-assign]
        events = await a.read(session)
    assert deadlocks == []
    assert [e.seq for e in events] == list(range(1, 1 + 1 + 30 * 3))


@pytest.mark.citus
async def test_a_shards_large_part_goes_in_as_arrays_on_one_shard_in_one_phase(pg_url: str) -> None:
    # From PUSH_FROM events a shard, the events travel as arrays in an INSERT … SELECT joined to the shard's
    # session rows, which Citus pushes down whole (one task) and commits in one phase, with positions and
    # the transaction id read on the coordinator first: the first append (under the locks), a writer's
    # next (its rows known), and a tenant role's append; a re-append writes nothing (its ids are stored).
    session = f"citus-{uuid.uuid4().hex[:12]}"
    n = citus.PUSH_FROM + 20
    first = [started(session)] + [text(session, f"line {i}") for i in range(n - 1)]
    second = [text(session, f"more {i}") for i in range(n)]
    before = await _two_phase_commits(pg_url)
    async with await open_store(pg_url) as store:
        assert isinstance(store, CitusEventStore)
        head = await store.head()
        for batch, seqs in ((first, range(1, n + 1)), (second, range(n + 1, 2 * n + 1))):
            with _statements() as seen:
                stored = await store.append(batch)
            assert [e.seq for e in stored] == list(seqs)
            sent = [" ".join(q.split()) for q, _ in seen]
            assert not any("INSERT INTO ct_events (" in q and " VALUES " in q for q in sent), sent
            pushed = [(q, a) for q, a in seen if "OVERRIDING SYSTEM VALUE" in q]
            assert len(pushed) == 1 and len(pushed[0][1][0]) == n
            assert [c for c, _ in await _task_counts(pg_url, pushed)] == [1]
        with _statements() as seen:
            again = await store.append(first)  # (its ids are looked up under the locks: nothing is written)
        assert [(e.seq, e.id) for e in again] == [(e.seq, e.id) for e in (await store.read(session))[:n]]
        assert not any(q.lstrip().startswith("INSERT INTO ct_events") for q, _ in seen)
        assert await _two_phase_commits(pg_url) == before
        events = await store.read(session)
        assert [e.seq for e in events] == list(range(1, 2 * n + 1))
        assert [e.data.get("text") for e in events[1:]] == [f"line {i}" for i in range(n - 1)] + [
            f"more {i}" for i in range(n)
        ]
        # The feed sees them once each, in append order: the coordinator's transaction ids, and positions
        # that rise with the events within each transaction.
        await settle(store)
        fed = await _feed_of(store, head, {session})
        assert [e.seq for _, e in fed] == list(range(1, 2 * n + 1))
        assert len({p.txid for p, _ in fed}) == 2 and [p for p, _ in fed] == sorted(p for p, _ in fed)
    tenant = f"acme-{uuid.uuid4().hex[:8]}"
    async with app_role(pg_url) as url, await open_store(url, tenant=tenant) as held_store:
        mine = f"citus-{uuid.uuid4().hex[:12]}"
        stored = await held_store.append([started(mine)] + [text(mine, f"t {i}") for i in range(n)])
        assert [e.seq for e in stored] == list(range(1, n + 2))
        assert len(await held_store.read(mine)) == n + 1
    conn = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        assert await conn.fetch("SELECT DISTINCT tenant FROM ct_events WHERE session = $1", mine) == [(tenant,)]
    finally:
        await conn.close()


@pytest.mark.citus
async def test_a_follower_sees_every_event_of_concurrent_array_appends_exactly_once(pg_url: str) -> None:
    # Writers whose every shard part goes in as arrays (each session's part is over PUSH_FROM events),
    # side by side, while a follower reads the feed in small pages: every event once, none skipped.
    tag = uuid.uuid4().hex[:8]
    per = citus.PUSH_FROM + 10
    stores = [await open_store(pg_url) for _ in range(4)]
    try:
        reader = stores[0]
        position = await reader.head()
        ours = {f"arr-{tag}-{w}-{k}" for w in range(4) for k in range(3)}
        appended: list[str] = []
        done = asyncio.Event()

        async def writer(w: int, store: Any) -> None:
            for round_ in range(3):
                batch = [text(f"arr-{tag}-{w}-{k}", f"{round_}.{i}") for k in range(3) for i in range(per)]
                appended.extend(e.id for e in await store.append(batch))

        following = asyncio.create_task(follow_feed(reader, position, ours, done, limit=50))
        with _statements() as sent:
            await asyncio.gather(*(writer(w, s) for w, s in enumerate(stores)))
        await settle(reader)
        done.set()
        seen = await asyncio.wait_for(following, 30)
        queries = [" ".join(q.split()) for q, _ in sent]
        assert sum("OVERRIDING SYSTEM VALUE" in q for q in queries) >= 4 * 3  # (every part as arrays)
        assert not any("INSERT INTO ct_events (" in q and " VALUES " in q for q in queries)
        assert len(seen) == len(set(seen)) == 4 * 3 * 3 * per
        assert set(seen) == set(appended)
    finally:
        for store in stores:
            await store.close()


@pytest.mark.citus
async def test_an_import_over_many_shards_sends_no_arrays_to_every_shard(pg_url: str) -> None:
    # A bulk import's events are not split by shard (it commits over all of them at once): as arrays, every
    # shard's task would receive all of its rows. They go as VALUES, which Citus routes row by row.
    sessions = [f"citus-bulk-{uuid.uuid4().hex[:10]}" for _ in range(40)]
    async with await open_store(pg_url) as store:
        assert isinstance(store, CitusEventStore)
        assert len({shard for shard, _ in (await store.placements(sessions)).values()}) > 1
        events = [started(s) for s in sessions] + [text(s, f"n{i}") for i in range(2) for s in sessions]
        assert len(events) >= citus.PUSH_FROM
        with _statements() as seen:
            async with bulk_import(store) as imp:
                await imp.add(events)
        assert not [q for q, _ in seen if "OVERRIDING SYSTEM VALUE" in q]
        for s in sessions:
            assert [e.seq for e in await store.read(s)] == [1, 2, 3]
