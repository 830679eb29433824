"""calltape on Citus (calltape/eventstore/citus.py).

The schema and the error mapping are checked on every run; the tests marked ``citus`` need a cluster
(``$CALLTAPE_TEST_CITUS_URL``, see tests/conftest.py) and are skipped without one. The rest of the store
suite runs on the cluster too when that variable is set.
"""

from __future__ import annotations

import asyncio
import os
import uuid

import asyncpg
import pytest
from eventstore_support import asyncpg_dsn, started, text

from calltape.errors import CalltapeError
from calltape.eventstore import open_store, upgrade
from calltape.eventstore.citus import DISTRIBUTED, NO_TENANTS, CitusEventStore, is_duplicate

pytestmark = pytest.mark.postgres


def test_a_unique_violation_relayed_by_citus_is_a_duplicate() -> None:
    relayed = asyncpg.InternalServerError(
        'duplicate key value violates unique constraint "ct_events_session_id_102009"'
    )
    assert is_duplicate(relayed)
    assert is_duplicate(asyncpg.UniqueViolationError("duplicate key value violates unique constraint"))
    assert not is_duplicate(asyncpg.InternalServerError("could not connect to worker"))


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
    async with await open_store(pg_url) as store:
        assert not isinstance(store, CitusEventStore)


# -- on the cluster ----------------------------------------------------------------------------


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
async def test_an_append_over_many_shards_commits_each_shard_in_one_phase(pg_url: str) -> None:
    sessions = [f"citus-{uuid.uuid4().hex[:12]}" for _ in range(40)]
    async with await open_store(pg_url) as store:
        assert isinstance(store, CitusEventStore)
        assert len(set((await store.shards(sessions)).values())) > 1
        before = await _two_phase_commits(pg_url)
        batch = [started(s) for s in sessions] + [text(s, "hello") for s in reversed(sessions)]
        stored = await store.append(batch)
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
        await asyncio.sleep(0)
        assert [e.session for _, e in await store.feed(head) if e.session == session] == [session]


@pytest.mark.citus
async def test_a_store_on_citus_refuses_a_tenant(pg_url: str) -> None:
    # The tenant policies of events and snapshots read ct_sessions in a subquery, which Citus refuses, so
    # the database would not keep tenants apart: calltape says so instead of pretending.
    with pytest.raises(CalltapeError) as info:
        await open_store(pg_url, tenant="acme")
    assert str(info.value) == NO_TENANTS
    with pytest.raises(CalltapeError, match="does not keep tenants apart on a Citus cluster"):
        await upgrade(pg_url, grant="postgres")
