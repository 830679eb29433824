"""Appending: gapless seqs, idempotency, optimistic concurrency, epoch fencing, session summaries.

Every test runs on SQLite and on PostgreSQL (the parametrized ``store`` fixture).
"""

from __future__ import annotations

import pytest
from eventstore_support import skip_unless_atomic_across_sessions, started, text, texts

from calltape.errors import ConcurrencyConflict, FencedWrite, InvalidEvent
from calltape.events import make_event


async def test_seq_is_gapless_per_session_in_append_order(store, session_id):
    first = await store.append([started(session_id), *texts(session_id, 3)])
    assert [e.seq for e in first] == [1, 2, 3, 4]
    second = await store.append(texts(session_id, 2, prefix="u"))
    assert [e.seq for e in second] == [5, 6]
    log = await store.read(session_id)
    assert [e.seq for e in log] == [1, 2, 3, 4, 5, 6]
    assert [e.data.get("text") for e in log[1:]] == ["t0", "t1", "t2", "u0", "u1"]
    assert [e.id for e in log] == [e.id for e in first + second]


async def test_returned_events_are_the_stored_ones(store, session_id):
    given = make_event(session_id, "user.text", {"text": "x"}, at_ms=1_700_000_000_123, epoch=1)
    (stored,) = await store.append([given])
    (read,) = await store.read(session_id)
    assert stored == read
    assert (read.id, read.at_ms, read.epoch, read.data, read.type) == (
        given.id,
        1_700_000_000_123,
        1,
        {"text": "x"},
        "user.text",
    )
    assert given.seq is None  # the caller's object is not mutated


async def test_empty_append(store):
    assert await store.append([]) == []


async def test_batch_spanning_sessions(store, session_id):
    a, b = f"{session_id}-a", f"{session_id}-b"
    out = await store.append([started(a), started(b), text(a, "a1"), text(b, "b1"), text(a, "a2")])
    assert [(e.session, e.seq) for e in out] == [(a, 1), (b, 1), (a, 2), (b, 2), (a, 3)]
    assert [e.data.get("text") for e in await store.read(a)] == [None, "a1", "a2"]
    assert [e.data.get("text") for e in await store.read(b)] == [None, "b1"]


async def test_batch_is_atomic_across_sessions(store, session_id):
    skip_unless_atomic_across_sessions(store)
    a, b = f"{session_id}-a", f"{session_id}-b"
    await store.append([started(b)])
    with pytest.raises(InvalidEvent):
        await store.append([started(a), text(a), started(b)])  # b already started: nothing is written
    assert await store.read(a) == []
    assert await store.session_info(a) is None
    assert len(await store.read(b)) == 1


async def test_idempotent_within_a_batch(store, session_id):
    s = started(session_id)
    t = text(session_id, "once")
    out = await store.append([s, t, t, text(session_id, "next")])
    assert [e.seq for e in out] == [1, 2, 2, 3]
    assert out[1] == out[2]
    assert len(await store.read(session_id)) == 3


async def test_idempotent_against_stored(store, session_id):
    s, t = started(session_id), text(session_id, "original")
    stored = await store.append([s, t])
    retry = make_event(session_id, "user.text", {"text": "different body"}, id=t.id)
    out = await store.append([retry, text(session_id, "new")])
    assert out[0] == stored[1]  # the stored event, not the retried body
    assert out[0].data == {"text": "original"}
    assert out[1].seq == 3
    again = await store.append([s, t])
    assert again == stored
    assert [e.seq for e in await store.read(session_id)] == [1, 2, 3]
    assert (await store.session_info(session_id)).last_seq == 3


async def test_same_id_in_two_sessions_is_two_events(store, session_id):
    a, b = f"{session_id}-a", f"{session_id}-b"
    out = await store.append([make_event(a, "user.text", {"text": "x"}, id="e1")])
    out += await store.append([make_event(b, "user.text", {"text": "y"}, id="e1")])
    assert [(e.session, e.seq) for e in out] == [(a, 1), (b, 1)]


async def test_duplicate_session_started_is_rejected(store, session_id):
    await store.append([started(session_id)])
    with pytest.raises(InvalidEvent, match=f"session '{session_id}' has already started"):
        await store.append([started(session_id, agent="other")])
    with pytest.raises(InvalidEvent, match="already started"):
        await store.append([started(f"{session_id}-2"), started(f"{session_id}-2")])
    assert len(await store.read(session_id)) == 1
    assert await store.read(f"{session_id}-2") == []


async def test_replayed_session_started_is_idempotent(store, session_id):
    s = started(session_id)
    (first,) = await store.append([s])
    assert await store.append([s]) == [first]


async def test_expected_seq(store, session_id):
    await store.append([started(session_id)], expected_seq=0)
    await store.append([text(session_id)], expected_seq=1)
    with pytest.raises(ConcurrencyConflict) as info:
        await store.append([text(session_id, "late")], expected_seq=1)
    assert (info.value.expected, info.value.actual) == (1, 2)
    assert str(info.value) == f"session '{session_id}' is at seq 2, not 1: another writer appended first"
    with pytest.raises(ConcurrencyConflict):
        await store.append([text(f"{session_id}-new")], expected_seq=3)
    assert [e.seq for e in await store.read(session_id)] == [1, 2]


async def test_expected_seq_on_an_idempotent_retry_returns_the_stored_events(store, session_id):
    batch = [started(session_id), text(session_id)]
    first = await store.append(batch, expected_seq=0)
    assert await store.append(batch, expected_seq=0) == first  # retry after a lost ack: no conflict


async def test_expected_seq_needs_one_session(store, session_id):
    with pytest.raises(InvalidEvent, match="one session"):
        await store.append([text(f"{session_id}-a"), text(f"{session_id}-b")], expected_seq=0)


async def test_epoch_fencing(store, session_id):
    await store.append([started(session_id, agent="a"), text(session_id, epoch=1)])
    info = await store.session_info(session_id)
    assert info.epoch == 1
    resumed = make_event(session_id, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 2})
    (r,) = await store.append([resumed])
    assert (r.seq, r.agent) == (3, "b")
    assert (await store.session_info(session_id)).epoch == 2

    with pytest.raises(FencedWrite) as info:
        await store.append([text(session_id, "zombie", epoch=1)])
    assert (info.value.epoch, info.value.current) == (1, 2)
    assert str(info.value) == f"session '{session_id}' is at epoch 2; a write with epoch 1 was rejected"
    # a fenced event in a batch rejects the whole batch
    with pytest.raises(FencedWrite):
        await store.append([text(session_id, "ok", epoch=2), text(session_id, "zombie", epoch=1)])
    # the current epoch, a newer one and no epoch at all are accepted
    out = await store.append([text(session_id, "x", epoch=2), text(session_id, "y"), text(session_id, "z", epoch=3)])
    assert [e.seq for e in out] == [4, 5, 6]
    assert [e.data["text"] for e in await store.read(session_id, after_seq=3)] == ["x", "y", "z"]


async def test_resumed_must_raise_the_epoch_by_one(store, session_id):
    await store.append([started(session_id)])
    with pytest.raises(FencedWrite):
        await store.append([make_event(session_id, "session.resumed", {"agent": "b", "epoch": 1, "from_seq": 1})])
    with pytest.raises(InvalidEvent, match="by one"):
        await store.append([make_event(session_id, "session.resumed", {"agent": "b", "epoch": 3, "from_seq": 1})])
    await store.append([make_event(session_id, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 1})])
    # two resumes racing from the same epoch: the second one is fenced
    with pytest.raises(FencedWrite):
        await store.append([make_event(session_id, "session.resumed", {"agent": "c", "epoch": 2, "from_seq": 1})])
    await store.append([make_event(session_id, "session.resumed", {"agent": "c", "epoch": 3, "from_seq": 2})])
    info = await store.session_info(session_id)
    assert (info.epoch, info.agent, info.last_seq) == (3, "c", 3)


async def test_default_agent_comes_from_the_session(store, session_id):
    await store.append([started(session_id, agent="triage")])
    out = await store.append(
        [
            text(session_id, "a"),
            make_event(session_id, "user.text", {"text": "b"}, agent="explicit"),
            make_event(session_id, "agent.handoff", {"from": "triage", "to": "billing"}),
            text(session_id, "c"),
        ]
    )
    assert [e.agent for e in out] == ["triage", "explicit", "triage", "billing"]
    assert [e.agent for e in await store.read(session_id)] == ["triage", "triage", "explicit", "triage", "billing"]
    (later,) = await store.append([text(session_id, "d")])  # the handoff survives across appends
    assert later.agent == "billing"
    assert (await store.session_info(session_id)).agent == "billing"
    await store.append([make_event(session_id, "session.resumed", {"agent": "closer", "epoch": 2, "from_seq": 6})])
    (after_resume,) = await store.append([text(session_id, "e")])
    assert after_resume.agent == "closer"


async def test_session_summary(operator_store, session_id):
    store = operator_store  # a session of tenant acme: the operator's store, for every tenant
    assert await store.session_info(session_id) is None
    await store.append(
        [
            make_event(
                session_id,
                "session.started",
                {"agent": "a", "tenant": "acme", "modality": "text", "framework": "pipecat"},
                at_ms=1_000,
            ),
            make_event(session_id, "user.text", {"text": "x"}, at_ms=5_000),
            make_event(session_id, "user.text", {"text": "y"}, at_ms=3_000),  # late timestamp: last_at stays 5000
        ]
    )
    info = await store.session_info(session_id)
    assert (info.session, info.agent, info.tenant, info.modality, info.framework) == (
        session_id,
        "a",
        "acme",
        "text",
        "pipecat",
    )
    assert (info.status, info.epoch, info.last_seq, info.first_at_ms, info.last_at_ms, info.started) == (
        "active",
        1,
        3,
        1_000,
        5_000,
        True,
    )
    await store.append([make_event(session_id, "session.dropped", {"reason": "ws"}, at_ms=6_000)])
    assert (await store.session_info(session_id)).status == "dropped"
    await store.append(
        [make_event(session_id, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 4}, at_ms=7_000)]
    )
    info = await store.session_info(session_id)
    assert (info.status, info.epoch, info.agent, info.last_seq, info.last_at_ms) == ("active", 2, "b", 5, 7_000)
    await store.append([make_event(session_id, "session.ended", {}, at_ms=8_000)])
    info = await store.session_info(session_id)
    assert (info.status, info.last_seq, info.first_at_ms, info.last_at_ms, info.tenant) == (
        "ended",
        6,
        1_000,
        8_000,
        "acme",
    )


async def test_summary_untouched_by_a_rejected_append(store, session_id):
    await store.append([started(session_id), text(session_id, epoch=1)])
    await store.append([make_event(session_id, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 2})])
    before = await store.session_info(session_id)
    with pytest.raises(FencedWrite):
        await store.append([make_event(session_id, "session.ended", {}, epoch=1)])
    assert await store.session_info(session_id) == before


async def test_events_before_session_started_get_no_agent(store, session_id):
    (e,) = await store.append([text(session_id)])
    assert (e.seq, e.agent) == (1, None)
    info = await store.session_info(session_id)
    assert (info.started, info.last_seq, info.epoch) == (False, 1, 1)


async def test_read_ranges(store, session_id):
    await store.append([started(session_id), *texts(session_id, 9)])
    assert [e.seq for e in await store.read(session_id, after_seq=3)] == [4, 5, 6, 7, 8, 9, 10]
    assert [e.seq for e in await store.read(session_id, to_seq=3)] == [1, 2, 3]
    assert [e.seq for e in await store.read(session_id, after_seq=2, to_seq=5)] == [3, 4, 5]
    assert [e.seq for e in await store.read(session_id, after_seq=2, limit=2)] == [3, 4]
    assert await store.read(session_id, after_seq=10) == []
    assert await store.read("no-such-session") == []
