"""A handoff from a guarded tool (issue 26, item 1) on a real ``AgentSession``: the tool registered
with calltape's ``function_tool`` returns an ``Agent`` (alone or with other output) and LiveKit
hands off exactly as for its own ``function_tool``; calltape stores a JSON-safe result and the
handoff LiveKit made."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession, RunContext, llm

from calltape.adapters.livekit import attach, function_tool
from calltape.eventstore import EventStore
from calltape.projections import build_context
from tests.adapters.livekit_support import ScriptedLLM, Step, calltape_calls, livekit_calls, start_call

pytestmark = pytest.mark.livekit


@pytest.mark.parametrize("returns", ["agent", "agent_and_text"])
async def test_guarded_tool_hands_off_like_livekits_own(store: EventStore, session_id: str, returns: str) -> None:
    billing_llm = ScriptedLLM([Step("Billing here, how can I help?")])
    runs: list[str] = []

    class Billing(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You handle billing.", llm=billing_llm)

        async def on_enter(self) -> None:
            self.session.generate_reply()

    class Triage(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You triage.")

        @function_tool
        async def transfer_to_billing(self, ctx: RunContext[Any]) -> Any:
            """Hands the caller to billing."""
            runs.append("transfer")
            billing = Billing()
            return billing if returns == "agent" else (billing, "the caller was charged twice")

    llm_ = ScriptedLLM([Step("", [("call_1", "transfer_to_billing", {})]), Step("One moment.")])
    recorder, call = await start_call(store, session_id, agent="triage", instructions="You triage.")
    session: AgentSession[Any] = AgentSession(llm=llm_)
    tap = attach(session, call)
    await session.start(Triage())
    await session.run(user_input="I have a billing question")
    for _ in range(200):
        if billing_llm.seen:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)

    # LiveKit handed off, and kept the tool's other output (not "An internal error occurred")
    assert runs == ["transfer"]
    assert session.current_agent.id == "billing"
    [kept] = [i for i in session.history.items if isinstance(i, llm.FunctionCallOutput)]
    assert not kept.is_error
    assert kept.output == ("" if returns == "agent" else "the caller was charged twice")

    await recorder.flush()
    native = (await build_context(store, session_id)).native()
    # the call settled with one JSON-safe output, the one LiveKit keeps for it
    assert calltape_calls(native) == livekit_calls(session.history)
    [state] = call.fold.tool_calls()
    assert state.status == "completed"
    # the handoff is recorded as LiveKit's own handoff would be
    handoffs = [e.data for e in await store.read(session_id) if e.type == "agent.handoff"]
    assert [(h["from"], h["to"]) for h in handoffs] == [("triage", "billing")]
    assert handoffs[0]["instructions"] == "You handle billing."
    assert call.agent == native["agent"] == "billing"

    await session.aclose()
    await tap.drain()
    await recorder.close()
    assert [e.type for e in await store.read(session_id)][-1] == "session.ended"
