"""Writers racing on one session, each through its own store (its own engine and connections)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from eventstore_support import follow_feed, settle, started, text, texts

from calltape.errors import ConcurrencyConflict
from calltape.events import make_event
from calltape.eventstore import EventStore, open_store

WRITERS = 6


@pytest.fixture
async def writers(store: EventStore, store_url: str) -> AsyncIterator[list[EventStore]]:
    """Separate store instances on the same database, so the race happens in the database."""
    others = [await open_store(store_url) for _ in range(WRITERS - 1)]
    try:
        yield [store, *others]
    finally:
        for s in others:
            await s.close()


async def test_expected_seq_race_exactly_one_wins_per_round(writers, session_id):
    store = writers[0]
    await store.append([started(session_id)])
    for round_ in range(5):
        seen = len(await store.read(session_id))  # every writer read the same state

        async def attempt(w: EventStore, i: int, seen: int = seen, round_: int = round_):
            return await w.append(
                [text(session_id, f"r{round_}w{i}a"), text(session_id, f"r{round_}w{i}b")], expected_seq=seen
            )

        results = await asyncio.gather(*(attempt(w, i) for i, w in enumerate(writers)), return_exceptions=True)
        wins = [r for r in results if not isinstance(r, BaseException)]
        losses = [r for r in results if isinstance(r, BaseException)]
        assert len(wins) == 1, results
        assert all(isinstance(e, ConcurrencyConflict) for e in losses), losses
        assert all(e.expected == seen and e.actual == seen + 2 for e in losses)
        assert [e.seq for e in wins[0]] == [seen + 1, seen + 2]
    log = await store.read(session_id)
    assert [e.seq for e in log] == list(range(1, 12))
    # each round's two events come from a single writer
    for r in range(5):
        pair = [e.data["text"] for e in log[1 + 2 * r : 3 + 2 * r]]
        assert pair[0].startswith(f"r{r}w") and pair[0].endswith("a")
        assert pair[1] == pair[0][:-1] + "b"


async def test_racing_without_expected_seq_gives_a_gapless_log(writers, session_id):
    await writers[0].append([started(session_id)])
    batches = {(i, j): texts(session_id, 3, prefix=f"w{i}b{j}.") for i in range(WRITERS) for j in range(5)}

    async def writer(i: int, w: EventStore):
        for j in range(5):
            await w.append(batches[(i, j)])

    await asyncio.gather(*(writer(i, w) for i, w in enumerate(writers)))
    log = await writers[0].read(session_id)
    assert [e.seq for e in log] == list(range(1, 2 + WRITERS * 5 * 3))
    assert len({e.id for e in log}) == len(log)
    assert {e.id for e in log[1:]} == {e.id for b in batches.values() for e in b}
    by_id = {e.id: e.seq for e in log}
    for batch in batches.values():  # a batch is atomic: contiguous seqs, in batch order
        seqs = [by_id[e.id] for e in batch]
        assert seqs == list(range(seqs[0], seqs[0] + 3))
    info = await writers[0].session_info(session_id)
    assert info.last_seq == len(log)


async def test_racing_the_same_batch_writes_it_once(writers, session_id):
    """Retries of one batch from several writers at once (e.g. a lost ack): one copy, same answer for all."""
    await writers[0].append([started(session_id)])
    for round_ in range(3):
        batch = texts(session_id, 4, prefix=f"r{round_}.")
        results = await asyncio.gather(*(w.append(batch) for w in writers))
        assert all(r == results[0] for r in results)
        assert [e.seq for e in results[0]] == [2 + 4 * round_ + k for k in range(4)]
    log = await writers[0].read(session_id)
    assert [e.seq for e in log] == list(range(1, 14))


async def test_racing_batches_across_sessions_do_not_deadlock(writers, session_id):
    sessions = [f"{session_id}-{k}" for k in range(4)]
    await writers[0].append([started(s) for s in sessions])

    async def writer(i: int, w: EventStore):
        order = sessions[i % 4 :] + sessions[: i % 4]  # every writer touches the sessions in another order
        for j in range(4):
            await w.append([make_event(s, "user.text", {"text": f"w{i}.{j}"}) for s in order])

    await asyncio.wait_for(asyncio.gather(*(writer(i, w) for i, w in enumerate(writers))), 30)
    for s in sessions:
        assert [e.seq for e in await writers[0].read(s)] == list(range(1, 2 + WRITERS * 4))


async def test_racing_session_started(writers, session_id):
    """Two agents starting the same call: one session.started wins, the others are rejected."""
    results = await asyncio.gather(
        *(w.append([started(session_id, agent=f"a{i}")]) for i, w in enumerate(writers)), return_exceptions=True
    )
    wins = [r for r in results if not isinstance(r, BaseException)]
    assert len(wins) == 1
    assert len(await writers[0].read(session_id)) == 1


async def test_feed_read_during_concurrent_writers_never_skips(writers, session_id):
    """A reader polling while several writers commit in parallel ends with every event exactly once."""
    store = writers[0]
    sessions = [f"{session_id}-{k}" for k in range(WRITERS)]
    position = await store.head()
    appended: list[str] = []
    done = asyncio.Event()

    async def writer(i: int, w: EventStore):
        for j in range(8):
            out = await w.append([make_event(sessions[i], "user.text", {"text": f"{j}.{k}"}) for k in range(3)])
            appended.extend(e.id for e in out)

    reading = asyncio.create_task(follow_feed(store, position, set(sessions), done, limit=7))
    await asyncio.gather(*(writer(i, w) for i, w in enumerate(writers)))
    await settle(store)
    done.set()
    seen = await asyncio.wait_for(reading, 20)
    assert len(seen) == len(set(seen)) == WRITERS * 8 * 3
    assert set(seen) == set(appended)
