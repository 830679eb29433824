"""The recorder: non-blocking emit, group commit, durable append, backpressure, rejects, outages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from eventstore_support import started, terminate_other_backends, text
from sqlalchemy import text as sql
from sqlalchemy.engine import make_url

from calltape.errors import FencedWrite
from calltape.events import Event, make_event, parse_event
from calltape.eventstore import EventStore, open_store
from calltape.eventstore.citus import CitusEventStore
from calltape.eventstore.recorder import Recorder, RecorderClosed, RecorderFull, RecorderSpilled


@pytest.fixture
async def recorder(store: EventStore) -> AsyncIterator[Recorder]:
    rec = await Recorder(store, retry_initial=0.01, retry_max=0.1).start()
    try:
        yield rec
    finally:
        await asyncio.wait_for(rec.close(), 20)


async def test_emit_is_synchronous_and_group_commits(store, recorder, session_id):
    sessions = [f"{session_id}-{k}" for k in range(5)]
    emitted: list[Event] = []
    t0 = time.perf_counter()
    for s in sessions:
        e = started(s)
        assert recorder.emit(e) is None
        emitted.append(e)
    for i in range(40):
        e = text(sessions[i % 5], f"m{i}")
        recorder.emit(e)
        emitted.append(e)
    assert time.perf_counter() - t0 < 0.5  # 45 enqueues, no database round trip
    assert recorder.stats.committed == 0  # nothing was written inside emit
    assert recorder.pending == 45
    await asyncio.wait_for(recorder.flush(), 10)
    assert recorder.pending == 0
    assert recorder.stats.committed == 45
    assert recorder.stats.batches < 45
    assert recorder.stats.largest_batch > 1
    for s in sessions:
        log = await store.read(s)
        assert [e.id for e in log] == [e.id for e in emitted if e.session == s]
        assert [e.seq for e in log] == list(range(1, 10))


async def test_batches_are_bounded_by_size(store, session_id):
    # max_batch bounds each transaction: one database writes a batch in one, Citus in one per worker node
    # (a session's events in one of them), so a batch there holds max_batch events for each worker.
    if isinstance(store, CitusEventStore):
        async with store.engine.connect() as conn:
            workers = (await conn.execute(sql("SELECT count(*) FROM citus_get_active_worker_nodes()"))).scalar()
        assert store.write_groups == workers and workers >= 2
    else:
        assert store.write_groups == 1
    cap = 7 * store.write_groups
    async with Recorder(store, max_batch=7) as rec:
        for i in range(30):
            rec.emit(text(session_id, f"m{i}"))
        await rec.flush()  # (all 30 were queued before the writer first ran)
        assert rec.stats.largest_batch == cap
        assert rec.stats.batches == -(-30 // cap)
    assert [e.data["text"] for e in await store.read(session_id)] == [f"m{i}" for i in range(30)]


async def test_writer_commits_without_flush_within_a_few_ms(store, recorder, session_id):
    recorder.emit(started(session_id))
    for _ in range(500):
        if recorder.stats.committed == 1:
            break
        await asyncio.sleep(0.01)
    assert len(await store.read(session_id)) == 1


async def test_durable_append_returns_after_everything_emitted_before(store, recorder, session_id):
    recorder.emit(started(session_id))
    for i in range(5):
        recorder.emit(text(session_id, f"m{i}"))
    stored = await asyncio.wait_for(recorder.append(make_event(session_id, "tool.started", {"call": "c1"})), 10)
    assert stored.seq == 7
    assert stored.type == "tool.started" and stored.agent == "triage"
    log = await store.read(session_id)  # committed before append returned
    assert [e.seq for e in log] == list(range(1, 8))
    assert log[-1] == stored


async def test_durable_append_of_a_stored_event_returns_it(store, recorder, session_id):
    (first,) = await store.append([started(session_id)])
    again = await recorder.append(make_event(session_id, "session.started", {"agent": "x"}, id=first.id))
    assert again == first


async def test_session_tape(store, recorder, session_id):
    tape = recorder.session(session_id, agent="triage", epoch=1)
    tape.emit("session.started", {"agent": "triage"})
    tape.emit("user.text", {"text": "hello"}, at_ms=1_700_000_000_000)
    stored = await tape.append("tool.started", {"call": "c9"})
    assert (stored.seq, stored.epoch, stored.agent) == (3, 1, "triage")
    log = await store.read(session_id)
    assert [e.type for e in log] == ["session.started", "user.text", "tool.started"]
    assert log[1].at_ms == 1_700_000_000_000


async def test_recorder_full_and_put_waits_for_room(store, session_id):
    rec = Recorder(store, max_pending=5)  # not started yet: nothing drains
    events = [started(session_id), *(text(session_id, f"m{i}") for i in range(5))]
    for e in events[:5]:
        rec.emit(e)
    with pytest.raises(RecorderFull, match="already holds 5 unwritten events"):
        rec.emit(events[5])
    put = asyncio.create_task(rec.put(events[5]))
    await asyncio.sleep(0.05)
    assert not put.done()  # backpressure: put waits
    await rec.start()
    await asyncio.wait_for(put, 10)
    await asyncio.wait_for(rec.close(), 10)
    assert [e.id for e in await store.read(session_id)] == [e.id for e in events]


async def test_closed_recorder_refuses(store, session_id):
    rec = await Recorder(store).start()
    rec.emit(started(session_id))
    await rec.close()  # flushes first
    assert len(await store.read(session_id)) == 1
    with pytest.raises(RecorderClosed):
        rec.emit(text(session_id))
    with pytest.raises(RecorderClosed):
        await rec.append(text(session_id))
    unstarted = Recorder(store)
    with pytest.raises(RecorderClosed, match="not started"):
        await unstarted.append(text(session_id))


async def test_a_fenced_session_does_not_block_the_others(store, session_id):
    zombie_session, other = f"{session_id}-zombie", f"{session_id}-other"
    await store.append([started(zombie_session)])
    await store.append([make_event(zombie_session, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 1})])
    rejected: list[tuple[list[Event], Exception]] = []
    async with Recorder(store, on_rejected=lambda evs, exc: rejected.append((list(evs), exc))) as rec:
        good = [started(other), text(zombie_session, "current", epoch=2)]
        zombie = text(zombie_session, "zombie", epoch=1)
        rec.emit(good[0])
        rec.emit(zombie)
        rec.emit(good[1])
        later = [text(other, f"m{i}") for i in range(3)]
        for e in later:
            rec.emit(e)
        await asyncio.wait_for(rec.flush(), 10)
        assert [(evs[0].id, type(exc)) for evs, exc in rejected] == [(zombie.id, FencedWrite)]
        assert rec.stats.rejected == 1
        with pytest.raises(FencedWrite):
            await asyncio.wait_for(rec.append(text(zombie_session, "zombie2", epoch=1)), 10)
        assert rec.stats.rejected == 2
        (after,) = [await rec.append(text(other, "still writing"))]
        assert after.seq == 5
    assert [e.data.get("text") for e in await store.read(other)] == [None, "m0", "m1", "m2", "still writing"]
    assert [e.data.get("text") for e in await store.read(zombie_session)] == [None, None, "current"]


# -- database outage (PostgreSQL through a proxy we can cut) -----------------------------------


async def test_recorder_survives_a_database_outage(pg_url, proxy, session_id):
    via_proxy = make_url(pg_url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    proxied = await open_store(via_proxy)
    direct = await open_store(pg_url)
    sessions = [f"{session_id}-{k}" for k in range(4)]
    emitted: list[Event] = []
    slowest_emit = 0.0
    rec = await Recorder(proxied, retry_initial=0.02, retry_max=0.2).start()

    def emit(e: Event) -> None:
        nonlocal slowest_emit
        t0 = time.perf_counter()
        rec.emit(e)
        slowest_emit = max(slowest_emit, time.perf_counter() - t0)
        emitted.append(e)

    producing = True

    async def produce() -> None:  # a steady voice loop: keeps emitting through the outage
        i = 0
        while producing:
            emit(text(sessions[i % 4], f"live{i}"))
            i += 1
            await asyncio.sleep(0.002)

    try:
        for s in sessions:
            emit(started(s))
        await asyncio.wait_for(rec.flush(), 10)
        producer = asyncio.create_task(produce())
        await asyncio.sleep(0.1)
        committed_before = rec.stats.committed

        await proxy.kill()  # the database becomes unreachable, mid-stream
        await asyncio.sleep(0.6)
        assert rec.stats.retries > 0 and rec.stats.last_error
        assert rec.pending > 0  # kept, not dropped
        stalled = rec.stats.committed
        await asyncio.sleep(0.1)
        assert rec.stats.committed == stalled  # really nothing gets through

        await proxy.restart()
        await asyncio.sleep(0.1)
        producing = False
        await producer
        for s in sessions:
            emit(text(s, "after"))
        await asyncio.wait_for(rec.flush(), 20)
        assert rec.pending == 0
        assert rec.stats.committed > committed_before
        assert rec.stats.rejected == 0
        assert rec.stats.outage_seconds > 0.3
    finally:
        producing = False
        await asyncio.wait_for(rec.close(), 20)
        await proxied.close()

    try:
        for s in sessions:
            log = await direct.read(s)
            assert [e.id for e in log] == [e.id for e in emitted if e.session == s]  # all, once, in order
            assert [e.seq for e in log] == list(range(1, len(log) + 1))
            assert log[-1].data == {"text": "after"}
    finally:
        await direct.close()
    assert slowest_emit < 0.02, f"emit took {slowest_emit * 1000:.1f} ms"
    assert len(emitted) > 40  # the voice loop kept going (fewer on a loaded machine)


async def test_durable_append_waits_out_an_outage(pg_url, proxy, session_id):
    via_proxy = make_url(pg_url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    proxied = await open_store(via_proxy)
    try:
        async with Recorder(proxied, retry_initial=0.02, retry_max=0.1) as rec:
            await rec.append(started(session_id))
            await proxy.kill()
            pending = asyncio.create_task(rec.append(make_event(session_id, "tool.started", {"call": "c1"})))
            await asyncio.sleep(0.3)
            assert not pending.done()  # not acknowledged while nothing is committed
            await proxy.restart()
            stored = await asyncio.wait_for(pending, 10)
            assert stored.seq == 2
    finally:
        await proxied.close()


async def test_recorder_survives_terminated_connections(pg_url, session_id):
    """Every pooled connection killed by the server (failover, idle timeout): the writer reconnects."""
    store = await open_store(pg_url)
    emitted: list[Event] = [started(session_id)]
    try:
        async with Recorder(store, retry_initial=0.01, retry_max=0.05) as rec:
            rec.emit(emitted[0])
            await rec.flush()
            for round_ in range(3):
                assert await terminate_other_backends(pg_url) >= 1
                batch = [text(session_id, f"r{round_}.{i}") for i in range(5)]
                for e in batch:
                    rec.emit(e)
                emitted += batch
                await asyncio.wait_for(rec.flush(), 10)
            durable = await asyncio.wait_for(rec.append(text(session_id, "durable")), 10)
            assert durable.seq == 17
            assert rec.stats.rejected == 0
        log = await store.read(session_id)
        assert [e.id for e in log[:-1]] == [e.id for e in emitted]
    finally:
        await store.close()


async def test_close_during_an_outage_spills_to_jsonl(pg_url, proxy, session_id, tmp_path):
    via_proxy = make_url(pg_url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    proxied = await open_store(via_proxy)
    rec = await Recorder(proxied, retry_initial=0.02, retry_max=0.1).start()
    try:
        committed = [started(session_id), text(session_id, "before")]
        for e in committed:
            rec.emit(e)
        await asyncio.wait_for(rec.flush(), 10)
        await proxy.kill()
        unwritten = [text(session_id, f"during{i}") for i in range(5)]
        for e in unwritten:
            rec.emit(e)
        durable = asyncio.create_task(rec.append(make_event(session_id, "tool.started", {"call": "c1"})))
        await asyncio.sleep(0.2)
        # the outage shows in the figures /metrics reads: six events waiting, the oldest for 0.2 s or more
        assert rec.pending == 6 and rec.commit_lag >= 0.2
        with pytest.raises(RecorderSpilled) as info:
            await asyncio.wait_for(rec.close(timeout=0.3, spill_dir=tmp_path), 5)
        spilled = info.value
        assert spilled.count == 6 == rec.stats.spilled
        assert spilled.path.parent == tmp_path
        assert f"calltape import {spilled.path}" in str(spilled)
        # whoever awaited the durable append is told, not left hanging
        with pytest.raises(RecorderSpilled):
            await asyncio.wait_for(durable, 2)
        with pytest.raises(RecorderClosed):
            rec.emit(text(session_id))
    finally:
        await proxied.close()

    lines = spilled.path.read_bytes().splitlines()
    events = [parse_event(line) for line in lines]
    assert [e.id for e in events] == [e.id for e in unwritten] + [durable_id(events)]
    async with await open_store(pg_url) as direct:
        await direct.append(events)  # what `calltape import` does; idempotent if some had committed
        log = await direct.read(session_id)
    assert [e.id for e in log] == [e.id for e in committed + events]


def durable_id(events: list[Event]) -> str:
    (tool_started,) = [e for e in events if e.type == "tool.started"]
    return tool_started.id
