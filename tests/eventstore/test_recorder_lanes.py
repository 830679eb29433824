"""Durable appends ordered per session, not behind the batch in flight (issue 32, item 3): a durable append
of a session with nothing in the batch being written commits beside it, on a connection of its own; one
whose session is in that batch follows it. The batch is made slow deterministically: a second connection
holds the lock on a session row the batch must update."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import asyncpg
import orjson
import pytest
from eventstore_support import TcpProxy, raw_pg, started, text
from sqlalchemy.engine import make_url

from calltape.errors import CalltapeError, FencedWrite
from calltape.events import Event
from calltape.eventstore import EventStore, open_store
from calltape.eventstore.recorder import DurableAppendTimeout, Recorder, RecorderSpilled
from calltape.runtime import resume


def _postgres(store: EventStore, store_url: str) -> tuple[EventStore, str]:
    """The PostgreSQL store (a lock on a session row from another connection is how a batch is made slow)."""
    if store.dialect != "postgresql":
        pytest.skip("lanes are PostgreSQL's default; SQLite's writers take turns on one file lock")
    return store, store_url


async def _hold_row(pg_url: str, session: str) -> asyncpg.Connection:
    """A connection holding ``session``'s row locked (until it rolls back): an append of it waits."""
    conn = await raw_pg(pg_url)
    await conn.execute("BEGIN")
    await conn.execute("SELECT 1 FROM ct_sessions WHERE session = $1 FOR UPDATE", session)
    return conn


async def _stuck(
    store: EventStore, store_url: str, stuck: str, *others: str, lanes: int | None = None
) -> tuple[EventStore, Recorder, asyncpg.Connection]:
    """The PostgreSQL store with ``stuck`` and ``others`` started, a recorder on it, and a connection
    holding ``stuck``'s row (an append of it waits until :func:`_release`)."""
    pg_store, pg_url = _postgres(store, store_url)
    await pg_store.append([started(s) for s in (stuck, *others)])
    rec = await Recorder(pg_store, durable_lanes=lanes).start()
    return pg_store, rec, await _hold_row(pg_url, stuck)


async def _release(conn: asyncpg.Connection) -> None:
    await conn.execute("ROLLBACK")
    await conn.close()


async def _until(check: object, seconds: float = 10.0) -> None:
    async with asyncio.timeout(seconds):
        while not check():  # type: ignore[operator]  # noqa: ASYNC110  (polls the recorder's state)
            await asyncio.sleep(0.005)


async def test_a_durable_append_commits_beside_a_stuck_batch(
    store: EventStore, store_url: str, session_id: str
) -> None:
    slow, quick = f"{session_id}-slow", f"{session_id}-quick"
    pg_store, rec, holder = await _stuck(store, store_url, slow, quick)
    assert rec.durable_lanes  # PostgreSQL's default
    try:
        rec.emit(text(slow, "stuck"))
        await _until(lambda: rec._inflight == 1)  # the batch is being written, and waits on the lock
        queued = [text(quick, f"q{k}") for k in range(3)]
        for event in queued:
            rec.emit(event)
        # without the lane this waits behind the stuck batch, and times out
        stored = await rec.append(text(quick, "durable"), timeout=5)
        assert stored.seq == 5  # after the three emitted before it, in order
        assert [e.id for e in await pg_store.read(quick)][1:4] == [e.id for e in queued]
        assert (await pg_store.session_info(slow)).last_seq == 1  # type: ignore[union-attr]
        assert rec._inflight == 1  # the slow batch is still waiting
    finally:
        await _release(holder)
    await asyncio.wait_for(rec.flush(), 10)
    assert [e.data.get("text") for e in await pg_store.read(slow)][1:] == ["stuck"]
    await rec.close()


async def test_a_durable_append_follows_its_session_in_the_batch_in_flight(
    store: EventStore, store_url: str, session_id: str
) -> None:
    pg_store, rec, holder = await _stuck(store, store_url, session_id)
    try:
        rec.emit(text(session_id, "first"))
        await _until(lambda: rec._inflight == 1)
        durable = asyncio.ensure_future(rec.append(text(session_id, "second"), timeout=10))
        await asyncio.sleep(0.3)
        assert not durable.done()  # it may not overtake its session's event in flight
    finally:
        await _release(holder)
    stored = await asyncio.wait_for(durable, 10)
    assert stored.seq == 3
    assert [e.data.get("text") for e in await pg_store.read(session_id)][1:] == ["first", "second"]
    await rec.close()


async def test_events_emitted_while_a_lane_writes_follow_it_in_order(
    store: EventStore, store_url: str, session_id: str
) -> None:
    """The lane itself stuck: what its session emits meanwhile (and a second durable append) waits for it,
    and every event lands in emit order, while other sessions' batches go on."""
    other = f"{session_id}-other"
    pg_store, rec, holder = await _stuck(store, store_url, session_id, other)
    try:
        first = asyncio.ensure_future(rec.append(text(session_id, "d1"), timeout=10))
        await _until(lambda: session_id in rec._lane_batches)
        rec.emit(text(session_id, "e1"))
        second = asyncio.ensure_future(rec.submit(text(session_id, "d2"), timeout=10))  # queued now
        rec.emit(text(session_id, "e2"))
        await rec.append(text(other, "meanwhile"), timeout=5)  # the other sessions are not held
        await asyncio.sleep(0.1)
        assert not first.done() and not second.done()
    finally:
        await _release(holder)
    assert (await asyncio.wait_for(first, 10)).seq == 2
    assert (await asyncio.wait_for(second, 10)).seq == 4
    await asyncio.wait_for(rec.flush(), 10)
    assert [e.data.get("text") for e in await pg_store.read(session_id)][1:] == ["d1", "e1", "d2", "e2"]
    assert [e.seq for e in await pg_store.read(session_id)] == [1, 2, 3, 4, 5]
    assert not rec._lanes and rec.pending == 0
    await rec.close()


async def test_a_fenced_durable_append_in_its_lane_is_refused_once(
    store: EventStore, store_url: str, session_id: str
) -> None:
    pg_store, pg_url = _postgres(store, store_url)
    resumed, slow = session_id, f"{session_id}-slow"
    rec = await Recorder(pg_store).start()
    tape = rec.session(resumed, agent="triage")
    tape.emit("session.started", {"agent": "triage"})
    await tape.append("session.dropped", {"reason": "agent lost"})
    await rec.close()
    assert (await resume(pg_store, resumed, "rescue")).epoch == 2
    await pg_store.append([started(slow)])
    refused: list[tuple[Event, CalltapeError]] = []

    def on_rejected(events: Sequence[Event], error: CalltapeError) -> None:
        refused.extend((e, error) for e in events)

    rec = await Recorder(pg_store, on_rejected=on_rejected).start()
    holder = await _hold_row(pg_url, slow)
    try:
        rec.emit(text(slow, "stuck"))
        await _until(lambda: rec._inflight == 1)
        zombie = rec.session(resumed, agent="triage")  # epoch 1, behind the resume
        zombie.emit("user.text", {"text": "late"})
        with pytest.raises(FencedWrite):
            await zombie.append("user.text", {"text": "late durable"})
        assert len(refused) == 2 and all(isinstance(err, FencedWrite) for _, err in refused)
        assert rec.stats.retries == 0
    finally:
        await _release(holder)
    await asyncio.wait_for(rec.flush(), 10)
    await rec.close()


async def test_lanes_keep_order_and_settle_flush_on_either_store(store: EventStore, session_id: str) -> None:
    """Lanes forced on (SQLite's default is off): many sessions mixing emits and durable appends keep
    their emit order, and a flush settles what lanes hold."""
    sessions = [f"{session_id}-{k}" for k in range(6)]
    rec = await Recorder(store, durable_lanes=3, max_delay=0.002).start()
    for s in sessions:
        rec.emit(started(s))
    expected: dict[str, list[str]] = {s: [] for s in sessions}
    durables = []
    for i in range(40):
        for j, s in enumerate(sessions):
            label = f"{i}"
            expected[s].append(label)
            if (i + j) % 7 == 0:
                durables.append(asyncio.ensure_future(rec.submit(text(s, label), timeout=20)))
            else:
                rec.emit(text(s, label))
        await asyncio.sleep(0)
    await asyncio.wait_for(rec.flush(), 20)
    await asyncio.wait_for(asyncio.gather(*durables), 20)
    for s in sessions:
        stored = await store.read(s)
        assert [e.data.get("text") for e in stored[1:]] == expected[s]
        assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    assert rec.pending == 0 and not rec._lanes
    await rec.close()


async def test_past_the_lanes_a_durable_append_follows_the_batch(
    store: EventStore, store_url: str, session_id: str
) -> None:
    """Lanes hold pooled connections: with every lane taken, a durable append goes with the next batch
    (and still commits, here while the lane stays stuck)."""
    stuck, other = f"{session_id}-stuck", f"{session_id}-other"
    _, rec, holder = await _stuck(store, store_url, stuck, other, lanes=1)
    try:
        lane = asyncio.ensure_future(rec.submit(text(stuck, "in its lane"), timeout=10))
        assert list(rec._lanes) == [stuck]
        stored = await rec.append(text(other, "with the batch"), timeout=5)
        assert stored.seq == 2 and list(rec._lanes) == [stuck] and not lane.done()
    finally:
        await _release(holder)
    assert (await asyncio.wait_for(lane, 10)).seq == 2
    await asyncio.wait_for(rec.close(), 10)


async def test_a_durable_append_behind_a_stuck_lane_is_taken_back_on_timeout(
    store: EventStore, store_url: str, session_id: str
) -> None:
    pg_store, rec, holder = await _stuck(store, store_url, session_id)
    try:
        first = asyncio.ensure_future(rec.submit(text(session_id, "d1"), timeout=10))
        with pytest.raises(DurableAppendTimeout) as timed_out:
            await rec.append(text(session_id, "d2"), timeout=0.3)  # waits behind the lane, then gives up
        assert timed_out.value.withdrawn
    finally:
        await _release(holder)
    assert (await asyncio.wait_for(first, 10)).seq == 2
    await asyncio.wait_for(rec.flush(), 10)
    assert [e.data.get("text") for e in await pg_store.read(session_id)][1:] == ["d1"]  # d2 never written
    assert rec.pending == 0
    await rec.close()


async def test_close_spills_what_a_stuck_lane_holds(
    store: EventStore, store_url: str, session_id: str, tmp_path: Path
) -> None:
    _, rec, holder = await _stuck(store, store_url, session_id)
    try:
        durable = asyncio.ensure_future(rec.submit(text(session_id, "d1"), timeout=None))
        rec.emit(text(session_id, "e1"))  # follows the lane
        with pytest.raises(RecorderSpilled) as spilled:
            await rec.close(timeout=0.3, spill_dir=tmp_path)
        assert spilled.value.count == 2
        lines = spilled.value.path.read_bytes().splitlines()
        assert [orjson.loads(line)["data"].get("text") for line in lines] == ["d1", "e1"]
        with pytest.raises(RecorderSpilled):
            await durable  # told, never left hanging
    finally:
        await _release(holder)


async def test_a_lane_rides_out_an_outage(pg_url: str, proxy: TcpProxy, session_id: str) -> None:
    """A durable append in its lane when the database goes away is kept and retried like a batch, and
    commits once it is back."""
    url = make_url(pg_url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    proxied = await open_store(url)
    try:
        rec = await Recorder(proxied, retry_initial=0.02, retry_max=0.1).start()
        await rec.append(started(session_id))
        await proxy.kill()
        durable = asyncio.ensure_future(rec.submit(text(session_id, "during"), timeout=30))
        await asyncio.sleep(0.3)
        assert not durable.done() and session_id in rec._lanes
        await proxy.restart()
        assert (await asyncio.wait_for(durable, 30)).seq == 2
        assert rec.stats.retries > 0
        await rec.close()
    finally:
        await proxied.close()
