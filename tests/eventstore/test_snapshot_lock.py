"""A snapshot save's hold on the session row (PostgreSQL): an append neither waits for it nor holds it
up; an erasure waits for it, which is what keeps an erased session's content out of ``ct_snapshots``."""

from __future__ import annotations

import asyncio

import pytest
from eventstore_support import raw_pg, started, text
from sqlalchemy.dialects import postgresql

from calltape.eventstore.postgres import PostgresEventStore
from calltape.eventstore.queries import _SESSION_FOR_SHARE


async def test_a_save_holding_the_row_lets_appends_through_and_holds_an_erasure(store, store_url, session_id):
    if not isinstance(store, PostgresEventStore):
        pytest.skip("SQLite's writers take turns on the file: there is no row lock to choose")
    await store.append([started(session_id)])
    sql, args = _SESSION_FOR_SHARE.bind(postgresql.asyncpg.dialect(), {"session": session_id})
    assert sql.rstrip().endswith("FOR KEY SHARE")
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
