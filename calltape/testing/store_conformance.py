"""The store conformance suite: what any :class:`~calltape.eventstore.EventStore` backend must do,
as pytest tests a third-party backend runs against its own store.

calltape's SQLite, PostgreSQL and Citus stores run it in calltape's own tests; a backend of yours
runs the same checks with a factory of its own::

    from calltape.testing.store_conformance import StoreConformance

    class TestMyStore(StoreConformance):
        async def open_store(self):
            return await MyStore.open("mystore://test")  # a migrated, empty or shared database

Each check runs on a fresh store from :meth:`StoreConformance.open_store` (closed after it) in a
loop of its own (``asyncio.run``), so the suite needs pytest only, no async plugin. Each check
writes sessions with new random ids and reads the global feed from the position it took before
writing, so a shared database with other sessions in it is fine.

The checks go role by role (:class:`~calltape.eventstore.EventWriter`,
:class:`~calltape.eventstore.EventReader`, :class:`~calltape.eventstore.StoreAdmin`). What a backend
may leave out is not checked: atomicity and order across the sessions of one append (Citus commits
each shard apart), tenancy, redaction on write.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from calltape.errors import ConcurrencyConflict, FencedWrite, InvalidEvent, SessionErased, SessionNotFound
from calltape.events import Event, make_event
from calltape.eventstore import EventStore, FeedPosition

__all__ = ["CHECKS", "StoreConformance"]

Check = Callable[[EventStore, str], Awaitable[None]]
"""One conformance check: a fresh store and a new session id."""

CHECKS: dict[str, Check] = {}
"""Every check by its test name (``test_...``), in the order they are defined."""


def _check(fn: Check) -> Check:
    CHECKS[f"test_{fn.__name__.lstrip('_')}"] = fn
    return fn


def _started(session: str, agent: str = "conformance", **kw: Any) -> Event:
    return make_event(session, "session.started", {"agent": agent}, **kw)


def _text(session: str, value: str, **kw: Any) -> Event:
    return make_event(session, "user.text", {"text": value}, **kw)


def _texts(events: list[Event]) -> list[Any]:
    return [e.data.get("text") for e in events]


async def _in_feed(
    store: EventStore, after: FeedPosition, sessions: set[str], count: int, *, session: str | None = None
) -> list[tuple[FeedPosition, Event]]:
    """The feed's events of ``sessions`` after ``after``, once ``count`` of them are there (or after
    30 s): a feed may show a commit a moment late (PostgreSQL's waits for every older transaction
    of the server to end, other databases' included)."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        rows = [(at, e) for at, e in await store.feed(after, limit=10_000, session=session) if e.session in sessions]
        if len(rows) >= count or asyncio.get_running_loop().time() > deadline:
            return rows
        await asyncio.sleep(0.05)


class _Raises:
    """``with _Raises(Kind, "what"):`` fails the check unless the block raises ``Kind``."""

    def __init__(self, kind: type[Exception], what: str) -> None:
        self.kind, self.what = kind, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: object) -> bool:
        if kind is None:
            raise AssertionError(f"{self.what}: expected {self.kind.__name__}, nothing was raised")
        return issubclass(kind, self.kind)


# -- writing ---------------------------------------------------------------------------------------


@_check
async def _append_numbers_each_session_from_one_without_gaps(store: EventStore, session: str) -> None:
    first = await store.append([_started(session), _text(session, "a"), _text(session, "b")])
    assert [e.seq for e in first] == [1, 2, 3]
    second = await store.append([_text(session, "c")])
    assert [e.seq for e in second] == [4]
    assert await store.append([]) == []


@_check
async def _append_returns_the_stored_events_as_read_back(store: EventStore, session: str) -> None:
    given = _text(session, "x", at_ms=1_700_000_000_123, epoch=1)
    stored = await store.append([_started(session, epoch=1), given])
    assert stored == await store.read(session)
    assert (stored[1].id, stored[1].at_ms, stored[1].epoch, stored[1].data) == (given.id, given.at_ms, 1, given.data)
    assert given.seq is None, "the caller's event was changed"


@_check
async def _append_of_a_known_id_returns_the_stored_event(store: EventStore, session: str) -> None:
    kept = _text(session, "original")
    stored = await store.append([_started(session), kept, kept])
    assert [e.seq for e in stored] == [1, 2, 2]
    retry = make_event(session, "user.text", {"text": "another body"}, id=kept.id)
    (again,) = await store.append([retry])
    assert again == stored[1] and again.data == {"text": "original"}
    assert len(await store.read(session)) == 2


@_check
async def _append_spans_sessions(store: EventStore, session: str) -> None:
    a, b = f"{session}-a", f"{session}-b"
    out = await store.append([_started(a), _started(b), _text(a, "a1"), _text(b, "b1")])
    assert sorted((e.session, e.seq) for e in out) == [(a, 1), (a, 2), (b, 1), (b, 2)]
    assert _texts(await store.read(a)) == [None, "a1"]
    assert _texts(await store.read(b)) == [None, "b1"]


@_check
async def _expected_seq_refuses_a_writer_that_fell_behind(store: EventStore, session: str) -> None:
    await store.append([_started(session)], expected_seq=0)
    await store.append([_text(session, "b")], expected_seq=1)
    with _Raises(ConcurrencyConflict, "append at expected_seq 1 with the session at 2"):
        await store.append([_text(session, "late")], expected_seq=1)
    assert [e.seq for e in await store.read(session)] == [1, 2]


@_check
async def _an_older_epoch_is_fenced(store: EventStore, session: str) -> None:
    await store.append([_started(session), _text(session, "a", epoch=1)])
    await store.append([make_event(session, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 2})])
    with _Raises(FencedWrite, "a write at epoch 1 after a resume at epoch 2"):
        await store.append([_text(session, "zombie", epoch=1)])
    info = await store.session_info(session)
    assert info is not None and (info.epoch, info.agent, info.last_seq) == (2, "b", 3)


@_check
async def _append_takes_a_list_of_events_only(store: EventStore, session: str) -> None:
    with _Raises(InvalidEvent, "append of one Event instead of a list"):
        await store.append(_started(session))  # type: ignore[arg-type]
    assert await store.read(session) == []


@_check
async def _snapshots_load_the_newest_at_or_before_a_seq(store: EventStore, session: str) -> None:
    await store.append([_started(session)])
    assert await store.load_snapshot(session, 1) is None
    await store.save_snapshot(session, 3, 1, b"v1@3")
    await store.save_snapshot(session, 7, 1, b"v1@7")
    await store.save_snapshot(session, 5, 2, b"v2@5")
    await store.save_snapshot(session, 7, 1, b"v1@7")  # again: harmless
    assert await store.load_snapshot(session, 1) == (7, b"v1@7")
    assert await store.load_snapshot(session, 1, max_seq=6) == (3, b"v1@3")
    assert await store.load_snapshot(session, 1, max_seq=2) is None
    assert await store.load_snapshot(session, 2) == (5, b"v2@5")
    blob = bytes(range(256)) * 40
    await store.save_snapshot(session, 8, 1, blob)
    assert await store.load_snapshot(session, 1) == (8, blob)


# -- reading ---------------------------------------------------------------------------------------


@_check
async def _read_slices_a_session_by_seq(store: EventStore, session: str) -> None:
    await store.append([_started(session), *(_text(session, f"t{i}") for i in range(5))])
    assert [e.seq for e in await store.read(session, after_seq=2)] == [3, 4, 5, 6]
    assert [e.seq for e in await store.read(session, after_seq=2, to_seq=4)] == [3, 4]
    assert [e.seq for e in await store.read(session, limit=2)] == [1, 2]
    assert await store.read(f"{session}-never") == []


@_check
async def _read_keeps_to_the_types_asked_for(store: EventStore, session: str) -> None:
    other = f"{session}-other"

    def effect(at: str, key: str) -> Event:
        return make_event(at, "tool.effect", {"call": f"c{key}", "name": "n", "key": key, "phase": "done"})

    mixed = [_started(session)]
    for i in range(6):
        mixed += [_text(session, f"t{i}"), effect(session, str(i))]
    mixed.append(make_event(session, "agent.text", {"reply": "r", "text": "x"}))
    await store.append(mixed)
    await store.append([_started(other), effect(other, "k")])
    every = await store.read(session)
    effects = await store.read(session, types=["tool.effect"])
    assert effects == [e for e in every if e.type == "tool.effect"] and len(effects) == 6
    assert [e.seq for e in effects] == [3, 5, 7, 9, 11, 13]  # in seq order
    two = await store.read(session, types=("tool.effect", "agent.text"), after_seq=4, to_seq=14)
    assert two == [e for e in every if e.type in ("tool.effect", "agent.text") and 4 < (e.seq or 0) <= 14]
    assert [e.seq for e in await store.read(session, types={"user.text"}, limit=2)] == [2, 4]
    assert await store.read(session, types=["no.such.type"]) == []
    assert await store.read(session, types=[]) == []


@_check
async def _seq_at_time_is_the_prefix_up_to_an_instant(store: EventStore, session: str) -> None:
    await store.append(
        [_started(session, at_ms=1000), _text(session, "a", at_ms=2000), _text(session, "b", at_ms=3000)]
    )
    assert await store.seq_at_time(session, 999) == 0
    assert await store.seq_at_time(session, 2500) == 2
    assert await store.seq_at_time(session, 3000) == 3


@_check
async def _session_info_summarises_a_session(store: EventStore, session: str) -> None:
    assert await store.session_info(session) is None
    await store.append([_started(session, agent="triage", at_ms=1000), _text(session, "a", at_ms=2000)])
    info = await store.session_info(session)
    assert info is not None
    assert (info.session, info.agent, info.status, info.last_seq, info.started) == (
        session,
        "triage",
        "active",
        2,
        True,
    )
    assert (info.first_at_ms, info.last_at_ms) == (1000, 2000)
    await store.append([make_event(session, "session.ended", {})])
    ended = await store.session_info(session)
    assert ended is not None and ended.status == "ended"


@_check
async def _sessions_lists_and_filters(store: EventStore, session: str) -> None:
    agent = f"agent-{session}"
    await store.append([_started(f"{session}-1", agent=agent, at_ms=1000)])
    await store.append([_started(f"{session}-2", agent=agent, at_ms=2000), _text(f"{session}-2", "x", at_ms=3000)])
    listed = await store.sessions(agent=agent)
    assert [i.session for i in listed] == [f"{session}-2", f"{session}-1"]  # newest first by default
    oldest_first = await store.sessions(agent=agent, order="first_at", descending=False)
    assert [i.session for i in oldest_first] == [f"{session}-1", f"{session}-2"]
    assert [i.session for i in await store.sessions(agent=agent, limit=1)] == [f"{session}-2"]


@_check
async def _the_feed_hands_out_new_events_after_a_position(store: EventStore, session: str) -> None:
    start = await store.head()
    await store.append([_started(session), _text(session, "a")])
    await store.append([_text(session, "b")])
    mine = await _in_feed(store, start, {session}, 3)
    assert _texts([e for _, e in mine]) == [None, "a", "b"]
    positions = [at for at, _ in mine]
    assert positions == sorted(positions) and len(set(positions)) == 3
    only = await _in_feed(store, start, {session}, 3, session=session)
    assert [e.id for _, e in only] == [e.id for _, e in mine]
    assert await store.feed(positions[-1], session=session) == []
    assert await store.head() >= positions[-1]


@_check
async def _a_subscription_follows_the_feed(store: EventStore, session: str) -> None:
    start = await store.head()
    await store.append([_started(session)])
    subscription = store.subscribe(start, session=session, poll_interval=0.05)
    try:
        _, first = await asyncio.wait_for(anext(subscription), 10)
        assert first.type == "session.started"
        await store.append([_text(session, "later")])
        _, second = await asyncio.wait_for(anext(subscription), 10)
        assert second.data == {"text": "later"}
    finally:
        close = getattr(subscription, "aclose", None)  # an async generator's (not every AsyncIterator's)
        if close is not None:
            await close()


@_check
async def _a_change_waiter_returns_within_its_time(store: EventStore, session: str) -> None:
    waiter = store.change_waiter()
    try:
        await waiter.ready()
        await asyncio.wait_for(waiter.wait(0.05), 10)
        assert isinstance(waiter.erasures(), int)
    finally:
        await waiter.close()


# -- administration --------------------------------------------------------------------------------


@_check
async def _erase_removes_a_session_and_leaves_a_tombstone(store: EventStore, session: str) -> None:
    kept = f"{session}-kept"
    start = await store.head()
    await store.append([_started(session), _text(session, "my card is 4242")])
    await store.append([_started(kept)])
    await store.save_snapshot(session, 2, 1, b"state")
    assert await store.erase(session) == 2
    assert await store.read(session) == []
    assert await store.session_info(session) is None
    assert await store.load_snapshot(session, 1) is None
    tomb = await store.tombstone(session)
    assert tomb is not None and (tomb.session, tomb.events) == (session, 2)
    assert [e.session for _, e in await _in_feed(store, start, {session, kept}, 1)] == [kept]
    assert len(await store.read(kept)) == 1
    assert await store.erase(session) == 0
    assert await store.tombstone(kept) is None
    with _Raises(SessionNotFound, "erasing a session that never existed"):
        await store.erase(f"{session}-never")


@_check
async def _an_erased_session_cannot_come_back(store: EventStore, session: str) -> None:
    await store.append([_started(session)])
    await store.erase(session)
    with _Raises(SessionErased, "appending to an erased session"):
        await store.append([_started(session)])
    assert await store.read(session) == []


@_check
async def _erase_in_steps_removes_everything(store: EventStore, session: str) -> None:
    await store.append([_started(session, at_ms=1000), *(_text(session, f"t{i}", at_ms=1000 + i) for i in range(6))])
    assert await store.erase_in_steps(session, 2, before_ms=500) is None  # came back since listed: kept
    assert len(await store.read(session)) == 7
    assert await store.erase_in_steps(session, 2) == 7
    assert await store.read(session) == []
    tomb = await store.tombstone(session)
    assert tomb is not None and tomb.events == 7


@_check
async def _rewrite_data_replaces_data_in_place(store: EventStore, session: str) -> None:
    stored = await store.append([_started(session), _text(session, "my card is 4242")])
    await store.save_snapshot(session, 2, 1, b"state")
    await store.rewrite_data(session, [(2, {"text": "my card is [card]"})])
    (_, rewritten) = await store.read(session)
    assert (rewritten.id, rewritten.seq, rewritten.data) == (stored[1].id, 2, {"text": "my card is [card]"})
    assert await store.load_snapshot(session, 1) is None


class StoreConformance:
    """The suite as a pytest class: subclass it as ``Test...`` and implement :meth:`open_store`.

    Each ``test_...`` method runs one check of :data:`CHECKS` on a fresh store."""

    async def open_store(self) -> EventStore:
        """A store of the backend under test (its schema in place), opened in the running loop."""
        raise NotImplementedError("subclass StoreConformance and implement open_store()")

    def run_check(self, check: Check) -> None:
        """Runs ``check`` on a fresh store and a new session id, in a loop of its own."""

        async def run() -> None:
            store = await self.open_store()
            try:
                await check(store, f"conformance-{uuid.uuid4().hex[:12]}")
            finally:
                await store.close()

        asyncio.run(run())


def _as_test(name: str, check: Check) -> Callable[[StoreConformance], None]:
    def test(self: StoreConformance) -> None:
        self.run_check(check)

    test.__name__ = name
    test.__qualname__ = f"StoreConformance.{name}"
    return test


def _add_tests() -> None:
    """One ``test_...`` method of :class:`StoreConformance` per check (pytest collects methods)."""
    for name, check in CHECKS.items():
        setattr(StoreConformance, name, _as_test(name, check))


_add_tests()
