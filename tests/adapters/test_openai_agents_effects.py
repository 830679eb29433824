"""``calltape.effect`` from a guarded tool of the OpenAI Agents SDK realtime adapter (SPEC section 8), on
the SDK's real session, runner, agent and tools with its own ``ScriptedRealtimeModel`` as the network.

The SDK says when a reply's audio was cut (``audio_interrupted``) but never when it finished playing:
the tap takes a reply as heard once its audio has played out (the playback tracker's position when the
app gives one, else the SDK's own "played at once, in real time" assumption), not when the model
finished generating it, so a heard-first effect waits for the caller to have heard the announcement.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("agents.realtime.testing")

from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.realtime.model import RealtimePlaybackTracker
from agents.realtime.model_inputs import RealtimeModelSendToolOutput
from agents.realtime.testing import ScriptedRealtimeModel
from agents.tool_context import ToolContext

import calltape
from calltape.adapters.openai_agents import attach, restore
from calltape.checks import check_events
from tests.adapters.openai_agents_support import (
    ask_tool,
    audio_interrupted,
    data_of,
    logged,
    sent,
    tool_output_echo,
    until,
)

pytestmark = pytest.mark.openai_agents

ANNOUNCE = "I am charging 40 dollars to your card for order seven now."


def charging_agent(charges: list[int], *, how: str = "effect", taps: list[Any] | None = None) -> RealtimeAgent[Any]:
    """A billing agent whose tool charges 40 for order seven: with ``calltape.effect`` (heard first), or
    wrongly (``by_hand``: charges at once and records the effect itself on the call of ``taps[0]``)."""

    async def bank() -> dict[str, int]:
        charges.append(40)
        return {"charged": 40}

    @function_tool
    async def charge_card(ctx: ToolContext[Any], order: str) -> str:
        """Charges the caller's card for an order."""
        if how == "effect":
            result = await calltape.effect("charge", order, bank, heard=True)
            return f"charged {result['charged']}"
        base = {"call": ctx.tool_call_id, "name": "charge", "key": order}
        live = taps[0].live if taps else None
        assert live is not None
        live.emit("tool.effect", {**base, "phase": "started", "heard": True})
        output = await bank()
        live.emit("tool.effect", {**base, "phase": "done", "output": output})
        return "charged 40"

    return RealtimeAgent(name="billing", instructions="You take payments.", tools=[charge_card])


async def announce_and_charge(model: ScriptedRealtimeModel, response: str, call_id: str, audio_ms: int = 400) -> None:
    await ask_tool(model, response, call_id, "charge_card", '{"order": "order-7"}', ANNOUNCE, audio_ms)


def effect_rules(events: list[Any]) -> set[str]:
    return {v.rule for v in check_events(events) if v.rule.endswith("-effect")}


async def test_an_announcement_cut_before_it_played_out_never_charges(store_url: str, session_id: str) -> None:
    charges: list[int] = []
    model = ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(charging_agent(charges), model=model).run()
        await attach(session, ct, session_id)
        async with session:
            await announce_and_charge(model, "r1", "c1", audio_ms=2000)
            await asyncio.sleep(0.2)  # the tool waits: the caller is still hearing the announcement
            assert charges == []
            await model.emit(audio_interrupted("a_r1"))  # "no, wait!"
            await until(lambda: sent(model, RealtimeModelSendToolOutput))
            # the model asks again under a new call id (after the barge-in) and this time it is heard
            await announce_and_charge(model, "r2", "c2")
            await until(lambda: len(sent(model, RealtimeModelSendToolOutput)) == 2)
            # and once more, after the charge: answered from the log
            await announce_and_charge(model, "r3", "c3")
            await until(lambda: len(sent(model, RealtimeModelSendToolOutput)) == 3)
        events = await logged(ct, session_id)
    assert charges == [40]
    cancelled = data_of(events, "tool.cancelled")
    assert [(c["call"], c["reason"], c["outcome"]) for c in cancelled] == [("c1", "interrupted", "not_run")]
    assert [(e["call"], e["phase"]) for e in data_of(events, "tool.effect")] == [("c2", "started"), ("c2", "done")]
    assert [r["call"] for r in data_of(events, "tool.result")] == ["c2", "c3"]
    assert [o.output for o in sent(model, RealtimeModelSendToolOutput)][1:] == ["charged 40", "charged 40"]
    assert effect_rules(events) == set()


async def test_the_playback_tracker_says_when_the_announcement_played_out(store_url: str, session_id: str) -> None:
    charges: list[int] = []
    model = ScriptedRealtimeModel(strict=False)
    tracker = RealtimePlaybackTracker()
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(charging_agent(charges), model=model).run(
            model_config={"playback_tracker": tracker}
        )
        await attach(session, ct, session_id, playback=tracker)
        async with session:
            await announce_and_charge(model, "r1", "c1", audio_ms=400)
            tracker.on_play_ms("a_r1", 0, 200)
            await asyncio.sleep(0.6)  # longer than the audio: only the player knows it is not heard yet
            assert charges == []
            tracker.on_play_ms("a_r1", 0, 200)  # played to its end
            await until(lambda: sent(model, RealtimeModelSendToolOutput))
        events = await logged(ct, session_id)
    assert charges == [40]
    assert sent(model, RealtimeModelSendToolOutput)[0].output == "charged 40"
    ended = data_of(events, "agent.speech.ended")
    assert ended == [{"reply": "r1", "interrupted": False}]
    assert effect_rules(events) == set()


async def test_after_a_restore_the_model_asking_again_gets_the_recorded_charge(store_url: str, session_id: str) -> None:
    charges: list[int] = []
    first = ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(charging_agent(charges), model=first).run()
        tap = await attach(session, ct, session_id)
        async with session:
            await announce_and_charge(first, "r1", "c1")
            await until(lambda: sent(first, RealtimeModelSendToolOutput))
            await first.emit(*tool_output_echo(sent(first, RealtimeModelSendToolOutput)[0], "f_c1"))
            assert tap.live is not None
            await tap.live.drop("network")
        await ct.recorder.flush()
    second = ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        async with restore(RealtimeRunner(charging_agent(charges), model=second), ct, session_id):
            await announce_and_charge(second, "r9", "c9")  # a new call id in the new session
            await until(lambda: sent(second, RealtimeModelSendToolOutput))
        events = await logged(ct, session_id)
    assert charges == [40]
    assert sent(second, RealtimeModelSendToolOutput)[0].output == "charged 40"
    assert [(e["call"], e["phase"]) for e in data_of(events, "tool.effect")] == [("c1", "started"), ("c1", "done")]
    assert effect_rules(events) == set()


async def test_a_tool_charging_without_the_effect_api_is_caught(store_url: str, session_id: str) -> None:
    """Charged at once, recorded by hand: the cut announcement is ``unheard-effect``, the second ask
    under a new call id ``double-effect``."""
    charges: list[int] = []
    model = ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        taps: list[Any] = []
        session = await RealtimeRunner(charging_agent(charges, how="by_hand", taps=taps), model=model).run()
        taps.append(await attach(session, ct, session_id))
        async with session:
            await announce_and_charge(model, "r1", "c1", audio_ms=2000)
            await until(lambda: sent(model, RealtimeModelSendToolOutput))
            await model.emit(audio_interrupted("a_r1"))
            await announce_and_charge(model, "r2", "c2")
            await until(lambda: len(sent(model, RealtimeModelSendToolOutput)) == 2)
        events = await logged(ct, session_id)
    assert charges == [40, 40]
    assert effect_rules(events) == {"unheard-effect", "double-effect"}
