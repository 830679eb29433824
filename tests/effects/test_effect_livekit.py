"""Issue 28's two bad LiveKit tools, explored with no assertion of the user's (a real ``AgentSession``
with calltape's offline stand-ins, a barge-in at every event boundary, a drop and resume while the tool
runs):

(a) charges after LiveKit's ``ctx.wait_for_playout()``, which returns even when the caller cut the
    announcement off; (b) is declared idempotent, so resume plans ``retry`` and it charges again.

Written with ``calltape.effect`` (heard first, keyed by the order), neither mistake can happen: the action
is not run unheard and not run twice, in every run. A tool that records its effect itself, around the
guard, is caught by the effect rules alone: ``unheard-effect`` for (a), ``double-effect`` for (b).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession, RunContext

import calltape
from calltape.adapters.livekit import function_tool
from calltape.runtime import CallSession, ToolSpec
from calltape.testing.explore import Exploration, explore
from calltape.testing.livekit import (
    Call,
    LiveKitCaller,
    Say,
    ScriptedLLM,
    ScriptedSTT,
    ScriptedTTS,
    speaking_caller,
)

pytestmark = pytest.mark.livekit

BANKS: dict[str, list[int]] = {}  # each run's charges, by session
IDEMPOTENT = {"charge_card": ToolSpec(idempotent=True, timeout=30)}


class ChargeAgent(Agent):
    """A billing line that announces a charge of 40 and makes it, in one of four ways (``how``)."""

    def __init__(self, call: CallSession, how: str) -> None:
        super().__init__(instructions="You take payments.")
        self.call, self.how = call, how
        self.charges = BANKS[call.session_id]

    async def _charge(self, amount: int) -> dict[str, int]:
        self.charges.append(amount)
        return {"charged": amount}

    @function_tool
    async def charge_card(self, ctx: RunContext[Any], amount: int) -> str:
        """Charges the caller's card."""
        if self.how == "effect":  # right: heard first, one run per order whatever the call id
            await calltape.effect("charge", "order-7", lambda: self._charge(amount), heard=True)
            return "charged"
        if self.how == "effect_after_livekit_wait":  # the mistakes, with the effect API: harmless
            await ctx.wait_for_playout()
            await calltape.effect("charge", "order-7", lambda: self._charge(amount), heard=True)
            return "charged"
        # records its effect itself, around the guard: (a) after LiveKit's wait, (b) with no look at the log
        if self.how == "recorded_after_livekit_wait":
            await ctx.wait_for_playout()
        base = {"call": ctx.function_call.call_id, "name": "charge", "key": "order-7"}
        self.call.emit("tool.effect", {**base, "phase": "started", "heard": True})
        await self._charge(amount)
        self.call.emit("tool.effect", {**base, "phase": "done"})
        return "charged"


def scenario(how: str) -> Any:
    async def one_call(call: CallSession) -> None:
        llm = ScriptedLLM(
            [
                [
                    Say("I am charging 40 dollars to your card for order seven now."),
                    Call("charge_card", "c1", {"amount": 40}),
                ],
                [Say("Done. Anything else?")],
            ]
        )
        session: AgentSession[Any] = AgentSession(stt=ScriptedSTT(), llm=llm, tts=ScriptedTTS(), **speaking_caller())
        BANKS[call.session_id] = []
        async with LiveKitCaller(session, ChargeAgent(call, how), call) as caller:
            await caller.says("please pay my order seven")
            await caller.settled()

    return one_call


async def explored(how: str, tools: dict[str, ToolSpec] | None = None) -> Exploration:
    BANKS.clear()
    return await explore(scenario(how), tools=tools, concurrency=4, virtual_time=True)


def charged_unheard_or_twice(exploration: Exploration) -> list[str]:
    """What the bank saw, judged per run: charged twice, or charged although the reply announcing the
    charge did not play to its end."""
    wrong = []
    for run in exploration.runs:
        charges = BANKS[run.events[0].session]
        if len(charges) > 1 or (charges and not _heard(run)):
            wrong.append(run.describe().splitlines()[0])
    return wrong


def _announcement(run: Any) -> str | None:
    return next((e.data.get("reply") for e in run.events if e.type == "tool.call"), None)


def _heard(run: Any) -> bool:
    reply = _announcement(run)
    return any(
        e.type == "agent.speech.ended" and e.data.get("reply") == reply and not e.data.get("interrupted")
        for e in run.events
    )


def rules_of(exploration: Exploration) -> set[str]:
    return {v.rule for run in exploration.runs for v in run.violations if v.rule.endswith("-effect")}


@pytest.mark.parametrize("how", ["effect", "effect_after_livekit_wait"])
async def test_with_the_effect_api_neither_mistake_happens(how: str) -> None:
    for tools in (None, IDEMPOTENT):
        exploration = await explored(how, tools)
        assert len(exploration.runs) > 10
        assert rules_of(exploration) == set(), [r.describe() for r in exploration.failures]
        assert charged_unheard_or_twice(exploration) == []
        assert sum(1 for charges in BANKS.values() if charges) >= 1  # it does charge when heard


async def test_a_tool_that_charges_after_livekits_wait_is_caught_by_unheard_effect() -> None:
    exploration = await explored("recorded_after_livekit_wait")
    caught = [r for r in exploration.runs if any(v.rule == "unheard-effect" for v in r.violations)]
    assert caught, "no run caught the charge after a cut announcement"
    assert all(BANKS[r.events[0].session] == [40] for r in caught)  # each caught run did charge, unheard


async def test_an_idempotent_tool_that_charges_again_after_resume_is_caught_by_double_effect() -> None:
    exploration = await explored("recorded", IDEMPOTENT)
    caught = [r for r in exploration.runs if any(v.rule == "double-effect" for v in r.violations)]
    assert caught and all(r.dropped is not None for r in caught), [r.describe() for r in exploration.failures]
    assert all(BANKS[r.events[0].session] == [40, 40] for r in caught)  # charged twice, as in the issue
