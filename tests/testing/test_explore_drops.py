"""Exploration drops the call while each tool runs, resumes it from the log and carries the scenario
on: it finds a tool that runs twice after the resume (a side-effecting tool declared idempotent) and a
call left without output (an agent running a retried tool by hand never runs it again), and passes
the same agents once their tools are declared and run under calltape's guard."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from calltape import CallSession, ToolSpec
from calltape.testing.explore import Run, explore


def ask(call: CallSession, name: str) -> None:
    """The scripted caller and the scripted LLM's first turn: one tool call."""
    call.emit("user.speech.started", {"source": "vad"})
    call.emit("user.transcript", {"text": "a table for two at eight", "final": True})
    call.emit("user.speech.stopped")
    call.emit("agent.reply.started", {"reply": "r1"})
    call.emit("tool.call", {"reply": "r1", "call": "c1", "name": name, "arguments": {"people": 2}})
    call.emit("agent.reply.done", {"reply": "r1"})


def answer(call: CallSession, text: str) -> None:
    """The LLM's second turn, from the tool's output."""
    if call.reply_interrupted("r1"):
        return
    call.emit("agent.reply.started", {"reply": "r2"})
    call.emit("agent.text", {"reply": "r2", "text": text})
    call.emit("agent.reply.done", {"reply": "r2"})
    call.emit("agent.speech.started", {"reply": "r2"})
    call.emit("agent.speech.ended", {"reply": "r2", "interrupted": False})


class Restaurant:
    """The agent's real tools, counting their side effects per run (session)."""

    def __init__(self) -> None:
        self.bookings: Counter[str] = Counter()

    def book_table(self, call: CallSession) -> Any:
        session = call.session_id

        async def body() -> dict[str, Any]:
            await asyncio.sleep(0.005)  # the booking API
            self.bookings[session] += 1
            return {"reference": "BK-1"}

        return body

    async def guarded(self, call: CallSession) -> None:
        ask(call, "book_table")
        outcome = await call.run_tool("c1", "book_table", {"people": 2}, self.book_table(call), reply="r1")
        answer(call, "Booked." if outcome.status == "completed" else "Let me check that booking went through.")

    def booked_at_most_once(self, run: Run) -> None:
        """The user's own assertion: one booking per call, whatever happened to the call."""
        session = run.events[0].session
        assert self.bookings[session] <= 1, f"booked {self.bookings[session]} times"


def drop_runs(runs: list[Run]) -> list[Run]:
    return [r for r in runs if r.dropped is not None]


async def test_a_side_effect_declared_idempotent_runs_twice_after_the_resume(
    capsys: pytest.CaptureFixture[str],
) -> None:
    restaurant = Restaurant()
    exploration = await explore(
        restaurant.guarded,
        assertions=restaurant.booked_at_most_once,
        tools={"book_table": ToolSpec(idempotent=True)},  # the bug: booking twice books two tables
        drops=True,
    )
    assert not exploration.baseline.failed, exploration.baseline.describe()
    (run,) = drop_runs(exploration.runs)
    assert run.dropped == "c1" and run.failed
    assert run.resume is not None and [t["decision"] for t in run.resume["tools"]] == ["retry"]
    assert len(run.problems) == 1 and run.problems[0].startswith("assertion failed: booked 2 times")
    assert [r for r in exploration.failures if r.dropped is None] == []  # the barge-ins are fine
    with pytest.raises(AssertionError, match=r"\n  a drop and resume while tool call c1 ran \(landed after"):
        exploration.assert_ok()
    err = capsys.readouterr().err
    assert "-- explored-drop-1: a drop and resume while tool call c1 ran" in err and "▶" in err


async def test_the_same_agent_with_the_tool_declared_as_it_is_passes() -> None:
    restaurant = Restaurant()
    exploration = await explore(
        restaurant.guarded, assertions=restaurant.booked_at_most_once, tools={"book_table": ToolSpec()}, drops=True
    )
    exploration.assert_ok()
    (run,) = drop_runs(exploration.runs)
    assert run.resume is not None and [t["decision"] for t in run.resume["tools"]] == ["unknown"]
    session = run.events[0].session
    assert restaurant.bookings[session] == 1  # ran once before the drop, never again
    types = [e.type for e in run.events]
    dropped, resumed = types.index("session.dropped"), types.index("session.resumed")
    assert types[dropped:resumed] == ["session.dropped", "tool.cancelled"]  # settled: reason dropped, unknown
    # the scenario carried on on the resumed call, at the new epoch, with the settled output
    after = [e for e in run.events[resumed + 1 :] if not e.type.startswith("x.")]
    assert [e.type for e in after][:3] == ["agent.reply.started", "agent.text", "agent.reply.done"]
    assert {e.epoch for e in after} == {2}
    assert after[1].data["text"] == "Let me check that booking went through."
    outputs = [i for i in run.context["items"] if i["type"] == "function_call_output"]
    assert [(o["call_id"], o["status"]) for o in outputs] == [("c1", "unknown")]


async def by_hand(call: CallSession) -> None:
    """An agent that runs its tool itself: ``tool.started``, the body, ``tool.result``."""
    ask(call, "lookup")
    call.emit("tool.started", {"call": "c1"})
    await asyncio.sleep(0.005)
    call.emit("tool.result", {"call": "c1", "output": {"free": True}})
    answer(call, "There is a table free.")


async def test_a_retried_call_nobody_runs_again_is_a_call_without_output() -> None:
    lookup = {"lookup": ToolSpec(idempotent=True)}  # safe to repeat: resume plans a retry
    exploration = await explore(by_hand, tools=lookup, drops=True)
    assert not exploration.baseline.failed
    (run,) = drop_runs(exploration.runs)
    assert run.resume is not None and [t["decision"] for t in run.resume["tools"]] == ["retry"]
    assert [v.rule for v in run.violations] == ["orphan-call"]
    assert "resumed" in str(run.violations[0]) or "ended" in str(run.violations[0])
    with pytest.raises(AssertionError, match="drop and resume while tool call c1 ran"):
        exploration.assert_ok()

    async def guarded(call: CallSession) -> None:
        ask(call, "lookup")

        async def body() -> dict[str, Any]:
            await asyncio.sleep(0.005)
            return {"free": True}

        await call.run_tool("c1", "lookup", {"people": 2}, body, reply="r1")
        answer(call, "There is a table free.")

    fixed = await explore(guarded, tools=lookup, drops=True)
    fixed.assert_ok()
    (run,) = drop_runs(fixed.runs)
    starts = [e.epoch for e in run.events if e.type == "tool.started"]
    assert starts == [1, 2]  # the retry ran under the same call id in the new epoch
    outputs = [i for i in run.context["items"] if i["type"] == "function_call_output"]
    assert [(o["status"], o["output"]) for o in outputs] == [("completed", {"free": True})]


async def test_one_drop_run_per_started_call_and_none_when_disabled() -> None:
    restaurant = Restaurant()

    async def two_tools(call: CallSession) -> None:
        await restaurant.guarded(call)
        call.emit("user.text", {"text": "and a cab"})
        call.emit("agent.reply.started", {"reply": "r3"})
        call.emit("tool.call", {"reply": "r3", "call": "c2", "name": "cab", "arguments": {}})
        call.emit("agent.reply.done", {"reply": "r3"})

        async def cab() -> str:
            await asyncio.sleep(0.001)
            return "on its way"

        await call.run_tool("c2", "cab", {}, cab, reply="r3")

    exploration = await explore(two_tools, assertions=restaurant.booked_at_most_once, drops=True)
    exploration.assert_ok()
    assert [r.dropped for r in drop_runs(exploration.runs)] == ["c1", "c2"]
    barge_ins = [r for r in exploration.runs[1:] if r.dropped is None]
    assert len(barge_ins) == len(exploration.baseline.events) - 2
    without = await explore(two_tools, drops=False)
    assert drop_runs(without.runs) == [] and len(without.runs) == len(exploration.runs) - 2


async def test_a_tool_that_finishes_before_any_await_is_not_dropped() -> None:
    async def instant(call: CallSession) -> None:
        ask(call, "lookup")
        call.emit("tool.started", {"call": "c1"})
        call.emit("tool.result", {"call": "c1", "output": {"free": True}})  # no await: nothing can land
        answer(call, "There is a table free.")
        await asyncio.sleep(0)

    exploration = await explore(instant, drops=True)
    exploration.assert_ok()
    (run,) = drop_runs(exploration.runs)
    assert run.after is None and run.resume is None
    assert "session.dropped" not in [e.type for e in run.events]
    assert "it did not land" in run.describe()
