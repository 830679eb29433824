"""build_context / snapshots against the real store (the shared ``store`` fixture: SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from projection_timeline import T0, Tape

from calltape.errors import SessionNotFound
from calltape.events import Event, format_time
from calltape.eventstore import EventStore
from calltape.projections import (
    FOLD_VERSION,
    AtSeq,
    ContextFold,
    InvalidInstant,
    SnapshotMismatch,
    SnapshotPolicy,
    build_context,
    fold_events,
    snapshot_now,
)

V0_1 = Path(__file__).parent / "data" / "snapshot_v0_1.json"
"""A snapshot as v0.1 wrote it (fold version 1): ``call_session("SESSION", 4)`` folded to seq 29."""


class Spy:
    """The real store, recording what build_context asks of it."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.reads: list[tuple[int, int | None]] = []
        self.saves: list[int] = []

    async def read(self, session: str, *, after_seq: int = 0, to_seq: int | None = None) -> list[Event]:
        self.reads.append((after_seq, to_seq))
        return await self.store.read(session, after_seq=after_seq, to_seq=to_seq)

    async def seq_at_time(self, session: str, at_ms: int) -> int:
        return await self.store.seq_at_time(session, at_ms)

    async def session_info(self, session: str) -> Any:
        return await self.store.session_info(session)

    async def save_snapshot(self, session: str, seq: int, version: int, state: bytes) -> None:
        self.saves.append(seq)
        await self.store.save_snapshot(session, seq, version, state)

    async def load_snapshot(self, session: str, version: int, *, max_seq: int | None = None) -> Any:
        return await self.store.load_snapshot(session, version, max_seq=max_seq)


def call_session(session: str, turns: int = 8) -> Tape:
    """A call with a clean point after each turn and a tool in flight at the end."""
    tape = Tape(session)
    for i in range(turns):
        tape.said(f"question {i}")
        rid = f"r{i}"
        tape.add("agent.reply.started", reply=rid)
        tape.add("agent.text", reply=rid, text=f"answer {i}")
        tape.call(f"c{i}", reply=rid)
        tape.add("agent.reply.done", reply=rid)
        tape.add("agent.speech.started", reply=rid)
        tape.add("agent.speech.ended", reply=rid, interrupted=False)
        tape.add("tool.started", call=f"c{i}")
        if i < turns - 1:
            tape.result(f"c{i}", {"i": i})
    return tape


async def stored(store: EventStore, tape: Tape) -> list[Event]:
    session = f"{tape.session}-{uuid.uuid4().hex[:8]}"
    events = [Event(type=e.type, data=e.data, session=session, id=e.id, at_ms=e.at_ms) for e in tape.events]
    return await store.append(events)


async def test_context_at_instants(store: EventStore) -> None:
    events = await stored(store, call_session("a"))
    session = events[0].session
    full = await build_context(store, session, snapshots=None)
    assert full.to_snapshot() == fold_events(events).to_snapshot()
    assert full.native()["seq"] == len(events) and not full.clean
    cases: list[tuple[AtSeq | int | str, int]] = [(10, 10), ("10", 10), (AtSeq(3), 3), (10_000, len(events))]
    for at, n in cases:
        got = await build_context(store, session, at, snapshots=None)
        assert got.native() == fold_events(events[:n]).native()
    by_time = await build_context(store, session, format_time(T0 + 7 * 100 + 50), snapshots=None)
    assert by_time.seq == 7
    by_offset = await build_context(store, session, "+0.6", snapshots=None)  # first event at T0+100
    assert by_offset.seq == 7
    before = await build_context(store, session, format_time(T0), snapshots=None)
    assert before.seq == 0 and before.session == session


async def test_unknown_session_and_bad_instant(store: EventStore) -> None:
    with pytest.raises(SessionNotFound):
        await build_context(store, "nobody")
    events = await stored(store, call_session("b", 1))
    with pytest.raises(InvalidInstant):
        await build_context(store, events[0].session, "yesterday")


async def test_snapshots_are_taken_at_clean_points_and_used(store: EventStore) -> None:
    events = await stored(store, call_session("c"))
    session = events[0].session
    spy = Spy(store)
    first = await build_context(spy, session, snapshots=SnapshotPolicy(every=20))
    assert spy.reads == [(0, len(events))]
    (saved,) = spy.saves
    assert saved >= 20 and fold_events(events[:saved]).clean
    loaded = await store.load_snapshot(session, FOLD_VERSION)
    assert loaded is not None and loaded[0] == saved
    assert loaded[1] == fold_events(events[:saved]).to_snapshot()

    spy.reads.clear()
    again = await build_context(spy, session, snapshots=None)
    assert spy.reads == [(saved, len(events))]
    assert again.to_snapshot() == first.to_snapshot() == fold_events(events).to_snapshot()

    # a context before the snapshot folds from the start, and agrees with a pure fold
    spy.reads.clear()
    early = await build_context(spy, session, saved - 3, snapshots=None)
    assert spy.reads == [(0, saved - 3)] and early.native() == fold_events(events[: saved - 3]).native()


async def test_damaged_or_foreign_snapshots_are_ignored(store: EventStore) -> None:
    events = await stored(store, call_session("d", 3))
    session = events[0].session
    await store.save_snapshot(session, 9, FOLD_VERSION, b"not json")
    await store.save_snapshot(session, 10, FOLD_VERSION + 1, b"{}")
    got = await build_context(store, session, snapshots=None)
    assert got.to_snapshot() == fold_events(events).to_snapshot()


async def test_snapshot_now_uses_the_last_clean_point(store: EventStore) -> None:
    events = await stored(store, call_session("e", 3))
    session = events[0].session
    live = fold_events(events)
    assert not live.clean
    seq = await snapshot_now(store, session)
    assert seq == live.last_clean_seq > 0
    loaded = await store.load_snapshot(session, FOLD_VERSION)
    assert loaded is not None and loaded[0] == seq
    # a clean live fold is saved as is
    tail = await store.append([Event(type="tool.result", data={"call": "c2", "output": 1}, session=session, id="fin")])
    live.apply(tail[0])
    assert live.clean and await snapshot_now(store, session, live) == len(events) + 1
    # a live fold ahead of the log is not trusted: the store's last clean point is used instead
    ahead = fold_events([*events, tail[0]])
    ahead.apply(Event(type="user.text", data={"text": "not stored yet"}, session=session, id="x", seq=99))
    assert await snapshot_now(store, session, ahead) == len(events) + 1
    with pytest.raises(SessionNotFound):
        await snapshot_now(store, "nobody")


async def test_a_v0_1_snapshot_in_the_database_is_ignored_and_rebuilt(store: EventStore) -> None:
    """v0.1 stored its positional layout under fold version 1: never read as state, replaced by a new one."""
    events = await stored(store, call_session("v01", 4))
    session = events[0].session
    old = V0_1.read_bytes().replace(b'"session":"SESSION"', b'"session":' + orjson.dumps(session))
    assert b'"v":1,' in old and b'"items":[["u",' in old
    with pytest.raises(SnapshotMismatch, match="fold version 1,"):
        ContextFold.from_snapshot(old)
    await store.save_snapshot(session, 29, 1, old)  # where v0.1 saved it
    await store.save_snapshot(session, 20, FOLD_VERSION, old)  # and, misfiled, under this version
    spy = Spy(store)
    got = await build_context(spy, session, snapshots=SnapshotPolicy(every=25))
    assert spy.reads == [(0, len(events))]  # folded from seq 1
    assert got.native() == fold_events(events).native()
    (saved,) = spy.saves
    loaded = await store.load_snapshot(session, FOLD_VERSION)
    assert loaded is not None and loaded[0] == saved > 20
    restored = ContextFold.from_snapshot(loaded[1])
    assert restored.native() == fold_events(events[:saved]).native()
    spy.reads.clear()
    again = await build_context(spy, session, snapshots=None)
    assert spy.reads == [(saved, len(events))] and again.native() == got.native()
