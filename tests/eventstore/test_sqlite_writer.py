"""The SQLite store's appends on their own thread and ``sqlite3`` connection (``_sqlite_thread.py``):
the same guarantees as through aiosqlite, checked against the file with a plain ``sqlite3`` connection."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from calltape.errors import InvalidEvent, SessionErased, StoreUnavailable
from calltape.events import Event, make_event
from calltape.eventstore import open_store
from calltape.eventstore import sqlite as sqlite_backend
from calltape.eventstore._sqlite_thread import WAL_CAP_BYTES, WAL_CAP_PAGES, WAL_CHECKPOINT_PAGES
from calltape.eventstore.store import EventStore


def _said(session: str, id: str) -> Event:
    return make_event(session, "user.transcript", {"text": "hi", "final": True}, id=id)


def _writers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("calltape-sqlite-writer")]


@pytest.fixture
async def path(tmp_path: Path) -> Path:
    return tmp_path / "calltape.db"


@pytest.fixture
async def store(path: Path) -> AsyncIterator[EventStore]:
    s = await open_store(f"sqlite:///{path}")
    try:
        yield s
    finally:
        await s.close()


def _rows(path: Path) -> list[tuple[str, int, str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT session, seq, id FROM ct_events ORDER BY pos").fetchall()
    finally:
        conn.close()


async def test_an_awaited_append_is_committed_for_every_other_connection(store: EventStore, path: Path) -> None:
    stored = await store.append([_said("a", "e1"), _said("b", "e2"), _said("a", "e3")])
    assert [(e.session, e.seq) for e in stored] == [("a", 1), ("b", 1), ("a", 2)]
    assert _rows(path) == [("a", 1, "e1"), ("b", 1, "e2"), ("a", 2, "e3")]
    assert _writers(), "the append ran on the writer's thread"


async def test_ids_already_stored_in_several_sessions_are_found_in_one_batch(store: EventStore, path: Path) -> None:
    first = await store.append([_said("a", "e1"), _said("b", "e2")])
    again = await store.append([_said("b", "e2"), _said("a", "e4"), _said("a", "e1")])
    assert again[0] == first[1] and again[2] == first[0]
    assert (again[1].session, again[1].seq) == ("a", 2)
    assert _rows(path) == [("a", 1, "e1"), ("b", 1, "e2"), ("a", 2, "e4")]


async def test_a_refused_batch_writes_nothing_and_the_writer_goes_on(store: EventStore, path: Path) -> None:
    started = make_event("s", "session.started", {"agent": "bot"}, id="st")
    twice = make_event("s", "session.started", {"agent": "bot"}, id="st2")
    with pytest.raises(InvalidEvent):
        await store.append([_said("a", "e1"), started, twice])
    assert _rows(path) == []
    await store.append([_said("a", "e1")])
    assert _rows(path) == [("a", 1, "e1")]


async def test_an_append_waits_for_another_writers_lock(store: EventStore, path: Path) -> None:
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        holder.execute("BEGIN IMMEDIATE")
        asyncio.get_running_loop().call_later(0.3, holder.execute, "COMMIT")
        await store.append([_said("a", "e1")])
    finally:
        holder.close()
    assert _rows(path) == [("a", 1, "e1")]


async def test_a_lock_held_past_the_busy_timeout_is_an_outage_then_the_append_goes_through(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_backend, "BUSY_TIMEOUT_MS", 200)
    store = await open_store(f"sqlite:///{path}")
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable, match="SQLite file"):
            await store.append([_said("a", "e1")])
        holder.execute("COMMIT")
        await store.append([_said("a", "e1")])
        assert _rows(path) == [("a", 1, "e1")]
    finally:
        holder.close()
        await store.close()


async def test_an_erased_session_is_refused_on_the_writer_thread(store: EventStore) -> None:
    await store.append([_said("gone", "e1")])
    await store.erase("gone")
    with pytest.raises(SessionErased):
        await store.append([_said("gone", "e2")])


async def test_close_ends_the_writer_thread(path: Path) -> None:
    before = len(_writers())
    store = await open_store(f"sqlite:///{path}")
    await store.append([_said("a", "e1")])
    assert len(_writers()) == before + 1
    await store.close()
    for _ in range(100):
        if len(_writers()) == before:
            break
        await asyncio.sleep(0.01)
    assert len(_writers()) == before


async def test_an_in_memory_store_appends_on_its_one_connection() -> None:
    store = await open_store("sqlite://")
    try:
        stored = await store.append([_said("a", "e1"), _said("a", "e1")])
        assert [e.seq for e in stored] == [1, 1]
        assert [e.id for e in await store.read("a")] == ["e1"]
    finally:
        await store.close()


FORKED_CHILD = """
import asyncio, os, sys
from calltape.eventstore import open_store
from calltape.events import make_event

async def main(path):
    store = await open_store(f"sqlite:///{path}")
    await store.append([make_event("s1", "session.started", {"agent": "a"})])
    pid = os.fork()
    if pid == 0:
        async def child():
            await asyncio.wait_for(store.append([make_event("s1", "user.text", {"text": "hi"})]), 20)
        asyncio.run(child())
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print(status, len(await store.read("s1")))
    await store.close()

asyncio.run(main(sys.argv[1]))
"""


def test_a_forked_child_appends_through_a_writer_of_its_own(tmp_path: Path) -> None:
    # threads do not survive fork: the child's first append must not wait for the parent's writer thread
    done = subprocess.run(
        [sys.executable, "-c", FORKED_CHILD, str(tmp_path / "calls.db")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "2"], done.stdout


# -- the WAL checkpoint, off the commit path (issue 32) ------------------------------------------


def _long(session: str, id: str) -> Event:
    """An event of about a page (4 KiB): the WAL grows by pages, the tests count in them."""
    return make_event(session, "user.transcript", {"text": "x" * 3000, "final": True}, id=id)


def _wal_pages(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size // 4096 if wal.exists() else 0


def _left_to_checkpoint(path: Path) -> tuple[int, int]:
    """``(frames in the WAL, frames not yet checkpointed)`` seen from a plain connection (its own passive
    checkpoint finds nothing left to do when the store's ran)."""
    conn = sqlite3.connect(path)
    try:
        _, frames, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return frames, frames - done
    finally:
        conn.close()


async def test_the_writer_connection_never_checkpoints_inside_a_commit(store: EventStore) -> None:
    await store.append([_said("a", "e1")])
    writer = store._writer  # type: ignore[attr-defined]
    assert await writer.run(lambda c: c.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 0
    limit = await writer.run(lambda c: c.execute("PRAGMA journal_size_limit").fetchone()[0])
    assert limit == WAL_CAP_BYTES  # a reset WAL is cut back to the cap: a larger file means past it
    reads = store._reads  # type: ignore[attr-defined]
    assert await reads.run(lambda c: c.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 1000


async def test_an_idle_writer_has_the_wal_checkpointed_on_a_thread_of_its_own(store: EventStore, path: Path) -> None:
    for k in range(60):  # each append awaited: the writer is idle after each, as between a call's turns
        await store.append([_long("a", f"e{k}-{i}") for i in range(40)])
    checkpoints = store._checkpoints  # type: ignore[attr-defined]
    await checkpoints.close()  # waits for a checkpoint under way
    _, left = _left_to_checkpoint(path)
    assert checkpoints.runs >= 1
    assert left <= WAL_CHECKPOINT_PAGES + 200  # at most what came after the last checkpoint
    assert _wal_pages(path) <= WAL_CAP_PAGES + 200  # reset and reused, not grown with the log
    assert len(_rows(path)) == 2400


async def test_a_writer_that_never_idles_keeps_the_wal_bounded(store: EventStore, path: Path) -> None:
    for round in range(4):  # every append queued behind another: the writer is never idle
        await asyncio.gather(
            *(store.append([_long(f"s{k}", f"e{round}-{k}-{i}") for i in range(40)]) for k in range(50))
        )
    checkpoints = store._checkpoints  # type: ignore[attr-defined]
    assert len(_rows(path)) == 8000
    assert checkpoints.runs >= 1
    assert _wal_pages(path) <= WAL_CAP_PAGES + 1000  # the cap, and what commits while its checkpoint runs
