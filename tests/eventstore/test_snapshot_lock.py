"""A snapshot save's hold on the session row (PostgreSQL): an append neither waits for it nor holds it
up; an erasure waits for it, which is what keeps an erased session's content out of ``ct_snapshots``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from eventstore_support import raw_pg, started, text
from sqlalchemy.dialects import postgresql

from calltape.eventstore.postgres import PostgresEventStore, _PgDb
from calltape.eventstore.queries import _SAVE_GUARD


async def test_a_save_holding_the_row_lets_appends_through_and_holds_an_erasure(store, store_url, session_id):
    if not isinstance(store, PostgresEventStore):
        pytest.skip("SQLite's writers take turns on the file: there is no row lock to choose")
    await store.append([started(session_id)])
    params = {"session": session_id, "version": 1, "kept": []}
    sql, args = _SAVE_GUARD.bind(postgresql.asyncpg.dialect(), params)
    assert sql.rstrip().endswith("FOR KEY SHARE OF ct_sessions")
    saving = await raw_pg(store_url)  # a save in progress: its transaction holds what the save's holds
    try:
        await saving.execute("BEGIN")
        assert await saving.fetchrow(sql, *args) is not None
        async with asyncio.timeout(5):  # the append does not wait for the save (nor the reverse)
            (stored,) = await store.append([text(session_id, "during the save")])
        assert stored.seq == 2
        erasing = asyncio.ensure_future(store.erase(session_id))
        await asyncio.sleep(0.3)
        assert not erasing.done()  # the erasure waits for the save to commit
        await saving.execute("COMMIT")
        assert await erasing == 2
    finally:
        await saving.close()


async def test_a_save_does_not_wait_for_an_append_in_flight(store, store_url, session_id):
    if not isinstance(store, PostgresEventStore):
        pytest.skip("SQLite's writers take turns on the file: there is no row lock to choose")
    await store.append([started(session_id)])
    appending = await raw_pg(store_url)  # an append's transaction, between its summary update and its commit
    try:
        await appending.execute("BEGIN")
        await appending.execute("UPDATE ct_sessions SET last_at_ms = last_at_ms WHERE session = $1", session_id)
        async with asyncio.timeout(5):
            assert await store.save_snapshot_over(session_id, 1, [(1, b"header")], set())
        await appending.execute("ROLLBACK")
    finally:
        await appending.close()
    assert await store.load_snapshot(session_id, 1) == (1, b"header")


async def test_a_save_does_not_wait_for_the_disk_and_leaves_appends_waiting_for_it(store, session_id, monkeypatch):
    """A snapshot is rebuilt from the log: its commit may be acknowledged before it is on disk, but only
    its own (``SET LOCAL``): an append on the same pooled connection afterwards waits for the disk again."""
    if not isinstance(store, PostgresEventStore):
        pytest.skip("SQLite's commits are the WAL's, not per transaction")
    seen: list[str] = []
    insert = _PgDb.executemany

    async def noting(self: _PgDb, query: Any, rows: Any) -> None:
        seen.append(await self.conn.fetchval("SHOW synchronous_commit"))
        await insert(self, query, rows)

    await store.append([started(session_id)])
    monkeypatch.setattr(_PgDb, "executemany", noting)
    assert await store.save_snapshot_over(session_id, 1, [(1, b"header")], set())
    assert seen == ["off"]
    async with store._connection() as conn:
        assert await conn.fetchval("SHOW synchronous_commit") == "on"
