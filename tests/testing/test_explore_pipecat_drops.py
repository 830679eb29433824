"""Drop runs over a real Pipecat pipeline: with ``PipecatCaller(..., rebuild=...)`` exploration drops
the call while the tool runs, the lost pipeline is cut off and cancelled, and a new pipeline built on
the resumed call's settled context carries the call on at epoch 2. It finds a booking tool declared
idempotent (the resume retries it: two bookings) and passes the same agent with the tool declared as
it is; without ``rebuild`` there are no drop runs and the exploration's notes say so."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("pipecat")

from offline_pipecat import offline_worker
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.llm_service import FunctionCallParams

from calltape import ToolSpec
from calltape.adapters.pipecat import register_function
from calltape.runtime import CallSession
from calltape.testing.explore import Exploration, Run, explore
from calltape.testing.pipecat import (
    Call,
    PipecatCaller,
    Say,
    ScriptedLLM,
)

pytestmark = pytest.mark.pipecat

BOOKINGS: Counter[str] = Counter()
"""Per run (session id): how many tables the agent really booked."""

RECEIVED: dict[str, list[list[dict[str, Any]]]] = {}
"""Per run: the contexts the resumed pipeline's LLM was sent."""


def restaurant_agent(call: CallSession, llm: ScriptedLLM, context: LLMContext | None = None) -> PipelineWorker:
    """The agent under test: books a table under calltape's guard (``context``: a resumed call's)."""
    context = context or LLMContext(messages=[{"role": "system", "content": "You book tables."}])

    async def book_table(params: FunctionCallParams) -> None:
        await asyncio.sleep(0.1)  # the booking API
        BOOKINGS[call.session_id] += 1
        await params.result_callback({"reference": "BK-1"})

    register_function(llm, call, "book_table", book_table, cancel_on_interruption=False)
    return offline_worker(llm, context)


def scenario(*, carries: bool) -> Any:
    async def run(call: CallSession) -> None:
        llm = ScriptedLLM([[Say("One moment."), Call("book_table", "c1", {"people": 2})], [Say("All set.")]])

        def rebuild(context: LLMContext) -> PipelineWorker:
            # the lost pipeline's processors cannot join a new one: a new LLM with what is left of the script
            resumed = ScriptedLLM(list(llm.turns))
            RECEIVED[call.session_id] = resumed.received
            return restaurant_agent(call, resumed, context)

        async with PipecatCaller(restaurant_agent(call, llm), call, rebuild=rebuild if carries else None) as caller:
            await caller.says("a table for two at eight")
            await caller.settled()

    return run


def booked_at_most_once(run: Run) -> None:
    """The user's own assertion: one booking per call, whatever happened to the call."""
    session = run.events[0].session
    assert BOOKINGS[session] <= 1, f"booked {BOOKINGS[session]} times"


async def _explore(spec: ToolSpec, *, carries: bool = True) -> Exploration:
    BOOKINGS.clear()  # run sessions are named by boundary: the same names in every exploration
    RECEIVED.clear()
    return await explore(
        scenario(carries=carries), assertions=booked_at_most_once, tools={"book_table": spec}, concurrency=8
    )


def drop_run(exploration: Exploration) -> Run:
    (run,) = [r for r in exploration.runs if r.dropped is not None]
    assert run.dropped == "c1" and exploration.notes == []
    return run


async def test_a_booking_declared_idempotent_runs_twice_after_the_resume() -> None:
    exploration = await _explore(ToolSpec(idempotent=True))  # the bug: booking twice books two tables
    assert not exploration.baseline.failed, exploration.baseline.describe()
    run = drop_run(exploration)
    assert run.resume is not None and [t["decision"] for t in run.resume["tools"]] == ["retry"]
    assert run.failed and len(run.problems) == 1, run.describe()
    assert run.problems[0].startswith("assertion failed: booked 2 times")
    assert [r for r in exploration.failures if r.dropped is None] == []  # the barge-ins are fine
    with pytest.raises(AssertionError, match=r"\n  a drop and resume while tool call c1 ran \(landed after"):
        exploration.assert_ok()


async def test_the_booking_declared_as_it_is_passes_and_a_new_pipeline_carries_the_call() -> None:
    exploration = await _explore(ToolSpec())
    exploration.assert_ok()
    run = drop_run(exploration)
    assert run.resume is not None and [t["decision"] for t in run.resume["tools"]] == ["unknown"]
    session = run.events[0].session
    assert BOOKINGS[session] == 1  # booked once before the drop, never again
    types = [e.type for e in run.events]
    dropped, resumed = types.index("session.dropped"), types.index("session.resumed")
    assert types[dropped:resumed] == ["session.dropped", "interruption", "tool.cancelled"]
    # the new pipeline took the call on at epoch 2 and spoke first, from the settled context
    after = [e for e in run.events[resumed + 1 :] if not e.type.startswith("x.")]
    assert {e.epoch for e in after} == {2}
    spoken = [e for e in after if e.type != "agent.text"]
    assert [e.type for e in spoken] == [
        "agent.reply.started",
        "agent.reply.done",
        "agent.speech.started",
        "agent.speech.progress",
        "agent.speech.ended",
        "session.ended",
    ]
    assert "".join(e.data["text"] for e in after if e.type == "agent.text") == "All set."
    (sent,) = RECEIVED[session]
    outputs = [m for m in sent if m.get("role") == "tool"]
    assert [m["tool_call_id"] for m in outputs] == ["c1"] and "unknown" in outputs[0]["content"]


async def test_without_rebuild_there_are_no_drop_runs_and_the_notes_say_so() -> None:
    exploration = await _explore(ToolSpec(), carries=False)
    exploration.assert_ok()
    assert [r for r in exploration.runs if r.dropped] == []
    assert len(exploration.notes) == 1 and "does not carry a drop" in exploration.notes[0]
    assert "PipecatCaller: pass rebuild=" in exploration.notes[0]
