"""Interruption-aware waits (SPEC section 3): a real asyncio barge-in releases a playout waiter within
milliseconds, never after a fixed timeout or the end of the audio."""

from __future__ import annotations

import asyncio
import time

import pytest
from runtime_support import live_call, log_of, reply

from calltape.eventstore import EventStore
from calltape.runtime import Interrupted

PLAYOUT_SECONDS = 3.0  # how long the simulated audio would play if nothing interrupted it


async def _playing(call, rid: str = "r1", text: str = "Your table for two is booked for eight tonight.") -> None:  # type: ignore[no-untyped-def]
    reply(call, rid, text)
    call.emit("agent.speech.started", {"reply": rid})


async def test_interrupt_releases_the_waiter_within_milliseconds(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        await _playing(call)

        async def audio() -> None:  # the TTS would report the end of playout only seconds later
            await asyncio.sleep(PLAYOUT_SECONDS)
            call.emit("agent.speech.ended", {"reply": "r1", "interrupted": False})

        player = asyncio.create_task(audio())
        waiter = asyncio.create_task(call.wait_for_playout("r1"))
        await asyncio.sleep(0.02)
        assert not waiter.done()

        started = time.perf_counter()
        call.interrupt(heard="Your table for two")
        with pytest.raises(Interrupted) as caught:
            await waiter
        released = time.perf_counter() - started
        player.cancel()
        assert released < 0.05, f"waiter released after {released * 1000:.1f} ms"
        assert caught.value.reply == "r1" and "interrupted" in str(caught.value)

        (figures,) = [r.figures for r in live.of("waiter_released")]
        assert figures["reply"] == "r1"
        assert 0 <= figures["release_ms"] < 50 and figures["waited_ms"] >= 15
        await live.recorder.flush()
        kinds = [e.data["kind"] for e in await log_of(store, session_id) if e.type == "x.recovery"]
        assert kinds == ["waiter_released"]


async def test_every_waiter_of_the_reply_is_released(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        await _playing(call)
        waiters = [asyncio.create_task(call.wait_for_playout()) for _ in range(5)]  # default: latest reply
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        call.interrupt()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert time.perf_counter() - started < 0.05
        assert all(isinstance(r, Interrupted) for r in results)
        assert len(live.of("waiter_released")) == 5


async def test_released_by_speech_ended_interrupted(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        await _playing(call)
        waiter = asyncio.create_task(call.wait_for_playout("r1"))
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        call.emit("agent.speech.ended", {"reply": "r1", "interrupted": True, "heard": "Your table"})
        with pytest.raises(Interrupted):
            await waiter
        assert time.perf_counter() - started < 0.05
        assert call.reply_interrupted("r1")


async def test_returns_normally_when_playout_ends(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        await _playing(call)
        waiter = asyncio.create_task(call.wait_for_playout("r1"))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        call.emit("agent.speech.ended", {"reply": "r1", "interrupted": False})
        assert await asyncio.wait_for(waiter, 1) is None
        assert live.of("waiter_released") == []
        # Once played out, waiting again returns at once.
        assert await asyncio.wait_for(call.wait_for_playout("r1"), 0.05) is None


async def test_raises_at_once_for_an_already_interrupted_reply(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        await _playing(call)
        call.interrupt()
        started = time.perf_counter()
        with pytest.raises(Interrupted):
            await call.wait_for_playout("r1")
        assert time.perf_counter() - started < 0.01


async def test_a_dropped_session_releases_its_waiters(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        await _playing(call)
        waiter = asyncio.create_task(call.wait_for_playout("r1"))
        await asyncio.sleep(0.01)
        await call.drop("transport lost")
        with pytest.raises(Interrupted):
            await asyncio.wait_for(waiter, 1)


async def test_wait_is_not_a_fixed_timeout(store: EventStore, session_id: str) -> None:
    """``timeout`` only bounds a playout that never ends; nothing else times the wait out."""
    async with live_call(store, session_id) as live:
        await _playing(live.call)
        with pytest.raises(TimeoutError):
            await live.call.wait_for_playout("r1", timeout=0.05)
        waiter = asyncio.create_task(live.call.wait_for_playout("r1"))
        await asyncio.sleep(0.3)
        assert not waiter.done()
        live.call.emit("agent.speech.ended", {"reply": "r1", "interrupted": False})
        await asyncio.wait_for(waiter, 1)


@pytest.mark.parametrize("modality", ["text", "voice"])
async def test_a_reply_with_nothing_to_play_releases_when_generated(
    store: EventStore, session_id: str, modality: str
) -> None:
    """A text session (no playout at all), or a reply that only calls tools: the waiter returns once
    the generation is done, instead of hanging until its timeout."""
    async with live_call(store, session_id, modality=modality) as live:
        call = live.call
        call.emit("agent.reply.started", {"reply": "r1"})
        waiter = asyncio.create_task(call.wait_for_playout("r1"))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        if modality == "text":
            call.emit("agent.text", {"reply": "r1", "text": "Done."})
        else:
            call.emit("tool.call", {"reply": "r1", "call": "t1", "name": "book", "arguments": {}})
        call.emit("agent.reply.done", {"reply": "r1"})
        assert await asyncio.wait_for(waiter, 1) is None


async def test_waiting_with_no_reply_returns(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        assert await asyncio.wait_for(live.call.wait_for_playout(), 0.05) is None
