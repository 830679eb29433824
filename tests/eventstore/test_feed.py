"""The global feed and the live subscription."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from eventstore_support import (
    atomic_across_sessions,
    drain_feed,
    pg_append_in_txn,
    raw_pg,
    retrying,
    settle,
    started,
    terminate_other_backends,
    text,
    texts,
)

from calltape.events import Event
from calltape.eventstore import START, EventStore, FeedPosition, open_store

# -- the feed, both backends ------------------------------------------------------------------


async def test_feed_is_ordered_and_pages_without_skips(store, session_id):
    a, b = f"{session_id}-a", f"{session_id}-b"
    head = await store.head()
    appended: list[Event] = []
    for i in range(6):
        appended += await store.append([text(a, f"a{i}"), text(b, f"b{i}")])
        appended += await store.append([text(a, f"a{i}'")])
    expected = [(e.session, e.seq) for e in appended]
    await settle(store)

    whole = [(p, e) for p, e in await store.feed(head, limit=1000) if e.session in (a, b)]
    atomic = atomic_across_sessions(store)

    def order(keys: list[tuple[str, int]]) -> list[tuple[str, int]]:
        # On Citus a's and b's shards commit apart: the feed keeps each session's order, not the batch's.
        return keys if atomic else [k for k in keys if k[0] == a] + [k for k in keys if k[0] == b]

    assert order([(e.session, e.seq) for _, e in whole]) == order(expected)
    positions = [p for p, _ in whole]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert all(p > head for p in positions)

    paged = await drain_feed(store, head, {a, b})  # pages of 50 would hide nothing; use tiny pages too
    assert order([(e.session, e.seq) for _, e in paged]) == order(expected)
    position, tiny = head, []
    while page := await store.feed(position, limit=4):
        assert len(page) <= 4
        tiny += [(p, e) for p, e in page if e.session in (a, b)]
        position = page[-1][0]
    assert tiny == whole
    assert await store.feed(position) == []

    only_b = await store.feed(head, session=b)
    assert [e.data["text"] for _, e in only_b] == [f"b{i}" for i in range(6)]
    assert [p for p, _ in only_b] == [p for p, e in whole if e.session == b]


async def test_feed_events_match_read(store, session_id):
    head = await store.head()
    await store.append([started(session_id), *texts(session_id, 3)])
    await settle(store)
    fed = [e for _, e in await store.feed(head) if e.session == session_id]
    assert fed == await store.read(session_id)


async def test_head_follows_the_feed(store, session_id):
    await store.append([started(session_id)])
    await settle(store)
    head = await store.head()
    assert [e for _, e in await store.feed(head) if e.session == session_id] == []
    (e,) = await store.append([text(session_id)])
    await settle(store)
    ((position, fed),) = [(p, x) for p, x in await store.feed(head) if x.session == session_id]
    assert fed == e
    assert position > head
    assert await store.head() > head


def test_feed_position_text_roundtrip():
    assert FeedPosition.parse(str(FeedPosition(812, 44))) == FeedPosition(812, 44)
    assert FeedPosition.parse("44") == FeedPosition(0, 44)
    assert START == FeedPosition(0, 0)
    with pytest.raises(ValueError, match="not a feed position"):
        FeedPosition.parse("x:y")


# -- the visibility gap (PostgreSQL: concurrent transactions commit out of pos order) ---------


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[EventStore]:
    s = await open_store(pg_url)
    try:
        yield s
    finally:
        await s.close()


class FeedReader:
    """A feed consumer that checks the feed contract on every read."""

    def __init__(self, store: EventStore, start: FeedPosition, sessions: set[str]) -> None:
        self.store, self.position, self.sessions = store, start, sessions
        self.seen: list[tuple[FeedPosition, Event]] = []

    async def poll(self) -> list[Event]:
        page = await self.store.feed(self.position)
        for position, _ in page:
            assert position > self.position, "the feed went backwards"
            self.position = position
        new = [(p, e) for p, e in page if e.session in self.sessions]
        self.seen += new
        return [e for _, e in new]


async def test_feed_does_not_pass_an_open_transaction(pg_store, session_id):
    store = pg_store
    held_session, live_session = f"{session_id}-held", f"{session_id}-live"
    reader = FeedReader(store, await store.head(), {held_session, live_session})
    held_events = [started(held_session), text(held_session, "held")]

    conn = await raw_pg(store.url)
    txn = conn.transaction()
    await txn.start()
    try:
        await pg_append_in_txn(conn, held_events)  # inserted, not committed
        live = await store.append([started(live_session)])
        live += await store.append(texts(live_session, 3))
        assert [e.seq for e in await store.read(live_session)] == [1, 2, 3, 4]  # committed and readable
        # a reader must not move past the open transaction: it would never see the held events
        for _ in range(3):
            assert await reader.poll() == []
        await txn.commit()
    except BaseException:
        await txn.rollback()
        raise
    finally:
        await conn.close()

    await settle(store)
    got = await reader.poll()
    assert [(e.session, e.seq) for e in got] == [(held_session, 1), (held_session, 2)] + [
        (live_session, s) for s in (1, 2, 3, 4)
    ]
    assert [e.id for e in got] == [e.id for e in held_events] + [e.id for e in live]


async def test_feed_returns_what_committed_before_the_open_transaction(pg_store, session_id):
    """Only what started after the open transaction waits; older commits flow."""
    store = pg_store
    early_session, held_session = f"{session_id}-early", f"{session_id}-held"
    reader = FeedReader(store, await store.head(), {early_session, held_session})
    early = await store.append([started(early_session), text(early_session)])
    await settle(store)
    conn = await raw_pg(store.url)
    txn = conn.transaction()
    await txn.start()
    try:
        await pg_append_in_txn(conn, [started(held_session)])
        assert [e.id for e in await reader.poll()] == [e.id for e in early]
        await txn.rollback()  # an aborted transaction leaves nothing behind and unblocks the feed
    finally:
        await conn.close()
    (later,) = await store.append([text(early_session, "later")])
    await settle(store)
    assert [e.id for e in await reader.poll()] == [later.id]


async def test_following_from_head_does_not_skip_an_open_transaction(pg_store, session_id):
    """`head()` is where a new follower starts: an event still in flight must land after it."""
    store = pg_store
    held_session, live_session = f"{session_id}-held", f"{session_id}-live"
    conn = await raw_pg(store.url)
    txn = conn.transaction()
    await txn.start()
    try:
        (held,) = await pg_append_in_txn(conn, [started(held_session)])
        await store.append([started(live_session)])
        head = await store.head()
        await txn.commit()
    except BaseException:
        await txn.rollback()
        raise
    finally:
        await conn.close()
    (later,) = await store.append([text(live_session)])
    await settle(store)
    ids = [e.id for _, e in await drain_feed(store, head, {held_session, live_session})]
    assert held.id in ids
    assert later.id in ids


# -- the live subscription ------------------------------------------------------------------


async def collect(store: EventStore, after: FeedPosition, sessions: set[str], out: list[Event], **kw) -> None:
    async for _, event in store.subscribe(after, poll_interval=0.05, **kw):
        if event.session in sessions:
            out.append(event)


async def wait_for(predicate, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def subscribed(store: EventStore, sessions: set[str], **kw) -> AsyncIterator[list[Event]]:
    received: list[Event] = []
    task = asyncio.create_task(collect(store, await store.head(), sessions, received, **kw))
    try:
        yield received
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_subscription_receives_live_appends_in_order(store, session_id):
    a, b = f"{session_id}-a", f"{session_id}-b"
    async with subscribed(store, {a, b}) as received:
        # Two appends: on Citus one append of two sessions on two workers is two transactions side by
        # side, whose order in the feed is not promised.
        appended = await store.append([started(a)]) + await store.append([started(b)])
        await wait_for(lambda: len(received) == 2)
        for i in range(10):
            appended += await store.append([text(a if i % 3 else b, f"m{i}")])
            await asyncio.sleep(0.005)
        await wait_for(lambda: len(received) >= len(appended))
        await asyncio.sleep(0.15)  # nothing more arrives (no duplicates)
    assert [(e.session, e.seq, e.id) for e in received] == [(e.session, e.seq, e.id) for e in appended]


async def test_subscription_filtered_by_session(store, session_id):
    a, b = f"{session_id}-a", f"{session_id}-b"
    async with subscribed(store, {a, b}, session=a) as received:
        await store.append([started(a), started(b), text(b), text(a)])
        await wait_for(lambda: len(received) == 2)
        await asyncio.sleep(0.15)
    assert [(e.session, e.seq) for e in received] == [(a, 1), (a, 2)]


async def test_subscription_from_a_position_replays_then_follows(store, session_id):
    head = await store.head()
    first = await store.append([started(session_id), *texts(session_id, 4)])
    received: list[Event] = []
    task = asyncio.create_task(collect(store, head, {session_id}, received, batch=2))
    try:
        await wait_for(lambda: len(received) == 5)
        later = await store.append(texts(session_id, 3, prefix="later"))
        await wait_for(lambda: len(received) == 8)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [e.id for e in received] == [e.id for e in first + later]


async def test_subscription_survives_lost_connections(pg_store, session_id):
    store = pg_store
    sessions = {f"{session_id}-{k}" for k in range(3)}
    order = sorted(sessions)
    appended: list[Event] = []
    async with subscribed(store, sessions) as received:
        appended += await store.append([started(s) for s in order])
        await wait_for(lambda: len(received) == 3)
        for round_ in range(4):
            killed = await terminate_other_backends(store.url)
            assert killed >= 1  # at least the subscription's listener
            for i in range(5):
                batch = [text(order[(round_ + i) % 3], f"r{round_}.{i}")]
                appended += await retrying(lambda batch=batch: store.append(batch))
            expected = len(appended)
            await wait_for(lambda expected=expected: len(received) >= expected)
        await asyncio.sleep(0.2)
    got, sent = [(e.session, e.seq) for e in received], [(e.session, e.seq) for e in appended]
    if atomic_across_sessions(store):
        assert got == sent
    else:  # Citus commits the first batch one worker at a time: its sessions may come in either order
        assert sorted(got) == sorted(sent) and len(got) == len(sent)
    for s in order:
        assert [e.seq for e in received if e.session == s] == list(range(1, 1 + sum(e.session == s for e in appended)))


async def test_subscription_wakes_on_notify_faster_than_polling(pg_store, session_id):
    """PostgreSQL wakes the follower with NOTIFY: far below a 5 s poll interval."""
    store = pg_store
    received: list[Event] = []
    task = asyncio.create_task(_follow(store, await store.head(), session_id, received))
    try:
        await asyncio.sleep(0.3)  # the follower is now sleeping in its wait
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await store.append([started(session_id)])
        await wait_for(lambda: len(received) == 1, timeout=4)
        assert loop.time() - t0 < 2.0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_follower_stopped_as_a_notify_wakes_it_stops(pg_store):
    """A follower cancelled in the instant a NOTIFY wakes it ends cancelled (``tail`` on SIGTERM hung
    in CI: Python 3.11's ``wait_for`` returned the wake-up and dropped the cancellation, and the
    follower went back to waiting)."""
    waiter = pg_store.change_waiter()
    await waiter.ready()

    async def follow() -> None:
        while True:
            await waiter.wait(30)

    try:
        for ticks in range(4):  # the cancellation lands 0-3 loop steps after the wake-up
            task = asyncio.create_task(follow())
            await asyncio.sleep(0.1)  # waiting now
            waiter._woken.set()  # what a NOTIFY does
            for _ in range(ticks):
                await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=5)
            assert done and task.cancelled(), f"the follower swallowed its cancellation ({ticks} steps after waking)"
    finally:
        await waiter.close()


async def _follow(store: EventStore, after: FeedPosition, session: str, out: list[Event]) -> None:
    async for _, event in store.subscribe(after, session=session, poll_interval=5.0):
        out.append(event)
