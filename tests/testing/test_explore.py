"""Barge-in exploration finds pipecat#4997's shape (a queued call of an interrupted generation that
runs anyway) in an unguarded agent, and passes once the agent runs its tools under ``run_tool``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from calltape import CallSession, ToolSpec
from calltape.testing.dropresume import started_calls
from calltape.testing.explore import Run, explore

BOOKINGS: list[dict[str, Any]] = []


async def book_table() -> dict[str, Any]:
    """The agent's real tool (a side effect we must not repeat or run for a cancelled turn)."""
    await asyncio.sleep(0.01)
    booking = {"reference": f"BK-{len(BOOKINGS) + 1}"}
    BOOKINGS.append(booking)
    return booking


def turn(call: CallSession) -> None:
    """The scripted caller and the scripted LLM's first turn (the LLM stops streaming when cancelled)."""
    call.emit("user.speech.started", {"source": "vad"})
    call.emit("user.transcript", {"text": "a table for two at eight", "final": True})
    call.emit("user.speech.stopped")
    call.emit("agent.reply.started", {"reply": "r1"})
    steps: list[tuple[str, dict[str, Any]]] = [
        ("agent.text", {"reply": "r1", "text": "Booking that now."}),
        ("tool.call", {"reply": "r1", "call": "c1", "name": "book_table", "arguments": {"people": 2}}),
        ("agent.reply.done", {"reply": "r1"}),
    ]
    for kind, data in steps:
        if call.reply_interrupted("r1"):
            return
        call.emit(kind, data)


async def unguarded_agent(call: CallSession) -> None:
    """Runs the queued call whatever happened to its generation (the bug)."""
    turn(call)
    if call.call_state("c1") is None:
        return  # the generation was cut before it asked for the tool
    await asyncio.sleep(0)  # the function-call runner picks the call up later
    call.emit("tool.started", {"call": "c1"})
    output = await book_table()
    call.emit("tool.result", {"call": "c1", "output": output})


async def guarded_agent(call: CallSession) -> None:
    """The same agent with the tool under calltape's guard."""
    turn(call)
    await asyncio.sleep(0)
    await call.run_tool("c1", "book_table", {"people": 2}, book_table, reply="r1")


def no_booking_for_a_cancelled_turn(run: Run) -> None:
    """The user's own assertion: a booking exists only when the turn asking for it was not cut first."""
    outputs = [i for i in run.context["items"] if i["type"] == "function_call_output"]
    # a drop mid-tool (then a resume) leaves the booking's outcome unknown: never re-run blindly
    allowed = ("completed", "cancelled", "unknown") if run.dropped else ("completed", "cancelled")
    for output in outputs:
        assert output["status"] in allowed, output["status"]


async def test_exploration_finds_the_queued_call_of_an_interrupted_generation() -> None:
    exploration = await explore(unguarded_agent, assertions=no_booking_for_a_cancelled_turn)
    assert not exploration.baseline.failed, exploration.baseline.describe()
    failures = exploration.failures
    assert failures, "the barge-in between the call and its start must be found"
    # a barge-in between the queued call and its start cuts the generation, and the call runs anyway
    assert [r.after.split(",")[0] for r in failures if r.after] == ["agent.reply.done"] * len(failures)
    assert all({v.rule for v in r.violations} == {"late-start"} for r in failures)
    with pytest.raises(
        AssertionError, match=r"runs failed; the first: a barge-in at boundary \d+ \(landed after agent.reply.done"
    ):
        exploration.assert_ok()


async def test_the_guarded_agent_passes_every_boundary() -> None:
    started = time.perf_counter()
    exploration = await explore(guarded_agent, assertions=no_booking_for_a_cancelled_turn)
    exploration.assert_ok()
    # one run per event boundary of the uninterrupted run (session.started and session.ended aside),
    # and one drop and resume per tool call that started
    calls = started_calls(exploration.baseline.events)
    assert len(exploration.runs) == 1 + len(exploration.baseline.events) - 2 + len(calls)
    assert [r.dropped for r in exploration.runs if r.dropped] == calls != []
    assert any(r.interrupted or r.boundary for r in exploration.runs[1:])
    assert time.perf_counter() - started < 60


async def test_forty_boundaries_explore_in_seconds() -> None:
    async def long_agent(call: CallSession) -> None:
        for i in range(8):
            call.emit("user.transcript", {"text": f"question {i}", "final": True})
            call.emit("agent.reply.started", {"reply": f"r{i}"})
            if call.reply_interrupted(f"r{i}"):
                continue
            call.emit("agent.text", {"reply": f"r{i}", "text": "Let me see."})
            if call.reply_interrupted(f"r{i}"):
                continue
            call.emit("tool.call", {"reply": f"r{i}", "call": f"c{i}", "name": "lookup", "arguments": {"i": i}})
            call.emit("agent.reply.done", {"reply": f"r{i}"})
            await call.run_tool(f"c{i}", "lookup", {"i": i}, book_table, reply=f"r{i}")

    exploration = await explore(long_agent)
    exploration.assert_ok()
    assert len(exploration.runs) >= 41
    assert exploration.seconds < 60, exploration.seconds


async def test_a_failing_user_assertion_is_reported_with_its_instant() -> None:
    def never_interrupted(run: Run) -> None:
        assert not any(e.type == "interruption" for e in run.events), "the agent was interrupted"

    exploration = await explore(guarded_agent, assertions=never_interrupted)
    assert not exploration.baseline.failed
    assert all(r.failed for r in exploration.runs[1:])
    assert "assertion failed: the agent was interrupted" in exploration.failures[0].describe()


def test_tool_specs_are_untouched() -> None:
    assert ToolSpec().timeout > 0


async def test_virtual_time_explores_a_slow_scenario_in_no_wall_time() -> None:
    async def slow_agent(call: CallSession) -> None:
        call.emit("user.transcript", {"text": "book it", "final": True})
        call.emit("agent.reply.started", {"reply": "r1"})
        await asyncio.sleep(20)  # a long think: virtual seconds
        if not call.reply_interrupted("r1"):
            call.emit("agent.text", {"reply": "r1", "text": "Booked."})
            call.emit("agent.reply.done", {"reply": "r1"})

    started = time.perf_counter()
    exploration = await explore(slow_agent, virtual_time=True)
    exploration.assert_ok()
    assert len(exploration.runs) == 5  # the uninterrupted run and a barge-in after each of its 4 events
    assert time.perf_counter() - started < 15  # 5 runs of 20 s each, on a virtual clock
