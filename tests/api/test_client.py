"""calltape.connect(): one object owning the store, the recorder and the calls, on every backend,
including the in-memory SQLite database for tests."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

import calltape
from calltape.errors import CalltapeError, FencedWrite, SessionNotFound
from calltape.eventstore import open_store
from calltape.runtime import ToolSpec

MEMORY = "sqlite:///:memory:"


async def test_a_call_recorded_through_connect_is_in_the_store(store_url: str, session_id: str) -> None:
    async with calltape.connect(store_url) as ct:
        call = await ct.start_call(session_id, agent="booking", instructions="You book tables.")
        assert ct.calls[session_id] is call
        call.emit("user.text", {"text": "a table for two"})
        await call.end()
    store = await open_store(store_url)
    try:
        events = await store.read(session_id)
    finally:
        await store.close()
    assert [e.type for e in events] == ["session.started", "user.text", "session.ended"]


async def test_closing_drains_the_recorder_before_closing_the_store(store_url: str, session_id: str) -> None:
    order: list[tuple[str, int]] = []
    async with calltape.connect(store_url, max_delay=0.5) as ct:
        call = await ct.start_call(session_id, agent="booking")
        for i in range(500):
            call.emit("user.text", {"text": f"t{i}"})  # queued, not yet written (max_delay 0.5 s)
        recorder, store = ct.recorder, ct.store
        assert recorder.pending > 0
        real_close = store.close

        async def close() -> None:
            order.append(("store.close", recorder.pending))
            await real_close()

        store.close = close  # type: ignore[method-assign]
    assert order == [("store.close", 0)]
    check = await open_store(store_url)
    try:
        assert len(await check.read(session_id)) == 501
    finally:
        await check.close()


async def test_awaiting_connect_opens_it_and_close_is_idempotent(tmp_path, session_id: str) -> None:
    ct = await calltape.connect(f"sqlite:///{tmp_path}/calls.db")
    await ct.start_call(session_id, agent="a")
    await ct.close()
    await ct.close()
    with pytest.raises(CalltapeError, match="closed"):
        ct.store  # noqa: B018
    with pytest.raises(CalltapeError, match="closed"):
        await ct.open()


def test_store_before_open_says_how_to_open() -> None:
    ct = calltape.connect(MEMORY)
    with pytest.raises(CalltapeError, match="not open yet"):
        ct.recorder  # noqa: B018


async def test_in_memory_store_is_real_and_private(session_id: str) -> None:
    async with calltape.connect(MEMORY) as a, calltape.connect("sqlite://") as b:
        call = await a.start_call(session_id, agent="booking")
        # concurrent writers and readers share the one in-memory connection without tripping
        await asyncio.gather(
            *(call.emit_durable("user.text", {"text": f"t{i}"}) for i in range(30)),
            *(a.store.read(session_id) for _ in range(10)),
        )
        assert (await a.store.session_info(session_id)).last_seq == 31  # type: ignore[union-attr]
        assert await b.store.sessions() == []  # another in-memory store is another database
        fold = await a.context(session_id)
        assert fold.seq == 31
    async with calltape.connect(MEMORY) as c:
        assert await c.store.sessions() == []  # gone once closed


async def test_attach_and_resume_through_the_object(store_url: str, session_id: str) -> None:
    spec = {"lookup": ToolSpec(idempotent=True)}
    async with calltape.connect(store_url) as first:
        call = await first.start_call(session_id, agent="triage", tools=spec)
        call.emit("user.text", {"text": "where is my order"})
        await call.drop("transport lost")
    async with calltape.connect(store_url) as second:
        plan, resumed = await second.resume_call(session_id, agent="backup", tools=spec)
        assert plan.epoch == 2 and resumed.epoch == 2 and resumed.agent == "backup"
        assert second.calls[session_id] is resumed
        again = await second.attach_call(session_id)
        assert again.epoch == 2
        with pytest.raises(SessionNotFound):
            await second.attach_call(f"missing-{uuid.uuid4().hex}")


async def test_a_writer_of_the_old_epoch_is_fenced_after_resume_call(session_id: str) -> None:
    async with calltape.connect(MEMORY) as ct:
        old = await ct.start_call(session_id, agent="triage")
        await ct.resume_call(session_id, agent="backup")
        with pytest.raises(FencedWrite):
            await old.emit_durable("user.text", {"text": "zombie"})


async def test_a_tool_that_raises_is_logged_with_its_traceback(
    session_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "card 4242 4242 4242 4242"

    async def body() -> None:
        raise ValueError(f"could not book for {secret}")

    async with calltape.connect(MEMORY) as ct:
        call = await ct.start_call(session_id, agent="booking")
        with caplog.at_level(logging.ERROR, logger="calltape"):
            outcome = await call.run_tool("c1", "book_table", {"note": secret}, body)
    assert outcome.status == "error" and outcome.output == {"error": f"could not book for {secret}"}
    [record] = [r for r in caplog.records if r.name.startswith("calltape.runtime")]
    assert record.levelno == logging.ERROR
    message = record.getMessage()
    assert "book_table" in message and "ValueError" in message
    assert secret not in message  # content only in the traceback, never in the line itself
    assert record.exc_info is not None and record.exc_info[0] is ValueError
