"""Write connections kept between writes (PostgreSQL): a write after a refused one, after a cancelled
one and after the connections were lost all work, and the store holds no more than it keeps."""

from __future__ import annotations

import asyncio

import pytest
from eventstore_support import started, text, texts
from sqlalchemy.engine import make_url

from calltape.errors import FencedWrite, InvalidEvent, StoreUnavailable
from calltape.events import make_event
from calltape.eventstore import open_store
from calltape.eventstore.postgres import KEPT_CONNECTIONS, PostgresEventStore


def _pg(store: object) -> PostgresEventStore:
    if not isinstance(store, PostgresEventStore):
        pytest.skip("SQLite writes on its own thread's one connection")
    return store


async def test_writes_reuse_kept_connections_and_keep_no_more_than_that(store, session_id):
    pg = _pg(store)
    await pg.append([started(session_id)])
    first = list(pg._kept)
    await pg.append([text(session_id, "again")])
    assert [e[1] for e in pg._kept] == [e[1] for e in first]  # the same connection, not a new checkout
    sessions = [f"{session_id}-{i}" for i in range(12)]
    await asyncio.gather(*(pg.append([started(s), text(s)]) for s in sessions))  # 12 writes at once
    assert 1 <= len(pg._kept) <= KEPT_CONNECTIONS
    assert all(not e[1].is_in_transaction() for e in pg._kept)


async def test_a_refused_write_leaves_its_connection_idle(store, session_id):
    pg = _pg(store)
    await pg.append([started(session_id)])
    with pytest.raises(InvalidEvent):
        await pg.append([text(session_id, "ok"), started(session_id)])  # refused inside the transaction
    assert all(not e[1].is_in_transaction() for e in pg._kept)
    (stored,) = await pg.append([text(session_id, "next")])
    assert stored.seq == 2
    with pytest.raises(FencedWrite):  # refused by the plan, before any statement
        await pg.append([make_event(session_id, "session.resumed", {"agent": "b", "epoch": 1, "from_seq": 2})])
    (stored,) = await pg.append([text(session_id, "last")])
    assert [e.seq for e in await pg.read(session_id)] == [1, 2, 3]


async def test_a_cancelled_write_does_not_leave_its_connection_kept(store, session_id):
    pg = _pg(store)
    await pg.append([started(session_id)])
    task = asyncio.ensure_future(pg.append(texts(session_id, 5000)))
    await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert all(not e[1].is_in_transaction() for e in pg._kept)
    last = (await pg.session_info(session_id)).last_seq
    (stored,) = await pg.append([text(session_id, "after")])
    assert stored.seq == last + 1


async def test_writes_after_the_kept_connections_were_lost(pg_url, proxy, session_id):
    via_proxy = make_url(pg_url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    store = _pg(await open_store(via_proxy))
    try:
        sessions = [f"{session_id}-{i}" for i in range(4)]
        await asyncio.gather(*(store.append([started(s)]) for s in sessions))
        assert store._kept
        await proxy.kill()
        await proxy.restart()
        try:
            await store.append([text(sessions[0], "first after")])
        except StoreUnavailable:
            assert not store._kept  # the others went with the one that was found lost
            await store.append([text(sessions[0], "first after")])
        for s in sessions[1:]:
            (stored,) = await store.append([text(s, "after")])  # no second failure: none was kept dead
            assert stored.seq == 2
    finally:
        await store.close()


class _CountingWriter(PostgresEventStore.writer_class):  # type: ignore[misc,valid-type]
    locks = 0

    async def lock_sessions(self, sessions):  # type: ignore[no-untyped-def]
        type(self).locks += 1
        return await super().lock_sessions(sessions)


async def test_a_row_read_is_a_known_row_for_the_next_append(store, store_url, session_id):
    """A resume reads the session's summary, then appends with expected_seq: one guarded statement, no
    lock round trip, from a store that never wrote the session; a row that moved in between is found."""
    pg = _pg(store)
    await pg.append([started(session_id), text(session_id, "a")])
    reader = await open_store(store_url)
    try:
        assert isinstance(reader, PostgresEventStore)
        reader.writer_class = _CountingWriter
        _CountingWriter.locks = 0
        info = await reader.session_info(session_id)
        assert info is not None
        (stored,) = await reader.append([text(session_id, "b")], expected_seq=info.last_seq)
        assert stored.seq == 3 and _CountingWriter.locks == 0
        await reader.session_info(session_id)
        await pg.append([text(session_id, "moved")])  # the row moves after the read
        (stored,) = await reader.append([text(session_id, "c")])
        assert stored.seq == 5 and _CountingWriter.locks == 1  # the guard found it; decided under the lock
        assert [e.data["text"] for e in (await pg.read(session_id))[1:]] == ["a", "b", "moved", "c"]
    finally:
        await reader.close()
