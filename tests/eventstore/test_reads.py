"""Reads beyond a session's events: the session list, time lookups, snapshots, rows from a newer version."""

from __future__ import annotations

from eventstore_support import insert_raw_event, settle, skip_unless_atomic_across_sessions, started, text

from calltape.events import make_event


def at(session: str, ms: int, value: str = "x"):
    return make_event(session, "user.text", {"text": value}, at_ms=ms)


async def test_seq_at_time(store, session_id):
    await store.append(
        [
            make_event(session_id, "session.started", {"agent": "a"}, at_ms=1_000),
            at(session_id, 2_000),
            at(session_id, 2_000),
            at(session_id, 3_000),
        ]
    )
    assert await store.seq_at_time(session_id, 999) == 0
    assert await store.seq_at_time(session_id, 1_000) == 1
    assert await store.seq_at_time(session_id, 1_999) == 1
    assert await store.seq_at_time(session_id, 2_000) == 3
    assert await store.seq_at_time(session_id, 2_500) == 3
    assert await store.seq_at_time(session_id, 3_000) == 4
    assert await store.seq_at_time(session_id, 10**13) == 4
    assert await store.seq_at_time("no-such-session", 10**13) == 0


async def test_seq_at_time_is_the_longest_prefix_when_times_go_backwards(store, session_id):
    await store.append([at(session_id, 1_000), at(session_id, 3_000), at(session_id, 2_000), at(session_id, 4_000)])
    assert await store.seq_at_time(session_id, 2_500) == 1  # seq 3 (2000) is behind seq 2 (3000)
    assert await store.seq_at_time(session_id, 3_000) == 3
    assert await store.seq_at_time(session_id, 4_000) == 4


async def test_sessions_filters_and_order(operator_store, session_id):
    store = operator_store  # sessions of several tenants: the operator's store, for every tenant
    p = session_id
    acme, globex = f"acme-{p}", f"globex-{p}"  # the PostgreSQL database is shared by the whole run
    await store.append(
        [
            make_event(f"{p}-1", "session.started", {"agent": "triage", "tenant": acme}, at_ms=10_000),
            make_event(f"{p}-2", "session.started", {"agent": "billing", "tenant": acme}, at_ms=20_000),
            make_event(f"{p}-3", "session.started", {"agent": "triage", "tenant": globex}, at_ms=30_000),
            at(f"{p}-1", 15_000),
            at(f"{p}-1", 16_000),
            at(f"{p}-3", 40_000),
            make_event(f"{p}-2", "session.ended", {}, at_ms=25_000),
        ]
    )
    ours = {f"{p}-1", f"{p}-2", f"{p}-3"}

    async def names(**kw) -> list[str]:
        return [i.session for i in await store.sessions(**kw) if i.session in ours]

    assert await names() == [f"{p}-3", f"{p}-2", f"{p}-1"]  # default: last activity, newest first
    assert await names(descending=False) == [f"{p}-1", f"{p}-2", f"{p}-3"]
    assert await names(order="first_at", descending=False) == [f"{p}-1", f"{p}-2", f"{p}-3"]
    assert await names(order="session", descending=True) == [f"{p}-3", f"{p}-2", f"{p}-1"]
    assert await names(order="events") == [f"{p}-1", f"{p}-2", f"{p}-3"]  # 3, 2, 2 events: ties by name
    assert await names(agent="triage", descending=False) == [f"{p}-1", f"{p}-3"]
    assert await names(tenant=acme, descending=False) == [f"{p}-1", f"{p}-2"]
    assert await names(status="ended") == [f"{p}-2"]
    assert await names(status="active", tenant=globex) == [f"{p}-3"]
    assert await names(since_ms=20_000, descending=False) == [f"{p}-2", f"{p}-3"]  # active at or after
    assert await names(until_ms=15_000, descending=False) == [f"{p}-1"]  # started at or before
    assert await names(since_ms=16_000, until_ms=25_000, descending=False) == [f"{p}-1", f"{p}-2"]
    assert await names(agent="nobody") == []
    limited = await store.sessions(tenant=acme, order="first_at", descending=False, limit=1)
    assert [i.session for i in limited] == [f"{p}-1"]
    (one,) = [i for i in await store.sessions() if i.session == f"{p}-1"]
    assert (one.agent, one.tenant, one.status, one.last_seq, one.first_at_ms, one.last_at_ms) == (
        "triage",
        acme,
        "active",
        3,
        10_000,
        16_000,
    )


async def test_failed_append_leaves_no_session_behind(store, session_id):
    skip_unless_atomic_across_sessions(store)
    await store.append([started(session_id)])
    try:
        await store.append([text(f"{session_id}-ghost"), started(session_id)])
    except Exception:
        pass
    assert f"{session_id}-ghost" not in {i.session for i in await store.sessions()}


async def test_snapshots(store, session_id):
    await store.append([started(session_id), started(f"{session_id}-other")])  # snapshots of stored sessions
    assert await store.load_snapshot(session_id, 1) is None
    await store.save_snapshot(session_id, 3, 1, b"v1@3")
    await store.save_snapshot(session_id, 7, 1, b"v1@7")
    await store.save_snapshot(session_id, 5, 2, b"v2@5")
    await store.save_snapshot(f"{session_id}-other", 9, 1, b"other")
    assert await store.load_snapshot(session_id, 1) == (7, b"v1@7")
    assert await store.load_snapshot(session_id, 1, max_seq=7) == (7, b"v1@7")
    assert await store.load_snapshot(session_id, 1, max_seq=6) == (3, b"v1@3")
    assert await store.load_snapshot(session_id, 1, max_seq=2) is None
    assert await store.load_snapshot(session_id, 2) == (5, b"v2@5")
    assert await store.load_snapshot(session_id, 2, max_seq=4) is None
    assert await store.load_snapshot(session_id, 3) is None
    await store.save_snapshot(session_id, 7, 1, b"v1@7")  # saving the same snapshot again is harmless
    assert await store.load_snapshot(session_id, 1) == (7, b"v1@7")
    blob = bytes(range(256)) * 40
    await store.save_snapshot(session_id, 8, 1, blob)
    assert await store.load_snapshot(session_id, 1) == (8, blob)


async def test_snapshot_segments(store, session_id):
    """Segments are snapshot rows at negative seqs: never the newest snapshot, written once, read together."""
    await store.append([started(session_id), started(f"{session_id}-other")])
    assert await store.load_snapshot_segments(session_id, 3) == []
    await store.save_snapshot_segments(session_id, 3, [(-5, b"five"), (-9, b"nine")])
    await store.save_snapshot_segments(session_id, 3, [(-5, b"changed"), (-2, b"two")])  # -5 stays as it was
    await store.save_snapshot_segments(session_id, 4, [(-5, b"v4")])
    await store.save_snapshot_segments(f"{session_id}-other", 3, [(-7, b"other")])
    await store.save_snapshot(session_id, 4, 3, b"header")
    assert sorted(await store.load_snapshot_segments(session_id, 3)) == [(-9, b"nine"), (-5, b"five"), (-2, b"two")]
    assert await store.load_snapshot_segments(session_id, 4) == [(-5, b"v4")]
    assert await store.load_snapshot(session_id, 3) == (4, b"header")
    assert await store.load_snapshot(session_id, 3, max_seq=3) is None  # a segment is never a snapshot
    await store.save_snapshot_segments(session_id, 3, [])


async def test_unknown_type_from_a_newer_version_reads_back(store, session_id):
    await store.append([started(session_id), text(session_id, "before")])
    await settle(store)  # else an older transaction elsewhere in the cluster holds the head before them
    head = await store.head()
    await insert_raw_event(store, session_id, 3, "agent.emotion", {"mood": "calm", "score": 0.5})
    (after,) = await store.append([text(session_id, "after")])
    assert after.seq == 4
    await settle(store)

    log = await store.read(session_id)
    assert [e.type for e in log] == ["session.started", "user.text", "agent.emotion", "user.text"]
    assert (log[2].data, log[2].seq, log[2].id) == ({"mood": "calm", "score": 0.5}, 3, "raw-3")

    fed = [e for _, e in await store.feed(head) if e.session == session_id]
    assert [e.type for e in fed] == ["agent.emotion", "user.text"]
    assert (await store.session_info(session_id)).last_seq == 4
