"""Erasure and redaction against a reader that is mid-page (issue 16, issue 26 item 12): a subscription
fetches its events a page at a time; once a session is erased — by this process or by another one — the
subscription hands out no more of that session's events, not even the ones it had already fetched; once
a session is redacted (``calltape redact``), it hands out the page's remaining events as they are now."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from eventstore_support import skip_unless_atomic_across_sessions, started, text, texts

from calltape.events import Event
from calltape.eventstore import EventStore, FeedPosition, open_store
from calltape.eventstore.store import ChangeWaiter


async def _calltape(url: str, *args: str) -> None:
    calltape = str(Path(sys.executable).with_name("calltape"))
    proc = await asyncio.create_subprocess_exec(
        calltape, "--db", url, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()


async def _erase_in_another_process(url: str, session: str) -> None:
    await _calltape(url, "delete", session, "--yes")


async def _seed(store: EventStore, keep: str, victim: str) -> FeedPosition:
    start = await store.head()
    # One page holds both calls, the victim's events between the kept call's first and last.
    await store.append([started(keep), text(keep, "first"), started(victim), *texts(victim, 6), text(keep, "last")])
    return start


@pytest.mark.parametrize("eraser", ["this process", "another process"])
async def test_a_subscription_mid_page_hands_out_nothing_of_an_erased_session(
    store_url: str, session_id: str, eraser: str
) -> None:
    keep, victim = f"{session_id}-keep", f"{session_id}-victim"
    async with await open_store(store_url) as writer, await open_store(store_url) as reader:
        skip_unless_atomic_across_sessions(writer)  # the page's order across sessions is the batch's
        start = await _seed(writer, keep, victim)
        feed: AsyncIterator[tuple[FeedPosition, Event]] = reader.subscribe(start, poll_interval=0.05, batch=500)
        got: list[Event] = []
        try:
            while not got or got[-1].data.get("text") != "first":  # the page is fetched: all in memory
                _, event = await asyncio.wait_for(anext(feed), 20)
                if event.session in (keep, victim):
                    got.append(event)
            before = len(got)
            if eraser == "this process":
                assert await writer.erase(victim) == 7  # another store: its own connection
            else:
                await _erase_in_another_process(store_url, victim)
            while got[-1].data.get("text") != "last":
                _, event = await asyncio.wait_for(anext(feed), 20)
                if event.session in (keep, victim):
                    got.append(event)
        finally:
            await feed.aclose()  # type: ignore[attr-defined]
    assert [e.session for e in got[:before]] == [keep, keep]
    assert [e.session for e in got[before:]] == [keep]  # not one of the victim's already-fetched events


async def test_a_subscription_keeps_every_event_when_nothing_is_erased(store_url: str, session_id: str) -> None:
    """The guard drops erased sessions only: an erase of an unrelated session costs the page nothing."""
    keep, other, unrelated = f"{session_id}-keep", f"{session_id}-other", f"{session_id}-unrelated"
    async with await open_store(store_url) as writer, await open_store(store_url) as reader:
        skip_unless_atomic_across_sessions(writer)  # the page's order across sessions is the batch's
        await writer.append([started(unrelated)])
        start = await _seed(writer, keep, other)
        feed = reader.subscribe(start, poll_interval=0.05)
        got: list[Event] = []
        try:
            got.append((await asyncio.wait_for(anext(feed), 20))[1])
            await writer.erase(unrelated)
            while got[-1].data.get("text") != "last":
                got.append((await asyncio.wait_for(anext(feed), 20))[1])
        finally:
            await feed.aclose()  # type: ignore[attr-defined]
    assert [e.session for e in got if e.session in (keep, other)] == [keep, keep, other, *[other] * 6, keep]


async def test_a_subscription_creates_no_file(tmp_path: Path, session_id: str) -> None:
    """Reading creates nothing: the erasure counter beside an SQLite database is the first erase's to create."""
    async with await open_store(f"sqlite:///{tmp_path}/calls.db") as store:
        await store.append([started(session_id)])
        feed = store.subscribe(poll_interval=0.05)
        try:
            assert (await asyncio.wait_for(anext(feed), 20))[1].session == session_id
        finally:
            await feed.aclose()  # type: ignore[attr-defined]
        assert not (tmp_path / "calls.db-erasures").exists()
        await store.erase(session_id)
        assert (tmp_path / "calls.db-erasures").exists()


CARD = "4242 4242 4242 4242"


@pytest.mark.parametrize("redactor", ["this process", "another process"])
async def test_a_subscription_mid_page_hands_out_redacted_events_after_a_redact(
    store_url: str, session_id: str, redactor: str
) -> None:
    from calltape.eventstore.redact_stored import redact_session
    from calltape.redaction import Redactor

    call = session_id
    async with await open_store(store_url) as writer, await open_store(store_url) as reader:
        start = await writer.head()
        cards = [text(call, f"card {CARD}, item {i}.") for i in "abcdef"]
        await writer.append([started(call), text(call, "first"), *cards, text(call, "last")])
        feed: AsyncIterator[tuple[FeedPosition, Event]] = reader.subscribe(start, poll_interval=0.05, batch=500)
        got: list[Event] = []
        try:
            while not got or got[-1].data.get("text") != "first":  # the page is fetched: all in memory
                _, event = await asyncio.wait_for(anext(feed), 20)
                if event.session == call:
                    got.append(event)
            if redactor == "this process":
                assert (await redact_session(writer, call, Redactor(kinds=("card",)))).events == 6
            else:
                await _calltape(store_url, "redact", call, "--kinds", "card")
            while got[-1].type != "session.redacted":
                _, event = await asyncio.wait_for(anext(feed), 20)
                if event.session == call:
                    got.append(event)
        finally:
            await feed.aclose()  # type: ignore[attr-defined]
    shown = [e.data.get("text") for e in got if e.type == "user.text"]
    assert shown == ["first", *(f"card [card], item {i}." for i in "abcdef"), "last"]


async def test_a_subscription_whose_waiter_cannot_watch_still_hands_out_every_event_once(
    store_url: str, session_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter that cannot watch (LISTEN lost, counter file unreadable) moves its count at every call:
    the subscription then reads one event at a time, each read after the last move, and still makes
    progress: every event once, in order."""
    async with await open_store(store_url) as store:
        start = await store.head()
        await store.append([started(session_id), *texts(session_id, 20)])
        real = store.change_waiter
        reads: list[int] = []

        def blind() -> ChangeWaiter:
            waiter = real()
            calls = iter(range(1, 1 << 30))
            monkeypatch.setattr(waiter, "erasures", lambda: -next(calls))
            return waiter

        feed_rows = store.feed

        async def counted(*args: object, **kw: object) -> list[tuple[FeedPosition, Event]]:
            rows = await feed_rows(*args, **kw)  # type: ignore[arg-type]
            reads.append(len(rows))
            return rows

        monkeypatch.setattr(store, "change_waiter", blind)
        monkeypatch.setattr(store, "feed", counted)
        feed = store.subscribe(start, poll_interval=0.05, batch=500)
        got: list[Event] = []
        try:
            while len(got) < 21:
                _, event = await asyncio.wait_for(anext(feed), 20)
                if event.session == session_id:
                    got.append(event)
        finally:
            await feed.aclose()  # type: ignore[attr-defined]
    assert [e.data.get("text") for e in got[1:]] == [f"t{i}" for i in range(20)]
    assert len({e.id for e in got}) == 21
    assert sum(reads) <= 21 + 3 * 21, reads  # a few rows read per event, never the rest of the page each
