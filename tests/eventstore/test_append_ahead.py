"""The next batch sent while one is in flight (issue 32: the server's work for one batch overlaps the
client's for the next). ``append_ahead`` is planned against the rows the append in flight will leave;
its events go in beside that append's, its summaries wait for that append's row locks and commit only
if it left what was planned. Made deterministic with a second connection holding a session row."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncpg
import pytest
from eventstore_support import raw_pg, started, text, texts

from calltape.errors import CalltapeError
from calltape.events import Event
from calltape.eventstore import EventStore, open_store
from calltape.eventstore.recorder import Recorder
from calltape.eventstore.store import _AppendNotAhead


@pytest.fixture
async def pg_store(pg_url: str) -> EventStore:
    store = await open_store(pg_url)
    if not store.pipelines:
        await store.close()
        pytest.skip("this store decides each batch on its own (Citus asks where each session lives first)")
    yield store  # type: ignore[misc]
    await store.close()


async def _hold_row(pg_url: str, session: str) -> asyncpg.Connection:
    conn = await raw_pg(pg_url)
    await conn.execute("BEGIN")
    await conn.execute("SELECT 1 FROM ct_sessions WHERE session = $1 FOR UPDATE", session)
    return conn


async def _stored(store: EventStore, session: str) -> list[Event]:
    return list(await store.read(session))


async def test_ahead_commits_after_the_append_in_flight(pg_store: EventStore, pg_url: str, session_id: str) -> None:
    await pg_store.append([started(session_id), text(session_id, "a")])
    first, second = texts(session_id, 250, "first"), texts(session_id, 30, "second")
    holder = await _hold_row(pg_url, session_id)
    in_flight = asyncio.create_task(pg_store.append(first))
    await asyncio.sleep(0)  # planned, its rows marked; its write waits on the held row
    ahead = asyncio.create_task(pg_store.append_ahead(second))
    await asyncio.sleep(0.2)
    assert not in_flight.done() and not ahead.done()  # the ahead waits for the append in flight's rows
    await holder.execute("ROLLBACK")
    await holder.close()
    stored_first, stored_second = await in_flight, await ahead
    assert [e.seq for e in stored_first + stored_second] == list(range(3, 3 + 280))
    log = await _stored(pg_store, session_id)
    assert [e.id for e in log[2:]] == [e.id for e in first + second]
    # the store's own rows are the newest: the next append is decided without a lock round trip
    (last,) = await pg_store.append([text(session_id, "after")])
    assert last.seq == 283


async def test_ahead_writes_nothing_when_the_append_in_flight_did_not_leave_its_rows(
    pg_store: EventStore, pg_url: str, session_id: str
) -> None:
    await pg_store.append([started(session_id), text(session_id, "a")])
    other = await open_store(pg_url)
    try:
        await other.append([text(session_id, "another writer")])  # the row moves under pg_store's cache
        holder = await _hold_row(pg_url, session_id)
        mine = texts(session_id, 3, "mine")
        in_flight = asyncio.create_task(pg_store.append(mine))
        await asyncio.sleep(0)  # planned against the stale row: its check will fail, then it relocks
        ahead_events = texts(session_id, 2, "ahead")
        ahead = asyncio.create_task(pg_store.append_ahead(ahead_events))
        await asyncio.sleep(0.1)
        await holder.execute("ROLLBACK")
        await holder.close()
        with pytest.raises(_AppendNotAhead):
            await ahead
        stored = await in_flight
        assert [e.seq for e in stored] == [4, 5, 6]
        log = await _stored(pg_store, session_id)
        assert [e.data["text"] for e in log[1:]] == ["a", "another writer", "mine0", "mine1", "mine2"]
    finally:
        await other.close()


async def test_ahead_of_unknown_sessions_is_not_decided(pg_store: EventStore, session_id: str) -> None:
    with pytest.raises(_AppendNotAhead):
        await pg_store.append_ahead([started(session_id)])
    assert await _stored(pg_store, session_id) == []


async def test_ahead_whose_rule_fails_against_the_planned_rows_is_not_decided(
    pg_store: EventStore, session_id: str
) -> None:
    await pg_store.append([started(session_id)])
    with pytest.raises(_AppendNotAhead):  # the true verdict is the plain append's, once the rows are settled
        await pg_store.append_ahead([started(session_id)])
    assert len(await _stored(pg_store, session_id)) == 1


class _Spy:
    """Counts what the recorder sent ahead, and how it ended."""

    def __init__(self, store: EventStore) -> None:
        self.ok = 0
        self.not_ahead = 0
        original = store.append_ahead

        async def append_ahead(events: Sequence[Event]) -> list[Event]:
            try:
                result = await original(events)
            except Exception:
                self.not_ahead += 1
                raise
            self.ok += 1
            return result

        store.append_ahead = append_ahead  # type: ignore[method-assign]


async def test_a_recorder_behind_by_batches_pipelines_them_in_order(pg_store: EventStore) -> None:
    sessions = [f"ahead-{i}-{id(pg_store)}" for i in range(20)]
    spy = _Spy(pg_store)
    rec = await Recorder(pg_store, max_batch=40).start()
    emitted: dict[str, list[str]] = {s: [] for s in sessions}
    for s in sessions:
        emitted[s].append(rec.session(s).emit("session.started", {"agent": "a"}).id)
    for i in range(60):
        for s in sessions:
            emitted[s].append(rec.session(s).emit("user.text", {"text": f"t{i}"}).id)
    await rec.close()
    assert spy.ok > 5  # the writer was behind by a batch or more most of the time
    assert rec.stats.committed == 20 * 61 and rec.stats.rejected == 0
    for s in sessions:
        log = await _stored(pg_store, s)
        assert [e.id for e in log] == emitted[s]
        assert [e.seq for e in log] == list(range(1, 62))


async def test_a_refused_batch_keeps_each_sessions_order_with_the_batch_behind_it(
    pg_store: EventStore, pg_url: str
) -> None:
    tag = id(pg_store)
    sessions = [f"fence-{i}-{tag}" for i in range(10)]
    zombie = sessions[3]
    await pg_store.append([started(s) for s in sessions])
    refused: list[Event] = []
    spy = _Spy(pg_store)
    rec = await Recorder(pg_store, max_batch=15, on_rejected=lambda evs, exc: refused.extend(evs)).start()
    other = await open_store(pg_url)
    try:
        # another agent takes the zombie's call over: the recorder's epoch-1 events of it are refused
        resumed = Event(
            type="session.resumed",
            data={"agent": "b", "epoch": 2, "from_seq": 1},
            session=zombie,
            epoch=2,
        )
        from calltape.events import ensure_checked

        ensure_checked(resumed)
        await other.append([resumed])
        emitted: dict[str, list[str]] = {s: [] for s in sessions}
        for i in range(12):
            for s in sessions:
                emitted[s].append(rec.session(s).emit("user.text", {"text": f"t{i}"}).id)
        await rec.close()
    finally:
        await other.close()
    assert {e.session for e in refused} == {zombie} and len(refused) == 12
    assert spy.not_ahead >= 1  # a batch behind the refused one was decided again after it
    for s in sessions:
        log = await _stored(pg_store, s)
        if s == zombie:
            assert [e.type for e in log] == ["session.started", "session.resumed"]
        else:
            assert [e.id for e in log[1:]] == emitted[s]
            assert [e.seq for e in log] == list(range(1, 14))


async def test_the_same_id_in_both_batches_is_written_in_turn(pg_store: EventStore) -> None:
    session = f"dup-{id(pg_store)}"
    await pg_store.append([started(session)])
    spy = _Spy(pg_store)
    rec = await Recorder(pg_store, max_batch=5).start()
    tape = rec.session(session)
    for i in range(4):
        tape.emit("user.text", {"text": f"t{i}"})
    tape.emit("user.text", {"text": "fact"}, id="fixed-id")
    tape.emit("user.text", {"text": "fact"}, id="fixed-id")  # the batch behind carries it again
    for i in range(3):
        tape.emit("user.text", {"text": f"u{i}"})
    await rec.close()
    assert spy.ok == 0 and spy.not_ahead == 0  # never sent ahead: the two inserts would wait on each other
    log = await _stored(pg_store, session)
    assert [e.data["text"] for e in log[1:]] == ["t0", "t1", "t2", "t3", "fact", "u0", "u1", "u2"]


def test_not_ahead_is_internal_not_a_calltape_error() -> None:
    # the recorder appends such a batch again; a user never sees it
    assert not issubclass(_AppendNotAhead, CalltapeError)
