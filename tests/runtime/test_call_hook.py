"""The live call's public hook: listeners told of each folded event, and one interceptor that may
hold back, release or discard what the call writes and wraps each tool run."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest
from runtime_support import live_call, reply

from calltape.events import Event
from calltape.eventstore import EventStore
from calltape.runtime import CallInterceptor, ToolOutcome, Verdict, resume


class Holding(CallInterceptor):
    """Holds every event while ``holding``; discards the types in ``lose``; logs each tool run."""

    def __init__(self) -> None:
        self.holding = True
        self.lose: set[str] = set()
        self.seen: list[str] = []
        self.runs: list[tuple[str, str, str]] = []

    def intercept(self, event: Event) -> Verdict:
        self.seen.append(event.type)
        if event.type in self.lose:
            return Verdict.DISCARD
        return Verdict.HOLD if self.holding else Verdict.RECORD

    async def around_tool(self, call_id: str, name: str, run: Callable[[], Awaitable[ToolOutcome]]) -> ToolOutcome:
        outcome = await run()
        self.runs.append((call_id, name, outcome.status))
        return outcome


async def _logged(store: EventStore, session_id: str) -> list[str]:
    return [e.type for e in await store.read(session_id)]


async def test_a_listener_sees_each_event_in_order_once_it_is_folded(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        everything: list[str] = []
        speech: list[tuple[str, bool]] = []
        call.add_listener(lambda e: everything.append(e.type))
        # a typed listener: only its types; the fold already holds the event when it is told
        call.add_listener(lambda e: speech.append((e.type, call.fold.knows(e.id))), "user.transcript")
        call.emit("user.speech.started", {})
        call.emit("user.transcript", {"text": "a table for four", "final": True})
        await call.emit_durable("user.speech.stopped", {})
        reply(call, "r1", "Booked.")
        assert everything == [
            "user.speech.started",
            "user.transcript",
            "user.speech.stopped",
            "agent.reply.started",
            "agent.text",
            "agent.reply.done",
        ]
        assert speech == [("user.transcript", True)]
        await live.recorder.flush()
        assert (await _logged(store, session_id))[1:] == everything


async def test_a_removed_listener_is_told_nothing_more(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        got: list[str] = []

        def listener(event: Event) -> None:
            got.append(event.type)

        call.add_listener(listener, "user.text")
        call.add_listener(listener)
        call.emit("user.text", {"text": "hi"})
        assert got == ["user.text", "user.text"]  # two registrations, told twice
        call.remove_listener(listener)
        call.emit("user.text", {"text": "again"})
        assert got == ["user.text", "user.text"]
        with pytest.raises(ValueError, match="not a listener"):
            call.remove_listener(listener)
        # the runtime's own listeners are still there: a barge-in releases a playout waiter
        reply(call, "r2", "One moment", done=False)
        waiter = asyncio.ensure_future(call.wait_for_playout("r2"))
        await asyncio.sleep(0)
        call.interrupt("r2")
        with pytest.raises(Exception, match="r2"):
            await asyncio.wait_for(waiter, 1)


async def test_a_failing_listener_never_fails_the_write(
    store: EventStore, session_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with live_call(store, session_id) as live:
        call = live.call

        def broken(event: Event) -> None:
            raise RuntimeError(event.data["text"])

        call.add_listener(broken, "user.text")
        with caplog.at_level(logging.ERROR, logger="calltape.runtime.session"):
            call.emit("user.text", {"text": "my card is 4242"})
        assert [r.getMessage() for r in caplog.records] == [
            f"calltape: a listener of session {session_id} failed on user.text (RuntimeError)"
        ]
        assert "4242" not in caplog.text  # never the event's content in a log line
        await live.recorder.flush()
        assert (await _logged(store, session_id))[-1] == "user.text"


async def test_an_interceptor_holds_events_and_releases_them_in_order(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        told: list[str] = []
        call.add_listener(lambda e: told.append(e.data["text"]), "user.text")
        hold = Holding()
        call.intercept(hold)
        call.emit("user.text", {"text": "first"})
        durable = asyncio.ensure_future(call.emit_durable("user.text", {"text": "second"}))
        await asyncio.sleep(0)  # the durable write is under way: held
        call.emit("user.text", {"text": "third"})
        await live.recorder.flush()
        await asyncio.sleep(0.05)
        # held: in the live context and told to listeners, not in the log; the durable write waits
        assert call.held == 3 and not durable.done()
        assert [m["content"] for m in call.context("openai") if m.get("role") == "user"] == ["first second third"]
        assert told == ["first", "second", "third"]
        assert await _logged(store, session_id) == ["session.started"]
        hold.holding = False
        assert call.release() == 3
        written = await asyncio.wait_for(durable, 5)
        assert written.data == {"text": "second"} and written.seq is not None
        await live.recorder.flush()
        logged = await store.read(session_id)
        assert [e.data.get("text") for e in logged[1:]] == ["first", "second", "third"]
        assert told == ["first", "second", "third"]  # released events are not told again
        assert call.held == 0


async def test_an_interceptor_discards_events_and_wraps_tool_runs(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        hold = Holding()
        hold.holding = False
        hold.lose = {"user.text"}
        call.intercept(hold)
        lost = call.emit("user.text", {"text": "never said"})
        assert not call.fold.knows(lost.id)
        assert (await call.emit_durable("user.text", {"text": "nor this"})).seq is None

        async def book() -> dict[str, int]:
            return {"table": 4}

        outcome = await call.run_tool("t1", "book", {"guests": 4}, book)
        assert outcome.output == {"table": 4}
        assert hold.runs == [("t1", "book", "completed")]
        await live.recorder.flush()
        assert await _logged(store, session_id) == ["session.started", "tool.call", "tool.started", "tool.result"]
        assert hold.seen == ["user.text", "user.text", "tool.call", "tool.started", "tool.result"]


async def test_one_interceptor_at_a_time_and_removing_it_releases(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        hold = Holding()
        call.intercept(hold)
        call.intercept(hold)  # the same one again is harmless
        with pytest.raises(ValueError, match="already has an interceptor"):
            call.intercept(Holding())
        call.emit("user.text", {"text": "held"})
        call.intercept(None)
        assert call.held == 0
        call.emit("user.text", {"text": "after"})
        await live.recorder.flush()
        assert [e.data.get("text") for e in await store.read(session_id)][1:] == ["held", "after"]
        assert hold.seen == ["user.text"]


async def test_held_events_go_to_the_resumed_epoch_after_reattach(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        hold = Holding()
        call.intercept(hold)
        call.emit("user.text", {"text": "said while the call was lost"})
        await resume(store, session_id, "triage-2")
        await call.reattach()
        assert call.epoch == 2 and call.agent == "triage-2"
        # the rebuilt live context still has what is held
        assert [m["content"] for m in call.context("openai") if m.get("role") == "user"] == [
            "said while the call was lost"
        ]
        hold.holding = False
        call.release()
        call.emit("user.text", {"text": "and then"})
        await live.recorder.flush()
        logged = await store.read(session_id)
        assert [(e.type, e.epoch) for e in logged if e.type == "user.text"] == [("user.text", 2), ("user.text", 2)]
        assert not live.rejected


async def test_a_part_is_made_once_per_call_and_belongs_to_it(store: EventStore, session_id: str) -> None:
    """Adapters and the harness keep their per-call object in the call (no registry outside it)."""

    class Part:
        def __init__(self, call: object) -> None:
            self.call = call

    async with live_call(store, session_id) as live:
        first = live.call.part(Part)
        assert first.call is live.call
        assert live.call.part(Part) is first
        other = live.call.part(lambda call: [call])  # any one-argument factory is its own key
        assert other == [live.call]
