"""Barge-in exploration over a real Pipecat pipeline (the offline stand-ins of calltape.testing.pipecat):
it finds pipecat-ai#4997 (a queued function call of an interrupted generation runs anyway) in an agent
whose tools Pipecat runs alone, and passes once the tools are registered through calltape's guard."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytest.importorskip("pipecat")

from offline_pipecat import offline_worker
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.llm_service import FunctionCallParams

from calltape.adapters.pipecat import register_function
from calltape.checks import CheckOptions
from calltape.runtime import CallSession
from calltape.testing.explore import Exploration, Run, explore
from calltape.testing.pipecat import (
    Call,
    PipecatCaller,
    Say,
    ScriptedLLM,
)

pytestmark = pytest.mark.pipecat

HANG_UPS: dict[str, int] = {}
"""Per run (session id): how many times the agent really hung up."""


def bank_agent(call: CallSession, llm: ScriptedLLM, *, guarded: bool) -> PipelineWorker:
    """The agent under test: checks a balance, then hangs up; ``guarded`` registers the tools through
    calltape, else with Pipecat's own ``llm.register_function``."""
    context = LLMContext(messages=[{"role": "system", "content": "You are a bank's phone agent."}])

    async def check_balance(params: FunctionCallParams) -> None:
        await asyncio.sleep(0.2)
        await params.result_callback({"balance": 10})

    async def end_call(params: FunctionCallParams) -> None:
        HANG_UPS[call.session_id] = HANG_UPS.get(call.session_id, 0) + 1  # in production: hang up
        await params.result_callback({"ended": True})

    if guarded:
        register_function(llm, call, "check_balance", check_balance, cancel_on_interruption=False)
        register_function(llm, call, "end_call", end_call)
    else:
        llm.register_function("check_balance", check_balance, cancel_on_interruption=False)
        llm.register_function("end_call", end_call)
    return offline_worker(llm, context)


def scenario(*, guarded: bool) -> Any:
    async def run(call: CallSession) -> None:
        llm = ScriptedLLM(
            [[Say("Thank you for that."), Call("check_balance", "c1"), Call("end_call", "c2")], [Say("Sure.")]],
            run_in_parallel=False,  # Pipecat queues the calls and runs them one after the other
        )
        async with PipecatCaller(bank_agent(call, llm, guarded=guarded), call) as caller:
            await caller.says("thank you, that is all")
            await caller.settled()

    return run


def no_hang_up_after_a_barge_in(run: Run) -> None:
    """The user's own assertion: a caller who barged in on the goodbye is not hung up on."""
    calls = [e for e in run.events if e.type == "tool.call"]
    asking = {e.data["call"]: e.data["reply"] for e in calls if e.data["name"] == "end_call"}
    cut = {e.data.get("reply"): e.seq or 0 for e in run.events if e.type == "interruption"}
    started = {e.data["call"]: e.seq or 0 for e in run.events if e.type == "tool.started" and e.data["call"] in asking}
    for call_id, reply in asking.items():
        if reply in cut and started.get(call_id, 1 << 62) > cut[reply]:
            # the goodbye was cut before the hang-up started: the caller must still be on the line
            assert not HANG_UPS.get(run.events[0].session), "the agent hung up on a caller who had barged in"


async def _explore(guarded: bool) -> Exploration:
    HANG_UPS.clear()  # run sessions are named by boundary: the same names in every exploration
    return await explore(
        scenario(guarded=guarded),
        assertions=no_hang_up_after_a_barge_in,
        # Runs share a loaded CI machine: fewer pipelines at a time keep each one's latencies close to
        # a real call's (no slower overall), and the bot gets 2 s of wall time to fall silent.
        concurrency=8,
        options=CheckOptions(talk_over_ms=2000),
    )


async def test_exploration_finds_the_queued_call_of_an_interrupted_generation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exploration = await _explore(guarded=False)
    assert not exploration.baseline.failed, exploration.baseline.describe()
    assert HANG_UPS[exploration.baseline.events[0].session] == 1  # uninterrupted, the goodbye hangs up
    failures = exploration.failures
    assert failures, "a barge-in while check_balance runs must let the queued end_call run anyway"
    for run in failures:
        assert "late-start" in {v.rule for v in run.violations}, run.describe()
        assert any("hung up on a caller" in p for p in run.problems), run.describe()
    with pytest.raises(AssertionError, match=r"runs failed\n[^\n]+\n  a barge-in at boundary \d+"):
        exploration.assert_ok()
    assert "calltape: exploration report" in capsys.readouterr().err


async def test_the_guarded_agent_passes_every_boundary() -> None:
    started = time.perf_counter()
    exploration = await _explore(guarded=True)
    exploration.assert_ok()
    assert len(exploration.runs) >= 20
    # not vacuous: some barge-ins cut the goodbye, and then the queued hang-up never started
    not_run = [
        r
        for r in exploration.runs
        if any(e.type == "tool.cancelled" and e.data.get("outcome") == "not_run" for e in r.events)
    ]
    assert not_run and all(not HANG_UPS.get(r.events[0].session) for r in not_run)
    # without rebuild= PipecatCaller cannot carry a drop over to a new pipeline: no drop runs, and the note says so
    assert [r for r in exploration.runs if r.dropped] == []
    assert len(exploration.notes) == 1 and "does not carry a drop" in exploration.notes[0]
    assert time.perf_counter() - started < 120
