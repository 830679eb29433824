"""Barge-in exploration over a real LiveKit ``AgentSession`` (the offline stand-ins of
calltape.testing.livekit): a tool that waits for its announcement to play before acting
(``ctx.wait_for_playout()``) acts anyway when the caller cut the announcement off, because LiveKit's
wait returns as if it had played; with calltape's ``wait_for_playout`` under a guarded tool it does not."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession, RunContext, function_tool

from calltape.adapters import livekit as calltape_livekit
from calltape.runtime import CallSession
from calltape.testing.explore import Exploration, Run, explore
from calltape.testing.livekit import Call, LiveKitCaller, Say, ScriptedLLM, ScriptedSTT, ScriptedTTS, speaking_caller

pytestmark = pytest.mark.livekit

TRANSFERS: dict[str, int] = {}
"""Per run (session id): how many times the agent really transferred the caller."""


def transfer_agent(call: CallSession, *, guarded: bool) -> Agent:
    """The agent under test: announces a transfer, waits until the caller has heard it, transfers."""

    def transferred() -> str:
        TRANSFERS[call.session_id] = TRANSFERS.get(call.session_id, 0) + 1  # in production: SIP REFER
        return "transferred"

    class Unguarded(Agent):
        @function_tool
        async def transfer(self, ctx: RunContext[Any]) -> str:
            """Puts the caller through to a colleague."""
            await ctx.wait_for_playout()
            return transferred()

    class Guarded(Agent):
        @calltape_livekit.function_tool
        async def transfer(self, ctx: RunContext[Any]) -> str:
            """Puts the caller through to a colleague."""
            await calltape_livekit.wait_for_playout(ctx)  # raises Interrupted if the caller cut in
            return transferred()

    kind = Guarded if guarded else Unguarded
    return kind(instructions="You are a bank's phone agent.")


def scenario(*, guarded: bool) -> Any:
    async def run(call: CallSession) -> None:
        llm = ScriptedLLM(
            [[Say("Let me put you through to a colleague now."), Call("transfer", "c1")], [Say("Of course.")]]
        )
        session: AgentSession[Any] = AgentSession(stt=ScriptedSTT(), llm=llm, tts=ScriptedTTS(), **speaking_caller())
        async with LiveKitCaller(session, transfer_agent(call, guarded=guarded), call) as caller:
            await caller.says("I want to talk to a person")
            await caller.settled()

    return run


def no_transfer_after_a_cut_announcement(run: Run) -> None:
    """The user's own assertion: a caller who cut the announcement off is not transferred."""
    asking = {e.data["reply"] for e in run.events if e.type == "tool.call" and e.data["name"] == "transfer"}
    cut = any(e.type == "interruption" and e.data.get("reply") in asking for e in run.events)
    heard_all = any(
        e.type == "agent.speech.ended" and e.data.get("reply") in asking and not e.data.get("interrupted")
        for e in run.events
    )
    if cut and not heard_all:
        assert not TRANSFERS.get(run.events[0].session), "the caller was transferred without hearing why"


async def _explore(guarded: bool) -> Exploration:
    TRANSFERS.clear()  # run sessions are named by boundary: the same names in every exploration
    return await explore(
        scenario(guarded=guarded),
        assertions=no_transfer_after_a_cut_announcement,
        # talk-over at its default threshold (500 ms): the tap ends an interrupted reply's speech when
        # its audio stops, not when LiveKit is done with the reply's tools
        concurrency=8,
        virtual_time=True,  # LiveKit runs on a virtual clock: playout and endpointing take no wall time
    )


async def test_exploration_finds_the_tool_that_acts_on_an_unheard_announcement() -> None:
    exploration = await _explore(guarded=False)
    assert not exploration.baseline.failed, exploration.baseline.describe()
    assert TRANSFERS[exploration.baseline.events[0].session] == 1  # uninterrupted, the caller is put through
    failures = exploration.failures
    assert failures, "a barge-in during the announcement must be found"
    for run in failures:
        assert any("transferred without hearing why" in p for p in run.problems), run.describe()
    with pytest.raises(AssertionError, match=r"runs failed\n[^\n]+\n  a barge-in at boundary \d+"):
        exploration.assert_ok()


async def test_the_guarded_agent_passes_every_boundary(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    caplog.set_level(logging.WARNING)
    exploration = await _explore(guarded=True)
    exploration.assert_ok()
    # no framework noise: what LiveKit and the tool runner log for the harness's own barge-ins and drops
    # (about twenty messages) is kept quiet, and counted
    assert [r.getMessage() for r in caplog.records] == []
    assert sum(exploration.silenced.values()) >= 10, exploration.silenced
    # not vacuous: some barge-ins cut the announcement, and then nobody was transferred
    cut = [r for r in exploration.runs if any(e.type == "interruption" for e in r.events)]
    assert cut and any(not TRANSFERS.get(r.events[0].session) for r in cut)
    # the drop mid-transfer: the session is lost, the call resumed, and a new session carries it on
    (run,) = [r for r in exploration.runs if r.dropped]
    assert run.dropped == "c1" and exploration.notes == []
    assert run.resume is not None and [t["decision"] for t in run.resume["tools"]] == ["unknown"]
    resumed = [e for e in run.events if e.epoch == 2 and not e.type.startswith("x.")]
    assert [e.type for e in resumed][-6:] == [
        "agent.reply.started",
        "agent.speech.started",
        "agent.text",
        "agent.reply.done",
        "agent.speech.ended",
        "session.ended",
    ]  # the new session's agent spoke from the settled context ("Of course.")
    assert not TRANSFERS.get(run.events[0].session)  # the lost session's tool never acted
