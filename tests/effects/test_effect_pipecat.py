"""Issue 28's two bad tools on a real Pipecat pipeline (calltape's offline stand-ins), explored with no
assertion of the user's: a barge-in at every event boundary, a drop and resume (on a rebuilt pipeline)
while the tool runs. With ``calltape.effect`` the card is charged at most once and never unheard, even
with the tool declared idempotent; a tool that records its effect itself around the guard is caught by
``unheard-effect`` (it charges without waiting for the announcement) and ``double-effect`` (declared
idempotent, it charges again after the resume's retry)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pipecat")

from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.llm_service import FunctionCallParams
from testing.offline_pipecat import offline_worker

import calltape
from calltape.adapters.pipecat import register_function
from calltape.checks import CheckOptions
from calltape.runtime import CallSession, ToolSpec
from calltape.testing.explore import Exploration, explore
from calltape.testing.pipecat import Call, PipecatCaller, Say, ScriptedLLM

pytestmark = pytest.mark.pipecat

BANKS: dict[str, list[int]] = {}
IDEMPOTENT = {"charge_card": ToolSpec(idempotent=True, timeout=30)}


def billing_agent(call: CallSession, llm: ScriptedLLM, how: str, context: LLMContext | None = None) -> PipelineWorker:
    context = context or LLMContext(messages=[{"role": "system", "content": "You take payments."}])
    charges = BANKS.setdefault(call.session_id, [])

    async def charge(amount: int) -> dict[str, int]:
        charges.append(amount)
        return {"charged": amount}

    async def charge_card(params: FunctionCallParams) -> None:
        amount = int(params.arguments["amount"])
        if how == "effect":
            await params.result_callback(await calltape.effect("charge", "order-7", lambda: charge(amount), heard=True))
            return
        base = {"call": params.tool_call_id, "name": "charge", "key": "order-7"}
        call.emit("tool.effect", {**base, "phase": "started", "heard": True})  # says heard first, does not wait
        await params.result_callback(await charge(amount))
        call.emit("tool.effect", {**base, "phase": "done"})

    register_function(llm, call, "charge_card", charge_card, cancel_on_interruption=False)
    return offline_worker(llm, context)


def scenario(how: str) -> Any:
    async def run(call: CallSession) -> None:
        llm = ScriptedLLM(
            [
                [Say("I am charging 40 dollars to your card now."), Call("charge_card", "c1", {"amount": 40})],
                [Say("Done.")],
            ]
        )

        def rebuild(context: LLMContext) -> PipelineWorker:
            return billing_agent(call, ScriptedLLM(list(llm.turns)), how, context)

        async with PipecatCaller(billing_agent(call, llm, how), call, rebuild=rebuild) as caller:
            await caller.says("please pay my order seven")
            await caller.settled()

    return run


async def explored(how: str, tools: dict[str, ToolSpec] | None = None) -> Exploration:
    BANKS.clear()
    return await explore(scenario(how), tools=tools, concurrency=4, options=CheckOptions(talk_over_ms=2000))


def effect_rules(exploration: Exploration) -> set[str]:
    return {v.rule for run in exploration.runs for v in run.violations if v.rule.endswith("-effect")}


def heard(run: Any) -> bool:
    reply = next(e.data.get("reply") for e in run.events if e.type == "tool.call")
    return any(
        e.type == "agent.speech.ended" and e.data["reply"] == reply and not e.data["interrupted"] for e in run.events
    )


async def test_with_the_effect_api_never_twice_never_unheard() -> None:
    for tools in (None, IDEMPOTENT):
        exploration = await explored("effect", tools)
        assert effect_rules(exploration) == set(), [r.describe() for r in exploration.failures]
        for run in exploration.runs:
            charges = BANKS[run.events[0].session]
            assert len(charges) <= 1 and (not charges or heard(run)), run.describe()
        assert any(BANKS.values())


async def test_a_tool_recording_its_effect_around_the_guard_is_caught() -> None:
    exploration = await explored("recorded", IDEMPOTENT)
    rules = effect_rules(exploration)
    assert "unheard-effect" in rules, [r.describe() for r in exploration.failures]
    doubled = [r for r in exploration.runs if any(v.rule == "double-effect" for v in r.violations)]
    assert doubled and all(BANKS[r.events[0].session] == [40, 40] for r in doubled)
