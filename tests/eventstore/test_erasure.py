"""Erasure and retention (SPEC section 6), on SQLite and PostgreSQL: a session erased in one transaction,
a tombstone without content, and nothing that can bring it back (an append, a recorder, a re-import)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from eventstore_support import at_revision, atomic_across_sessions, started, text, texts

from calltape.errors import SessionErased, SessionNotFound
from calltape.events import make_event
from calltape.eventstore import EventStore, open_store
from calltape.eventstore.bulk import ImportRefused, bulk_import
from calltape.eventstore.recorder import Recorder
from calltape.eventstore.retention import prune
from calltape.migrations import head_revision
from calltape.projections import FOLD_VERSION, snapshot_now


async def test_erase_removes_everything_and_leaves_a_tombstone(store: EventStore, session_id: str) -> None:
    other = f"{session_id}-kept"
    await store.append([started(session_id), text(session_id, "my card is 4242"), started(other)])
    await snapshot_now(store, session_id)
    assert await store.erase(session_id) == 2
    assert await store.read(session_id) == []
    assert await store.session_info(session_id) is None
    assert await store.load_snapshot(session_id, FOLD_VERSION) is None
    assert not await store.load_snapshot_segments(session_id, FOLD_VERSION)
    tomb = await store.tombstone(session_id)
    assert tomb is not None and tomb.events == 2 and tomb.session == session_id
    assert [e.type for e in await store.read(other)] == ["session.started"]  # the others are untouched
    assert await store.erase(session_id) == 0  # erasing again: nothing left, no error
    with pytest.raises(SessionNotFound):
        await store.erase(f"{session_id}-never")


async def test_an_erased_session_cannot_come_back(store: EventStore, session_id: str) -> None:
    await store.append([started(session_id)])
    await store.erase(session_id)
    with pytest.raises(SessionErased) as info:
        await store.append([started(session_id)])
    assert "erased" in str(info.value)
    assert await store.read(session_id) == []
    if not atomic_across_sessions(store):
        return
    neighbour = f"{session_id}-n"
    with pytest.raises(SessionErased):  # a batch touching an erased session writes nothing at all
        await store.append([started(neighbour), text(session_id, "late webhook")])
    assert await store.session_info(neighbour) is None
    assert await store.read(session_id) == []


async def test_a_reimport_or_a_replayed_spill_file_cannot_bring_it_back(store: EventStore, session_id: str) -> None:
    """An old export or a spill file (both JSONL, replayed by ``calltape import``) of an erased session."""
    old = await store.append([started(session_id), text(session_id, "my card is 4242")])
    await store.erase(session_id)
    with pytest.raises((SessionErased, ImportRefused)) as info:
        async with bulk_import(store) as replay:
            await replay.add(old)
    assert "erased" in str(info.value)
    assert await store.read(session_id) == [] and await store.session_info(session_id) is None


async def test_the_recorder_sends_an_erased_sessions_events_to_on_rejected(store: EventStore, session_id: str) -> None:
    await store.append([started(session_id)])
    await store.erase(session_id)
    rejected: list[tuple[str, Exception]] = []
    live = f"{session_id}-live"
    rec = await Recorder(store, on_rejected=lambda evs, err: rejected.extend((e.session, err) for e in evs)).start()
    try:
        rec.emit(text(session_id, "zombie"))
        rec.emit(started(live))
        await asyncio.wait_for(rec.flush(), 10)
    finally:
        await rec.close()
    assert [s for s, _ in rejected] == [session_id] and isinstance(rejected[0][1], SessionErased)
    assert await store.read(session_id) == []
    assert [e.type for e in await store.read(live)] == ["session.started"]


async def test_prune_by_age_and_status(store: EventStore, session_id: str) -> None:
    # Other tests share the PostgreSQL database: these sessions are older than anything they write.
    ancient = -(10**12)
    old, old_active, new = f"{session_id}-old", f"{session_id}-old-active", f"{session_id}-new"
    await store.append(
        [
            make_event(old, "session.started", {"agent": "a"}, at_ms=ancient),
            make_event(old, "session.ended", {}, at_ms=ancient + 1_000),
            make_event(old_active, "session.started", {"agent": "a"}, at_ms=ancient),
            make_event(new, "session.started", {"agent": "a"}, at_ms=ancient + 50_000),
        ]
    )
    cutoff = ancient + 10_000
    dry = await prune(store, before_ms=cutoff, status="ended", dry_run=True)
    assert (dry.sessions, dry.events, dry.dry_run) == (1, 2, True)
    assert await store.session_info(old) is not None  # a dry run removes nothing
    done = await prune(store, before_ms=cutoff, status="ended")
    assert (done.sessions, done.events) == (1, 2)
    assert await store.session_info(old) is None and await store.tombstone(old) is not None
    assert await store.session_info(old_active) is not None  # not ended: kept by --status ended
    everything = await prune(store, before_ms=cutoff)
    assert everything.sessions == 1 and await store.session_info(new) is not None


async def test_erase_in_steps_removes_everything_and_counts_every_event(store: EventStore, session_id: str) -> None:
    """Retention's erasure (on SQLite in transactions of at most ``step`` events): nothing stays, the
    tombstone counts every event, and a late write is refused as after any erasure."""
    await store.append([started(session_id), *texts(session_id, 1232)])
    await snapshot_now(store, session_id)
    assert await store.erase_in_steps(session_id, 500) == 1233
    assert await store.read(session_id) == [] and await store.session_info(session_id) is None
    assert await store.load_snapshot(session_id, FOLD_VERSION) is None
    assert not await store.load_snapshot_segments(session_id, FOLD_VERSION)
    assert (await store.tombstone(session_id)).events == 1233  # type: ignore[union-attr]
    with pytest.raises(SessionErased):
        await store.append([text(session_id, "late")])
    assert await store.erase_in_steps(session_id, 500) == 0
    with pytest.raises(SessionNotFound):
        await store.erase_in_steps(f"{session_id}-never", 500)


async def test_an_sqlite_erasure_in_steps_commits_step_by_step(tmp_path: Path, session_id: str) -> None:
    """SQLite has one write lock: a long call erased by retention is deleted in transactions of at most
    ``step`` events (another connection sees it partly done, a prefix of the call), not in one."""
    path = tmp_path / "calls.db"
    async with await open_store(f"sqlite:///{path}") as pruner:
        await pruner.append([started(session_id), *texts(session_id, 19_999)])
        erasing = asyncio.create_task(pruner.erase_in_steps(session_id, 500))
        seen: set[tuple[int, int]] = set()
        with contextlib.closing(sqlite3.connect(path)) as reader:  # another connection, counting
            while not erasing.done():
                count, top = reader.execute(
                    "SELECT count(*), max(seq) FROM ct_events WHERE session = ?", [session_id]
                ).fetchone()
                seen.add((count, top or 0))
                await asyncio.sleep(0.001)
        assert await erasing == 20_000
    assert {count for count, _ in seen} - {0, 20_000}, "the erasure never showed a part done"
    assert all(count % 500 == 0 and top == count for count, top in seen)  # whole steps, the newest first


def test_cli_delete_then_reimport_is_refused_and_writes_nothing(
    store_url: str, session_id: str, tmp_path: Path
) -> None:
    """The CLI way, on both backends: delete, then a re-import of an old export is refused, writes nothing."""
    gone, kept = f"{session_id}-del", f"{session_id}-keep"
    calltape = [str(Path(sys.executable).with_name("calltape")), "--db", store_url]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*calltape, *args], capture_output=True, text=True, timeout=120)

    async def record() -> None:
        s = await open_store(store_url)
        await s.append([started(gone), text(gone, "hello"), started(kept)])
        await s.close()

    async def stored(session: str) -> int:
        s = await open_store(store_url)
        try:
            return len(await s.read(session))
        finally:
            await s.close()

    asyncio.run(record())
    export = tmp_path / "all.jsonl"
    export.write_text(run("export", gone).stdout + run("export", kept).stdout)
    deleted = run("delete", gone, "--yes", "--json")
    assert deleted.returncode == 0, deleted.stderr
    assert orjson.loads(deleted.stdout) == [{"session": gone, "events": 2}]
    again = run("import", str(export))
    assert again.returncode != 0 and "erased" in again.stderr and "Traceback" not in again.stderr
    assert run("export", gone).returncode != 0
    assert asyncio.run(stored(gone)) == 0 and asyncio.run(stored(kept)) == 1  # the refused import wrote nothing
    pruned = run("prune", "--older-than", "30d", "--dry-run", "--json")
    assert pruned.returncode == 0, pruned.stderr
    if store_url.startswith("sqlite"):  # the PostgreSQL test database holds other tests' old calls
        assert orjson.loads(pruned.stdout)["sessions"] == 0
    bad = run("prune", "--older-than", "soon")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr


async def _upgrades_in_place(url: str) -> None:
    from calltape.eventstore import upgrade

    await at_revision(url, "0001")  # a v0.1 database, as v0.1 left it
    assert await upgrade(url) == ("0001", head_revision())
    store = await open_store(url)
    try:
        await store.append([started("kept"), text("kept", "hello")])
        assert await store.erase("kept") == 2
        with pytest.raises(SessionErased):
            await store.append([started("kept")])
    finally:
        await store.close()


async def test_a_v01_sqlite_database_upgrades_in_place(tmp_path: Path) -> None:
    await _upgrades_in_place(f"sqlite:///{tmp_path}/v01.db")


async def test_a_v01_postgres_database_upgrades_in_place(empty_pg: str) -> None:
    await _upgrades_in_place(empty_pg)


async def test_prune_keeps_a_call_that_came_back_after_it_was_listed(store: EventStore, session_id: str) -> None:
    """Retention decides again when it erases: a call resumed between the listing and its turn (an
    event newer than the cutoff) is kept whole, on both backends, short calls and long ones alike."""
    ancient = -(10**12)
    first, short, long_ = (f"{session_id}-{name}" for name in ("a", "b", "c"))
    await store.append([make_event(s, "session.started", {"agent": "a"}, at_ms=ancient) for s in (first, short, long_)])
    await store.append([text(long_, f"t{i}", at_ms=ancient + 1) for i in range(4999)])

    async def come_back(session: str) -> None:
        await store.append([text(session, "I'm back")])  # now: far newer than the cutoff

    comebacks: list[asyncio.Task[None]] = []

    def after_each(done: int, total: int) -> None:
        if done == 1:  # the first call is erased: the other two come back before their turn
            comebacks.extend(asyncio.ensure_future(come_back(s)) for s in (short, long_))

    # the comebacks run while prune awaits its next statement; make sure they landed first
    original = store.erase_in_steps

    async def erase_after_comebacks(session: str, step: int, *, before_ms: int | None = None) -> int | None:
        await asyncio.gather(*comebacks)
        return await original(session, step, before_ms=before_ms)

    store.erase_in_steps = erase_after_comebacks  # type: ignore[method-assign]
    report = await prune(store, before_ms=ancient + 10_000, progress=after_each)
    assert (report.sessions, report.events) == (1, 1)
    assert await store.session_info(first) is None
    for session, count in ((short, 2), (long_, 5001)):
        stored = await store.read(session)
        assert [e.seq for e in stored] == list(range(1, count + 1)), session  # nothing trimmed
        assert await store.tombstone(session) is None
