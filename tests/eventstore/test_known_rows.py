"""PostgreSQL's one-statement append for a writer's own sessions (on Citus, a few statements in one
transaction): planned against the session rows its last append left, written only where those rows
still hold. Every way the rows can move behind the writer's back must be caught and decided again under
the locks, never written on stale rows."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from eventstore_support import insert_raw_event, started, text, texts

from calltape.errors import FencedWrite, SessionErased
from calltape.events import make_event
from calltape.eventstore import EventStore, open_store
from calltape.eventstore.citus import CitusWriter
from calltape.eventstore.postgres import COPY_FROM, PgWriter


@pytest.fixture
async def pair(pg_url: str) -> AsyncIterator[tuple[EventStore, EventStore]]:
    a, b = await open_store(pg_url), await open_store(pg_url)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


@pytest.fixture
def locks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many appends took the session locks (the path the known rows spare)."""
    taken: list[int] = []
    for writer in (PgWriter, CitusWriter):  # (Citus locks its rows its own way)
        original = writer.__dict__["lock_sessions"]

        async def counting(self: PgWriter, sessions, original=original):  # type: ignore[no-untyped-def]
            taken.append(len(sessions))
            return await original(self, sessions)

        monkeypatch.setattr(writer, "lock_sessions", counting)
    return taken


async def test_a_writers_next_appends_take_no_lock(pair, session_id, locks):
    a, _ = pair
    await a.append([started(session_id)])
    assert len(locks) == 1  # a session this store never wrote: locked and read
    for i in range(3):
        out = await a.append([text(session_id, f"t{i}")])
        assert out[0].seq == 2 + i
    big = await a.append(texts(session_id, COPY_FROM + 5))  # the COPY variant
    assert [e.seq for e in big] == list(range(5, 5 + COPY_FROM + 5))
    assert len(locks) == 1
    info = await a.session_info(session_id)
    assert info is not None and info.last_seq == 4 + COPY_FROM + 5
    assert [e.seq for e in await a.read(session_id)] == list(range(1, 5 + COPY_FROM + 5))


async def test_two_writers_taking_turns_stay_gapless(pair, session_id, locks):
    a, b = pair
    await a.append([started(session_id)])
    for i in range(4):
        (x,) = await a.append([text(session_id, f"a{i}")])
        (y,) = await b.append([text(session_id, f"b{i}")])
        assert y.seq == x.seq + 1
    log = await a.read(session_id)
    assert [e.seq for e in log] == list(range(1, 10))
    assert [e.data["text"] for e in log[1:]] == [f"{w}{i}" for i in range(4) for w in "ab"]
    assert len(locks) > 2  # each saw the other's writes: its rows were stale, so it locked


async def test_a_resume_elsewhere_fences_a_writer_with_old_rows(pair, session_id):
    a, b = pair
    await a.append([started(session_id, agent="one"), text(session_id, epoch=1)])
    await a.append([text(session_id, "still one", epoch=1)])  # a now knows the row at epoch 1
    await b.append([make_event(session_id, "session.resumed", {"agent": "two", "epoch": 2, "from_seq": 3})])
    with pytest.raises(FencedWrite):
        await a.append([text(session_id, "zombie", epoch=1)])
    assert [e.type for e in await a.read(session_id)][-1] == "session.resumed"


async def test_a_stored_id_sent_again_is_not_written_twice(pair, session_id):
    a, _ = pair
    first = text(session_id, "once")
    await a.append([started(session_id), first])
    (again,) = await a.append([first])
    assert again.seq == 2
    (after,) = await a.append([text(session_id, "next")])
    assert after.seq == 3
    assert len(await a.read(session_id)) == 3


async def test_an_erased_session_is_refused_to_a_writer_that_knew_it(pair, session_id):
    a, b = pair
    await a.append([started(session_id), text(session_id)])
    await b.erase(session_id)
    with pytest.raises(SessionErased):
        await a.append([text(session_id, "after the erasure")])


async def test_a_row_written_behind_the_store_is_seen(pair, session_id):
    a, _ = pair
    await a.append([started(session_id), text(session_id)])
    await insert_raw_event(a, session_id, 3, "agent.emotion", {"mood": "calm"})
    (after,) = await a.append([text(session_id, "after")])
    assert after.seq == 4


async def test_a_row_that_moved_without_a_clashing_seq_is_still_caught(pair, session_id):
    # The (session, seq) constraint alone would not see this one: a newer writer's row at seq 4 leaves
    # seq 3 free, so only the statement's check of the row itself keeps the log gapless.
    a, _ = pair
    await a.append([started(session_id), text(session_id)])
    await insert_raw_event(a, session_id, 4, "agent.emotion", {"mood": "calm"})
    (after,) = await a.append([text(session_id, "after")])
    assert after.seq == 5
    assert [e.seq for e in await a.read(session_id)] == [1, 2, 4, 5]
