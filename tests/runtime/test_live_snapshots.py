"""Live snapshots (issue 32 item 4): a live call saves snapshots as it runs, so the first resume after a
drop reads the tail, not the call; on SQLite and PostgreSQL.

Every snapshot found is checked against the log: restored and fed nothing, it encodes to the same bytes
as the fold of the log up to its seq, and that seq is a clean point.
"""

from __future__ import annotations

from typing import Any

import pytest
from runtime_support import Live, live_call, reply
from sqlalchemy import text

from calltape.events import Event
from calltape.eventstore import EventStore, open_store
from calltape.projections import FOLD_VERSION, SnapshotPolicy, build_context, fold_events, segments
from calltape.runtime import CallSession, resume
from calltape.runtime import handoff as outside_handoff
from calltape.runtime.livesnap import LiveSnapshots

EVERY = 40


def turn(call: CallSession, k: int) -> None:
    """One spoken turn: the user's words, a reply generated and heard (8 events, clean at its end)."""
    call.emit("user.speech.started", {})
    call.emit("user.transcript", {"text": f"request {k}", "final": True})
    call.emit("user.speech.stopped", {})
    reply(call, f"r{k}", f"answer {k}")
    call.emit("agent.speech.started", {"reply": f"r{k}"})
    call.emit("agent.speech.ended", {"reply": f"r{k}", "interrupted": False})


def snapshots_of(live: Live) -> LiveSnapshots:
    snaps = live.call.snapshots
    assert snaps is not None
    snaps.every = EVERY
    return snaps


async def run_turns(live: Live, ks: range, *, durable: bool = False) -> None:
    """Turns ``ks``; ``durable``: each committed before the next (the writer moves on every turn)."""
    for k in ks:
        turn(live.call, k)
        if durable:
            await live.call.emit_durable("x.turn", {"k": k})
    await live.recorder.flush()


async def log_seq(store: EventStore, session: str) -> int:
    info = await store.session_info(session)
    assert info is not None
    return int(info.last_seq)


def count_reads(store: EventStore) -> list[int]:
    """Counts the events every ``store.read`` returns from now on (one entry per read)."""
    got: list[int] = []
    inner = store.read

    async def read(session: str, **kw: Any) -> list[Event]:
        events = await inner(session, **kw)
        got.append(len(events))
        return events

    store.read = read  # type: ignore[method-assign]
    return got


async def snapshot_rows(store: EventStore, session: str) -> int:
    engine = store.engine  # type: ignore[attr-defined]
    async with engine.connect() as conn:
        result = await conn.execute(text("SELECT count(*) FROM ct_snapshots WHERE session = :s"), {"s": session})
        return int(result.scalar_one())


async def assert_snapshots_match_log(store: EventStore, session: str) -> list[int]:
    """Every snapshot header of the session restores to the log's fold at its seq (a clean one); their seqs."""
    log = await store.read(session)
    seqs: list[int] = []
    bound: int | None = None
    while True:
        loaded = await store.load_snapshot(session, FOLD_VERSION, max_seq=bound)
        if loaded is None:
            return seqs
        seq, blob = loaded
        segments.CACHE.clear()  # from the store, not from what this process cached
        restored = await segments.restore(store, session, blob)
        full = fold_events([e for e in log if (e.seq or 0) <= seq], session)
        assert full.clean and full.last_clean_seq == seq
        assert restored.seq == seq and restored.to_snapshot() == full.to_snapshot()
        seqs.append(seq)
        bound = seq - 1


async def test_a_live_call_saves_snapshots_without_any_read(store: EventStore, session_id: str) -> None:
    reads = count_reads(store)
    async with live_call(store, session_id) as live:
        snaps = snapshots_of(live)
        await run_turns(live, range(30), durable=True)  # 271 events
        await snaps.settled()
        saved = snaps.saved
    assert reads == []  # nothing read the session: the call saved them as it ran
    assert saved >= 4
    seqs = await assert_snapshots_match_log(store, session_id)
    assert len(seqs) == saved and seqs[0] > 271 - EVERY - 9


async def test_the_first_resume_after_a_long_live_call_reads_only_the_tail(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        snaps = snapshots_of(live)
        for k in range(60):
            turn(live.call, k)
        await live.call.drop("transport lost")
        await snaps.settled()
    info = await store.session_info(session_id)
    assert info is not None and info.last_seq == 60 * 8 + 2
    segments.CACHE.clear()  # a new process
    reads = count_reads(store)
    plan = await resume(store, session_id, "rescue")
    assert 0 < sum(reads) <= EVERY + 2 * 8  # the tail after the newest snapshot, not the 482 events
    whole = fold_events(await store.read(session_id), session_id)
    assert plan.context == whole.native()


async def test_snapshots_can_be_turned_off(store: EventStore, session_id: str) -> None:
    from calltape.eventstore.recorder import Recorder

    recorder = await Recorder(store).start()
    try:
        call = await CallSession.start(recorder, session_id, agent="a", snapshots=None)
        assert call.snapshots is None
        for k in range(300):
            turn(call, k)
        await recorder.flush()
    finally:
        await recorder.close()
    assert await snapshot_rows(store, session_id) == 0


async def test_an_erased_session_gets_no_snapshot_afterwards(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        snaps = snapshots_of(live)
        await run_turns(live, range(10))  # a save is due now, and under way
        await store.erase(session_id)  # races it
        await snaps.settled()
        await run_turns(live, range(10, 30))  # refused by the store from now on
        await snaps.settled()
    assert await snapshot_rows(store, session_id) == 0
    assert await store.load_snapshot(session_id, FOLD_VERSION) is None


async def test_another_writer_in_between_rebuilds_the_shadow_from_the_store(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        snaps = snapshots_of(live)
        await run_turns(live, range(8))
        await outside_handoff(store, session_id, "billing")  # appended by another process
        handed = (await log_seq(store, session_id)) - 1
        await run_turns(live, range(8, 30), durable=True)
        await snaps.settled()
    seqs = await assert_snapshots_match_log(store, session_id)
    assert seqs[0] > handed  # saved past the other writer's events, from a shadow fold rebuilt from the store


async def test_a_fenced_writer_saves_only_what_it_committed(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        snaps = snapshots_of(live)
        await run_turns(live, range(8))
        await resume(store, session_id, "rescue")  # elsewhere: this writer is a zombie now
        await run_turns(live, range(8, 30))  # refused (fenced)
        await snaps.settled()
    seqs = await assert_snapshots_match_log(store, session_id)
    assert seqs  # the ones from before the resume (and the resume's own), all true to the log
    context = await build_context(store, session_id, snapshots=None)
    assert context.agent == "rescue"


@pytest.mark.parametrize("every", [1, 7])
async def test_snapshot_plus_tail_is_the_full_fold(store: EventStore, session_id: str, every: int) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        call.snapshots = None
        assert call.snapshots is None
        call.snapshots = LiveSnapshots(live.recorder, session_id, SnapshotPolicy(every=every), base=call.fold.seq)
        call.emit("user.transcript", {"text": "hi", "final": True})
        reply(call, "r0", "hello", ("c1", "lookup", {"q": 1}))
        call.emit("tool.started", {"call": "c1"})
        call.emit("tool.result", {"call": "c1", "output": {"ok": True}})
        call.emit("agent.speech.started", {"reply": "r0"})
        call.emit("agent.speech.ended", {"reply": "r0", "interrupted": False})
        for k in range(1, 6):
            turn(call, k)
        await live.recorder.flush()
        await call.snapshots.settled()
    seqs = await assert_snapshots_match_log(store, session_id)
    assert seqs
    segments.CACHE.clear()
    rebuilt = await build_context(store, session_id, snapshots=None)
    assert rebuilt.to_snapshot() == fold_events(await store.read(session_id), session_id).to_snapshot()


async def test_live_snapshots_hold_what_redaction_wrote_not_what_the_caller_said(
    store_url: str, session_id: str
) -> None:
    """The live context keeps the caller's card number (a payment tool may need it); the snapshots are
    of the log, so they hold the redacted text, like every context rebuilt from it."""
    from calltape.eventstore import open_store
    from calltape.redaction import Redactor

    store = await open_store(store_url, redactor=Redactor(hold_ms=0))
    try:
        async with live_call(store, session_id) as live:
            snaps = snapshots_of(live)
            for k in range(12):
                turn(live.call, k)
                live.call.emit("user.transcript", {"text": "my card is 4111 1111 1111 1111", "final": True})
                reply(live.call, f"c{k}", "thanks")
                live.call.emit("agent.speech.started", {"reply": f"c{k}"})
                live.call.emit("agent.speech.ended", {"reply": f"c{k}", "interrupted": False})
            await live.call.emit_durable("x.turn", {})
            await snaps.settled()
            assert "4111 1111 1111 1111" in str(live.call.context())
            assert snaps.saved >= 1
        engine = store.engine  # type: ignore[attr-defined]
        async with engine.connect() as conn:
            rows = await conn.execute(text("SELECT state FROM ct_snapshots WHERE session = :s"), {"s": session_id})
            states = [bytes(r[0]) for r in rows]
        assert states and not any(b"4111" in s for s in states)
    finally:
        await store.close()


async def test_on_sqlite_a_live_save_runs_on_the_writer_thread_between_appends(tmp_path: Any, session_id: str) -> None:
    # Through the engine, the save's transaction held the write lock across hops of the event loop and
    # the call's next append slept in SQLite's busy handler (issue 32): it is one job of the writer now.
    store = await open_store(f"sqlite:///{tmp_path}/calltape.db")
    try:
        statements: list[str] = []
        await store._writer.run(lambda conn: conn.set_trace_callback(statements.append))  # type: ignore[attr-defined]
        async with live_call(store, session_id) as live:
            snaps = snapshots_of(live)
            await run_turns(live, range(12), durable=True)
            await snaps.settled()
            saved = snaps.saved
        assert saved >= 1
        assert any("ct_snapshots" in s and s.lstrip().upper().startswith("INSERT") for s in statements)
        seqs = await assert_snapshots_match_log(store, session_id)
        assert len(seqs) == saved
    finally:
        await store.close()
