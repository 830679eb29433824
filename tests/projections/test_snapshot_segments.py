"""Snapshots stored as a small header beside append-only segments (the shared ``store`` fixture: SQLite
and PostgreSQL)."""

from __future__ import annotations

import contextlib
import itertools

import orjson
import pytest
from projection_timeline import Tape
from test_context_store import call_session, stored

from calltape.errors import CalltapeError, SessionNotFound
from calltape.events import Event
from calltape.eventstore import EventStore, open_store
from calltape.eventstore.redact_stored import redact_session
from calltape.projections import (
    FOLD_VERSION,
    ContextFold,
    SnapshotMismatch,
    SnapshotPolicy,
    build_context,
    fold_events,
    segments,
    snapshot_now,
)
from calltape.projections.snapshot import Segment
from calltape.redaction import Redactor


def refs(header: bytes) -> list[str]:
    """The segment keys a stored header names."""
    line = header.split(b"\n")[1]
    return [key for _, key in orjson.loads(line)["segments"]]


async def test_each_snapshot_adds_its_segment_and_a_small_header(store: EventStore) -> None:
    events = await stored(store, call_session("seg", 40))
    session = events[0].session
    headers: list[bytes] = []
    for n in (60, 120, 180, 240, 300):
        await build_context(store, session, n, snapshots=SnapshotPolicy(every=50))
        loaded = await store.load_snapshot(session, FOLD_VERSION, max_seq=n)
        assert loaded is not None
        headers.append(loaded[1])
    rows = dict(await store.load_snapshot_segments(session, FOLD_VERSION))
    # every header names segments the store holds, each later header extends the one before
    for before, after in itertools.pairwise(headers):
        assert refs(after)[: len(refs(before))] == refs(before)
    assert {segments.slot(k) for k in refs(headers[-1])} <= set(rows)
    assert len(rows) == len(refs(headers[-1]))  # nothing written twice
    # the header holds the live items and the keys, not the call: it stays small as the call grows
    assert len(headers[-1]) < 2 * len(headers[0]) and sum(map(len, rows.values())) > 5 * len(headers[-1])

    # a cold process restores from the rows, a warm one from its cache: both are the fold of the log
    for cold in (True, False):
        if cold:
            segments.CACHE.clear()
        got = await build_context(store, session, snapshots=None)
        assert got.to_snapshot() == fold_events(events).to_snapshot()
        assert got.native() == fold_events(events).native()


async def snapshotted(store: EventStore, name: str, turns: int, at: int, every: int) -> tuple[list[Event], bytes]:
    """A stored call, snapshotted by a rebuild at ``at``; its events and the stored header."""
    events = await stored(store, call_session(name, turns))
    await build_context(store, events[0].session, at, snapshots=SnapshotPolicy(every=every))
    loaded = await store.load_snapshot(events[0].session, FOLD_VERSION)
    assert loaded is not None
    return events, loaded[1]


async def test_a_header_whose_segment_is_missing_is_refused_and_the_log_folded(store: EventStore) -> None:
    events, header = await snapshotted(store, "gone", 6, 30, 20)
    session = events[0].session
    (key,) = refs(header)
    other = "0" * 32 if key != "0" * 32 else "1" * 32
    forged = header.replace(key.encode(), other.encode())
    segments.CACHE.clear()
    with pytest.raises(SnapshotMismatch):
        await segments.restore(store, session, forged)
    await store.save_snapshot(session, 31, FOLD_VERSION, forged)  # the newest, and useless
    got = await build_context(store, session, snapshots=None)
    assert got.to_snapshot() == fold_events(events).to_snapshot()


async def test_a_damaged_segment_body_is_refused(store: EventStore) -> None:
    events, header = await snapshotted(store, "bad", 4, 20, 10)
    session = events[0].session
    key = refs(header)[0]
    slot = segments.slot(key)
    body = dict(await store.load_snapshot_segments(session, FOLD_VERSION))[slot]
    for damaged in (body[:-3], body.replace(b"\n", b" ", 2), b"x" * 32 + body[32:]):
        with pytest.raises(SnapshotMismatch):
            Segment.from_body(damaged, key)
    assert Segment.from_body(body, key).key == key


async def test_a_store_without_segment_methods_gets_the_blob(store: EventStore) -> None:
    """A test double with only ``save_snapshot``/``load_snapshot`` keeps the inline blob, as before."""

    class Plain:
        async def save_snapshot(self, session: str, seq: int, version: int, state: bytes) -> None:
            await store.save_snapshot(session, seq, version, state)

    events = await stored(store, call_session("plain", 4))
    fold = fold_events(events[:20])
    await segments.save(Plain(), events[0].session, fold.capture())
    loaded = await store.load_snapshot(events[0].session, FOLD_VERSION)
    assert loaded is not None and loaded[1] == fold_events(events[:20]).to_snapshot()
    assert not await store.load_snapshot_segments(events[0].session, FOLD_VERSION)
    assert isinstance(events[0], Event)


CARD = "4111 1111 1111 1111"


def card_call(name: str, turns: int = 30) -> Tape:
    """A call with a card number said in its third turn (inside the first frozen segment), its last tool
    settled too: the fold is clean at its end, so a live fold is saved as it is."""
    tape = call_session(name, turns)
    (said,) = (e for e in tape.events if e.data.get("text") == "question 2")
    said.data["text"] = f"my card is {CARD}"
    tape.result(f"c{turns - 1}", {"i": turns - 1})
    return tape


def holds_card(fold: ContextFold) -> bool:
    return CARD in orjson.dumps(fold.native()).decode()


async def rows_hold_card(store: EventStore, session: str) -> bool:
    """Whether any snapshot row of the session (a header or a segment) holds the card."""
    header = await store.load_snapshot(session, FOLD_VERSION)
    rows = [body for _, body in await store.load_snapshot_segments(session, FOLD_VERSION)]
    return any(CARD.encode() in row for row in [*rows, *([header[1]] if header else [])])


async def test_a_redacted_value_never_comes_back_from_a_snapshot(store: EventStore, store_url: str) -> None:
    events = await stored(store, card_call("red"))
    session = events[0].session
    live = await build_context(store, session, snapshots=SnapshotPolicy(every=50))  # held by a live process
    assert holds_card(live) and live.clean and await rows_hold_card(store, session)
    report = await redact_session(store, session, Redactor(kinds=("card",)))
    assert report.events == 1
    assert not await rows_hold_card(store, session)  # redaction dropped the snapshots
    # the process that held the fold saves it after the rewrite (a snapshot taken across the redaction)
    assert await snapshot_now(store, session, live) == 0  # refused: it holds what the redaction removed
    assert not await rows_hold_card(store, session)
    for cold in (False, True):  # this process (its segment cache warm), then a cold one
        if cold:
            segments.CACHE.clear()
        again = await build_context(store, session, snapshots=SnapshotPolicy(every=50))
        assert not holds_card(again)
        async with await open_store(store_url) as fresh:
            assert not holds_card(await build_context(fresh, session, snapshots=None))
        assert not await rows_hold_card(store, session)


async def test_an_erased_session_reads_as_gone_whatever_a_process_held(store: EventStore, store_url: str) -> None:
    events = await stored(store, card_call("erased"))
    session = events[0].session
    live = await build_context(store, session, snapshots=SnapshotPolicy(every=50))
    assert live.clean and await store.load_snapshot(session, FOLD_VERSION) is not None
    await store.erase(session)
    with pytest.raises(SessionNotFound):
        await snapshot_now(store, session, live)
    # a save that was under way when the erasure committed (its capture taken before) stores nothing
    with contextlib.suppress(CalltapeError):
        await segments.save(store, session, live.capture())
    for cold in (False, True):
        if cold:
            segments.CACHE.clear()
        for reader in (store, None):
            async with contextlib.AsyncExitStack() as stack:
                s = reader or await stack.enter_async_context(await open_store(store_url))
                with pytest.raises(SessionNotFound):
                    await build_context(s, session)
                assert await s.load_snapshot(session, FOLD_VERSION) is None
                assert await s.load_snapshot_segments(session, FOLD_VERSION) == []
