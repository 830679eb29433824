"""Sweeping a team's existing, unmodified Pipecat Evals scenario file (tests/testing/evals/): as
written, then once per event boundary with a barge-in and once per tool call with a drop and resume,
every rule of ``calltape check`` on every run, the scenario's own expectations kept."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pipecat")

from offline_pipecat import offline_worker
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.llm_service import FunctionCallParams

import calltape
from calltape.adapters.pipecat import register_function
from calltape.checks import CheckOptions
from calltape.runtime import CallSession
from calltape.testing.pipecat import Call, Say, ScriptedLLM
from calltape.testing.sweep import sweep_pipecat_evals

pytestmark = pytest.mark.pipecat

SCENARIOS = Path(__file__).parent / "evals" / "charge_order.yaml"
CHARGES: dict[str, int] = {}
BUSY_MACHINE = CheckOptions(talk_over_ms=2000)  # wall-clock thresholds, on a busy CI machine

MODEL = [
    [Say("Charging order 42 now."), Call("charge_card", "c1", {"order": "42"})],
    [Say("Done: your card is charged.")],
    [Say("Goodbye, and thank you.")],
]


def shop_bot(call: CallSession, llm: ScriptedLLM, context: LLMContext) -> PipelineWorker:
    """The team's bot: its pipeline around the given LLM, with its charge_card tool under calltape."""

    async def charge_card(params: FunctionCallParams) -> None:
        CHARGES[call.session_id] = CHARGES.get(call.session_id, 0) + 1  # in production: the payment API
        await params.result_callback({"charged": params.arguments["order"]})

    register_function(llm, call, "charge_card", charge_card)
    return offline_worker(llm, context)


async def test_the_unmodified_scenario_file_is_swept() -> None:
    started = time.perf_counter()
    sweeps = await sweep_pipecat_evals(SCENARIOS, shop_bot, llm=MODEL, options=BUSY_MACHINE)
    took = time.perf_counter() - started
    (sweep,) = sweeps.values()
    print(f"\nPipecat Evals sweep: {len(sweep.runs)} runs in {took:.1f} s")  # the figure for the docs
    assert list(sweeps) == ["charge_order/charge"]
    sweep.assert_ok()
    baseline = sweep.runs[0]
    assert baseline.session not in sweep.unmet  # the scenario's expectations hold as written
    assert CHARGES[baseline.session] == 1
    drops = [r for r in sweep.runs if r.dropped]
    barge_ins = [r for r in sweep.runs if r.boundary is not None]
    assert len(drops) == 1 and len(barge_ins) == len(baseline.events) - 2
    assert any(e.type == "interruption" for r in barge_ins for e in r.events)
    notes = "\n".join(sweep.notes)
    assert "eval: criteria (an LLM judge) (1 in the scenario)" in notes
    assert "within_ms: budgets" in notes


async def test_an_expectation_the_bot_breaks_fails_the_run_as_written() -> None:
    wrong: list[list[Any]] = [
        [Say("Charging order 43 now."), Call("charge_card", "c1", {"order": "43"})],
        [Say("Done: your card is charged.")],
        [Say("Goodbye.")],
    ]
    sweeps = await sweep_pipecat_evals(SCENARIOS, shop_bot, llm=wrong, drops=False)
    (sweep,) = sweeps.values()
    assert sweep.runs[0].problems == [
        "assertion failed: the test's own expectation failed: turn 1, expectation 2 (function_call): "
        "the expected calls were not all made"
    ]
    with pytest.raises(AssertionError, match="the uninterrupted run"):
        sweep.assert_ok()


def charging_bot(*, careless: bool) -> Any:
    """The team's bot with its card charge as a heard-first effect (SPEC section 8): through
    ``calltape.effect``, or (``careless``) recorded by hand, with no look at whether the caller heard
    the announcement or cut in."""

    def build(call: CallSession, llm: ScriptedLLM, context: LLMContext) -> PipelineWorker:
        async def charge(order: str) -> dict[str, str]:
            CHARGES[call.session_id] = CHARGES.get(call.session_id, 0) + 1  # the payment API
            return {"charged": order}

        async def charge_card(params: FunctionCallParams) -> None:
            order = str(params.arguments["order"])
            if careless:
                base = {"call": params.tool_call_id, "name": "charge", "key": f"order-{order}"}
                call.emit("tool.effect", {**base, "phase": "started", "heard": True})
                output = await charge(order)
                call.emit("tool.effect", {**base, "phase": "done", "output": output})
            else:
                output = await calltape.effect("charge", f"order-{order}", lambda: charge(order), heard=True)
            await params.result_callback(output)

        register_function(llm, call, "charge_card", charge_card)
        return offline_worker(llm, context)

    return build


async def test_the_sweep_finds_a_careless_charge_with_no_assertion_and_passes_the_effect_api() -> None:
    CHARGES.clear()
    (careless,) = (
        await sweep_pipecat_evals(SCENARIOS, charging_bot(careless=True), llm=MODEL, options=BUSY_MACHINE)
    ).values()
    groups = careless.exploration.by_rule()
    assert "unheard-effect" in groups, careless.exploration.summary()
    assert all(CHARGES.get(run.session) for run, _ in groups["unheard-effect"])  # each one did charge
    CHARGES.clear()
    (right,) = (
        await sweep_pipecat_evals(SCENARIOS, charging_bot(careless=False), llm=MODEL, options=BUSY_MACHINE)
    ).values()
    right.assert_ok()
    assert CHARGES.get(right.runs[0].session) == 1  # the run as written charges, once
    assert any(not CHARGES.get(r.session) for r in right.runs[1:])  # a cut announcement: no charge


async def test_the_scenarios_own_barge_in_is_kept_and_a_simulation_is_left_out() -> None:
    model = [
        [Say("Your order 42 holds a blue kettle, a red teapot and four cups, and it ships on Monday from our shop.")],
        [Say("Charging it now."), Call("charge_card", "c1", {"order": "42"})],
        [Say("Your card is charged.")],
    ]
    path = SCENARIOS.parent / "interrupt.yaml"
    sweeps = await sweep_pipecat_evals(path, shop_bot, llm=model, drops=False, options=BUSY_MACHINE)
    assert list(sweeps) == ["interrupt/cut_in"]
    (sweep,) = sweeps.values()
    sweep.assert_ok()
    baseline = sweep.runs[0]
    assert baseline.session not in sweep.unmet  # bot_interrupted, the call and the reply, as written
    # the second turn was sent while the first reply played (send_after), and cut it
    (cut,) = [e for e in baseline.events if e.type == "interruption"]
    first_reply = next(e.data["reply"] for e in baseline.events if e.type == "agent.reply.started")
    assert cut.data.get("reply") in (None, first_reply)
    assert baseline.reply_of("c1") != first_reply and not baseline.played(first_reply)
    assert "simulated scenarios not swept (an LLM plays the caller): interrupt/caller_in_a_hurry" in sweep.notes
