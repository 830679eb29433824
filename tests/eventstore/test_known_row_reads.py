"""The PostgreSQL store's known rows: a session summary it read plans the next append without a lock."""

from __future__ import annotations

import pytest
from eventstore_support import started, text

from calltape.eventstore import open_store
from calltape.eventstore.postgres import PostgresEventStore


def _pg(store: object) -> PostgresEventStore:
    if not isinstance(store, PostgresEventStore):
        pytest.skip("SQLite writes on its own thread's one connection")
    return store


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
