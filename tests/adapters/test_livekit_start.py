"""Attaching in one call (``start``), instructions and modality taken from the framework, guarded
tools as a drop-in of LiveKit's registration and a loud error for a tool left unguarded (issue 11)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession, RunContext
from livekit.agents import function_tool as lk_function_tool

import calltape
from calltape.adapters.livekit import function_tool, guarded, start
from calltape.runtime import ToolSpec
from tests.adapters.livekit_support import ScriptedLLM, Step

pytestmark = pytest.mark.livekit


async def test_start_records_the_agent_as_livekit_runs_it() -> None:
    chat_context = pytest.importorskip("livekit.agents.llm.chat_context")
    instructions_cls = getattr(chat_context, "Instructions", None)
    if instructions_cls is None:
        pytest.skip("this LiveKit has no Instructions objects")
    instructions = instructions_cls("You book tables.", audio="Keep it short.", text="Use full sentences.")
    runs: list[str] = []

    class Concierge(Agent):
        def __init__(self) -> None:
            super().__init__(instructions=instructions)

        @function_tool
        async def book(self, ctx: RunContext[Any], when: str) -> str:
            """Books a table."""
            runs.append(when)
            return f"booked {when}"

    llm_ = ScriptedLLM([Step("", [("call_1", "book", {"when": "7pm"})]), Step("Booked.")])
    session: AgentSession[Any] = AgentSession(llm=llm_)
    async with calltape.connect("sqlite:///:memory:") as ct:
        tap = await start(session, Concierge(), ct, call_id="call-1")
        await session.run(user_input="a table at seven")
        await session.aclose()
        await tap.drain()
        events = await ct.store.read("call-1")
    started = events[0].data
    assert started["agent"] == "concierge" and started["framework"] == "livekit"
    assert started["modality"] == "text"  # no TTS, no audio output, no realtime model
    assert started["instructions"] == instructions.render(modality="text")
    kinds = [e.type for e in events]
    # the function_tool drop-in ran the body under calltape: durable start, one run, its result
    assert kinds.index("tool.started") < kinds.index("tool.result")
    assert runs == ["7pm"]
    assert [e.data["output"] for e in events if e.type == "tool.result"] == ["booked 7pm"]


async def test_a_tool_with_a_spec_left_unguarded_is_a_loud_error() -> None:
    class Concierge(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You book tables.")

        @lk_function_tool
        async def book(self, ctx: RunContext[Any], when: str) -> str:
            """Books a table (registered the plain LiveKit way)."""
            return f"booked {when}"

    session: AgentSession[Any] = AgentSession(llm=ScriptedLLM([]))
    async with calltape.connect("sqlite:///:memory:") as ct:
        with pytest.raises(TypeError, match="book"):
            await start(session, Concierge(), ct, call_id="call-2", tools={"book": ToolSpec(timeout=5)})
        assert await ct.store.read("call-2") == []  # nothing started, nothing written
    await session.aclose()


def test_guarded_above_function_tool_is_refused() -> None:
    with pytest.raises(TypeError, match="under @function_tool"):

        class Wrong(Agent):
            @guarded
            @lk_function_tool
            async def book(self, ctx: RunContext[Any], when: str) -> str:
                """Would be silently unguarded (or not a tool at all)."""
                return when


async def test_voice_session_is_recorded_as_voice() -> None:
    from tests.adapters.livekit_support import Utterance, voice_session

    session, _ = voice_session([Utterance(0.2, 0.5, "hi")], ScriptedLLM([Step("Hello.")]))
    async with calltape.connect("sqlite:///:memory:") as ct:
        tap = await start(session, Agent(instructions="Hi."), ct, call_id="call-3")
        await asyncio.sleep(0)
        await session.aclose()
        await tap.drain()
        events = await ct.store.read("call-3")
    assert events[0].data["modality"] == "voice"
