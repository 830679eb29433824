"""The one emit path of a live call: built once, folded in the log's order, and a write the store
refuses (a fenced zombie) never left in the live context."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from runtime_support import assert_live_matches_log, live_call, reply

from calltape.errors import CalltapeError, FencedWrite
from calltape.events import Event
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.runtime import CallSession, resume


async def _until(predicate: Any, seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_a_refused_durable_write_leaves_the_live_context_unchanged(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as zombie:
        call = zombie.call
        reply(call, "r1", "Let me book that.", ("t1", "book", {"table": 4}))
        await call.emit_durable("tool.started", {"call": "t1"})
        await zombie.recorder.flush()
        # Another process takes the call over: this writer is now a zombie at epoch 1.
        await resume(store, session_id, "triage-2")
        before = call.context()
        before_openai = call.context("openai")
        with pytest.raises(FencedWrite):
            await call.emit_durable("tool.result", {"call": "t1", "output": {"booked": True}})
        # When the error is raised the live context is what it was: no output for t1, no zombie result.
        assert call.context("openai") == before_openai
        after = call.context()
        assert after["items"] == before["items"] and after["pending"] == before["pending"]
        assert after["agent"] == before["agent"] and after["epoch"] == before["epoch"] == 1
        state = call.call_state("t1")
        assert state is not None and state.status == "in_progress"
        assert zombie.of("fenced_write")[-1].figures["type"] == "tool.result"


async def test_a_refused_plain_emit_is_dropped_from_the_live_fold(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as zombie:
        call = zombie.call
        reply(call, "r1", "Hello.")
        await zombie.recorder.flush()
        await resume(store, session_id, "triage-2")
        before = call.context("openai")
        ghost = call.emit("agent.text", {"reply": "r2", "text": "I am a zombie"})
        assert call.fold.knows(ghost.id)  # folded at once, like every emit
        await zombie.recorder.flush()
        await _until(lambda: not call.fold.knows(ghost.id))
        assert call.context("openai") == before


async def test_the_live_fold_keeps_the_log_order_around_a_durable_write(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        reply(call, "r1", "Booking.", ("t1", "book", {}))
        durable = asyncio.ensure_future(call.emit_durable("tool.started", {"call": "t1"}))
        await asyncio.sleep(0)  # the durable write is queued; these come after it in the log
        call.emit("agent.speech.started", {"reply": "r1"})
        call.emit("user.speech.started", {})
        call.interrupt("r1", heard="Boo")
        await durable
        await call.emit_durable("tool.result", {"call": "t1", "output": {"ok": True}})
        call.emit("user.speech.stopped", {})
        native = await assert_live_matches_log(live, store, session_id)  # seq and last_clean_seq included
        assert native["clean"] is True


async def test_the_runtime_leaves_on_rejected_alone(store: EventStore, session_id: str) -> None:
    rejected: list[Event] = []

    def handler(events: Sequence[Event], error: CalltapeError) -> None:
        rejected.extend(events)

    async with Recorder(store, on_rejected=handler) as recorder:
        call = await CallSession.start(recorder, session_id, agent="triage")
        assert recorder.on_rejected is handler  # the session is told through recorder.watch instead
        await resume(store, session_id, "triage-2")
        ghost = call.emit("user.text", {"text": "still there?"})
        await recorder.flush()
        assert ghost.id in {e.id for e in rejected}  # the user's handler still hears of it
        await _until(lambda: not call.fold.knows(ghost.id))  # and the session dropped it from its fold


async def test_recorder_watch_tells_one_sessions_refusals_until_unwatched(store: EventStore, session_id: str) -> None:
    from calltape.events import make_event

    seen: list[tuple[list[Event], CalltapeError]] = []
    async with Recorder(store, on_rejected=lambda evs, err: None) as recorder:
        await recorder.append(make_event(session_id, "session.started", {"agent": "a"}, epoch=1))
        await resume(store, session_id, "b")
        stop = recorder.watch(session_id, lambda evs, err: seen.append((list(evs), err)))
        other = recorder.watch("another-session", lambda evs, err: pytest.fail("told about another session"))
        first = make_event(session_id, "user.text", {"text": "one"}, epoch=1)
        recorder.emit(first)
        await recorder.flush()
        assert [e.id for e in seen[0][0]] == [first.id] and isinstance(seen[0][1], FencedWrite)
        stop()
        other()
        recorder.emit(make_event(session_id, "user.text", {"text": "two"}, epoch=1))
        await recorder.flush()
        assert len(seen) == 1
        assert recorder._watchers == {}


async def test_submit_queues_before_it_is_awaited(store: EventStore, session_id: str) -> None:
    from calltape.events import make_event

    async with Recorder(store) as recorder:
        durable = make_event(session_id, "session.started", {"agent": "a"})
        committed = recorder.submit(durable)
        later = make_event(session_id, "user.text", {"text": "after"})
        recorder.emit(later)  # emitted after submit, before the await: must come after it in the log
        stored = await committed
        await recorder.flush()
        assert [e.id for e in await store.read(session_id)] == [durable.id, later.id]
        assert stored.seq == 1
