"""Reads on the store's own connection (PostgreSQL) or thread (SQLite): concurrent reads, a lost
connection, and the tenant check folded into the read's statement."""

from __future__ import annotations

import asyncio

import pytest
from eventstore_support import started, text
from sqlalchemy.engine import make_url

from calltape.errors import StoreUnavailable
from calltape.eventstore import open_store
from calltape.projections import build_context


async def test_concurrent_reads_each_get_the_whole_log(store, session_id):
    """Reads that overlap (the read connection busy: the others take a pool connection) all see the same
    events, data decoded, and so do reads of a bounded range."""
    events = [started(session_id)] + [text(session_id, f'line {i} é \u2028 "q"') for i in range(300)]
    await store.append(events)
    alone = await store.read(session_id)
    assert [e.data for e in alone] == [e.data for e in events]
    assert all(e.checked and e.session == session_id for e in alone)
    reads = await asyncio.gather(*(store.read(session_id) for _ in range(6)))
    assert all(r == alone for r in reads)
    ranges = await asyncio.gather(*(store.read(session_id, after_seq=k, to_seq=k + 50) for k in range(0, 300, 50)))
    assert [e for r in ranges for e in r] == alone[:300]
    assert await store.read(session_id, after_seq=10, limit=5) == alone[10:15]
    folds = await asyncio.gather(*(build_context(store, session_id, snapshots=None) for _ in range(3)))
    assert {f.seq for f in folds} == {301}


async def test_a_read_after_the_read_connection_is_lost_reconnects(pg_url, proxy, session_id):
    """The connection reads run on dies (the database restarted, a proxy cut): at most the read that
    meets it fails, as the store's other calls do; the next one reads on a fresh connection."""
    via_proxy = make_url(pg_url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    store = await open_store(via_proxy)
    try:
        await store.append([started(session_id), text(session_id, "hello")])
        assert len(await store.read(session_id)) == 2
        await proxy.kill()
        await proxy.restart()
        try:
            first = await store.read(session_id)
        except StoreUnavailable:
            first = await store.read(session_id)
        assert [e.seq for e in first] == [1, 2]
        assert [e.seq for e in await store.read(session_id)] == [1, 2]
        assert (await store.session_info(session_id)).last_seq == 2
    finally:
        await store.close()


async def test_a_cancelled_read_leaves_the_next_one_whole(store, session_id):
    """A read cancelled while its rows arrive does not leave half a result on the read connection."""
    await store.append([started(session_id)] + [text(session_id, "x" * 200) for _ in range(3000)])
    task = asyncio.ensure_future(store.read(session_id))
    await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    log = await store.read(session_id)
    assert [e.seq for e in log] == list(range(1, 3002))
