"""Tool results on a real ``AgentSession`` (issue 11): progress updates, the interruption cap and an
interrupted handoff. Each test reads what LiveKit itself keeps (its history, its tool events) and
checks calltape against it; no LiveKit wording is compared as a constant.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession, RunContext, function_tool, llm
from livekit.agents.voice import speech_handle as lk_speech_handle
from livekit.agents.voice.events import ToolCallEnded, ToolCallUpdated, ToolExecutionUpdatedEvent

from calltape.adapters.livekit import attach
from calltape.eventstore import EventStore
from calltape.projections import build_context
from tests.adapters.livekit_support import ScriptedLLM, Step, before_1_8, start_call

pytestmark = pytest.mark.livekit


class ToolEvents:
    """LiveKit's public tool events of a session, as they came."""

    def __init__(self, session: AgentSession[Any]) -> None:
        self.updates: list[ToolCallUpdated] = []
        self.ended: list[ToolCallEnded] = []
        session.on("tool_execution_updated", self._on)

    def _on(self, ev: ToolExecutionUpdatedEvent) -> None:
        if isinstance(ev.update, ToolCallUpdated):
            self.updates.append(ev.update)
        elif isinstance(ev.update, ToolCallEnded):
            self.ended.append(ev.update)


def history_output(session: AgentSession[Any], call_id: str) -> llm.FunctionCallOutput:
    outputs = [i for i in session.history.items if isinstance(i, llm.FunctionCallOutput) and i.call_id == call_id]
    assert len(outputs) == 1, f"LiveKit's history has {len(outputs)} outputs for the call"
    return outputs[0]


async def durable_calls(store: EventStore, session_id: str) -> dict[str, dict[str, Any]]:
    native = (await build_context(store, session_id)).native()
    calls = [i["call_id"] for i in native["items"] if i["type"] == "function_call"]
    outputs = {i["call_id"]: i for i in native["items"] if i["type"] == "function_call_output"}
    assert sorted(calls) == sorted(outputs), "every calltape call has exactly one output"
    return outputs


async def test_progress_update_is_progress_and_the_final_output_is_the_result(
    store: EventStore, session_id: str
) -> None:
    class Travel(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You find flights.")

        @function_tool
        async def search(self, ctx: RunContext[Any], city: str) -> str:
            """Searches flights."""
            await ctx.update(f"searching flights to {city}")
            await asyncio.sleep(0.2)
            return f"3 flights to {city}"

    llm_ = ScriptedLLM([Step("", [("call_1", "search", {"city": "Oslo"})]), Step("On it."), Step("Found three.")])
    recorder, call = await start_call(store, session_id, agent="travel", instructions="You find flights.")
    session: AgentSession[Any] = AgentSession(llm=llm_)
    events = ToolEvents(session)
    tap = attach(session, call)
    await session.start(Travel())
    await session.run(user_input="flights to Oslo")
    for _ in range(100):
        if events.ended:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)

    # upstream: the update answers the call, the real result comes under a second call of its own
    [ended] = events.ended
    assert ended.call_id == "call_1" and ended.id != "call_1"
    final = history_output(session, ended.id)
    assert final.output == "3 flights to Oslo"
    assert history_output(session, "call_1").output != final.output

    await recorder.flush()
    outputs = await durable_calls(store, session_id)
    assert set(outputs) == {"call_1"}
    assert outputs["call_1"]["output"] == final.output and outputs["call_1"]["status"] == "completed"
    progress = [e.data for e in await store.read(session_id) if e.type == "tool.progress"]
    assert [p["state"] for p in progress] == [u.message for u in events.updates] == ["searching flights to Oslo"]

    await session.aclose()
    await tap.drain()
    await recorder.close()


@before_1_8
async def test_tool_released_at_the_interruption_cap_keeps_its_real_result(store: EventStore, session_id: str) -> None:
    running = asyncio.Event()
    cap = lk_speech_handle.INTERRUPTION_TIMEOUT

    class Booker(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You book tables.")

        @function_tool
        async def book(self, ctx: RunContext[Any], when: str) -> str:
            """Books a table (a slow provider)."""
            running.set()
            await asyncio.sleep(cap + 0.5)
            return f"booked {when}"

    llm_ = ScriptedLLM([Step("Booking.", [("call_1", "book", {"when": "7pm"})]), Step("Still booking."), Step("Done.")])
    recorder, call = await start_call(store, session_id, agent="booker", instructions="You book tables.")
    session: AgentSession[Any] = AgentSession(llm=llm_)
    events = ToolEvents(session)
    tap = attach(session, call)
    await session.start(Booker())
    session.generate_reply(user_input="book at 7")
    await running.wait()
    session.interrupt()  # the tool keeps running; LiveKit stops waiting for it at its cap
    for _ in range(int((cap + 3) / 0.05)):
        if events.ended:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)

    # upstream: released at the cap with a placeholder update, the real result arrives later
    assert [u.call_id for u in events.updates] == ["call_1"]
    [ended] = events.ended
    assert history_output(session, ended.id).output == "booked 7pm"

    await recorder.flush()
    outputs = await durable_calls(store, session_id)
    assert outputs["call_1"]["output"] == "booked 7pm" and outputs["call_1"]["status"] == "completed"
    progress = [e.data for e in await store.read(session_id) if e.type == "tool.progress"]
    assert [p["message"] for p in progress] == [events.updates[0].message]

    await session.aclose()
    await tap.drain()
    await recorder.close()


@pytest.mark.parametrize("handoff", [True, False], ids=["handoff", "plain"])
async def test_interrupted_handoff_is_recorded_as_livekits_error(
    store: EventStore, session_id: str, handoff: bool
) -> None:
    """An unguarded tool that returned before its turn was cut: 1.8 keeps the call with the tool's
    return (a handoff: an error, the handoff does not happen); 1.6/1.7 drop the call, and calltape
    records the same output as 1.8 and puts the call with it into LiveKit's live context."""

    class Billing(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You handle billing.")

    class Triage(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You triage.")

        @function_tool
        async def transfer_to_billing(self, ctx: RunContext[Any]) -> Agent:
            """Hands the caller to billing."""
            await asyncio.sleep(0.1)
            return Billing()

        @function_tool
        async def open_ticket(self, ctx: RunContext[Any]) -> str:
            """Opens a billing ticket."""
            await asyncio.sleep(0.1)
            return "ticket 42"

    name = "transfer_to_billing" if handoff else "open_ticket"
    preamble = "Transferring you to billing right now, one moment please."
    llm_ = ScriptedLLM([Step(preamble, [("call_1", name, {})], calls_first=True, word_delay=0.1), Step("ok")])
    recorder, call = await start_call(store, session_id, agent="triage", instructions="You triage.")
    session: AgentSession[Any] = AgentSession(llm=llm_)
    events = ToolEvents(session)
    tap = attach(session, call)
    await session.start(Triage())
    handle = session.generate_reply(user_input="billing please")
    for _ in range(60):  # the tool returns after 0.1 s; the preamble streams for about a second
        if events.ended:
            break
        await asyncio.sleep(0.01)
    assert events.ended and not handle.done()
    session.interrupt()
    await handle.wait_for_playout()
    await asyncio.sleep(0.1)

    # upstream: a handoff did not happen
    assert session.current_agent.id == "triage"
    await recorder.flush()
    outputs = await durable_calls(store, session_id)
    assert outputs["call_1"]["status"] == ("error" if handoff else "completed")
    if not handoff:
        assert outputs["call_1"]["output"] == "ticket 42"
    # LiveKit's history and its live context hold the call once with calltape's one output (1.8
    # writes it itself; before, calltape inserts it)
    kept = history_output(session, "call_1")
    assert kept.is_error == handoff and kept.output
    assert outputs["call_1"]["output"] == kept.output
    live = [i for i in session.current_agent.chat_ctx.items if getattr(i, "call_id", None) == "call_1"]
    assert [type(i).__name__ for i in live] == ["FunctionCall", "FunctionCallOutput"]
    assert live[1].output == kept.output  # type: ignore[union-attr]
    assert call.agent == "triage"

    await session.aclose()
    await tap.drain()
    await recorder.close()
