"""calltape attached to a LiveKit session on a virtual-time loop (how LiveKit tests its own agents):
the loop's clock jumps to its next timer whenever it is idle, so a coroutine waiting for a commit
made off the loop (SQLite's thread) lets it skip ahead, up to the test's own timeout (issue 11)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession, RunContext, function_tool
from livekit.agents.voice.run_result import ChatMessageEvent, RunResult

import calltape
from calltape.adapters.livekit import attach, guarded, start
from calltape.eventstore import open_store
from calltape.eventstore.recorder import Recorder
from calltape.projections import build_context
from calltape.runtime import CallSession
from calltape.testing.virtualtime import JumpingClockLoop
from tests.adapters.livekit_support import ScriptedLLM, Step

pytestmark = pytest.mark.livekit

TEST_TIMEOUT = 60.0


def test_calltape_on_a_virtual_time_loop(tmp_path: Path) -> None:
    loop = JumpingClockLoop()
    timed_out: list[float] = []
    clock: dict[str, float] = {}

    class Booker(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You book tables.")

        @function_tool
        @guarded
        async def book(self, ctx: RunContext[Any], when: str) -> str:
            """Books a table (the provider takes two seconds)."""
            await asyncio.sleep(2.0)
            return f"booked {when}"

    async def scenario() -> dict[str, Any]:
        store = await open_store(f"sqlite:///{tmp_path}/calltape.db")
        recorder = await Recorder(store).start()
        # the harness's own timeout, pending for the whole test
        guard = loop.call_later(TEST_TIMEOUT, lambda: timed_out.append(loop.time()))
        t0 = loop.time()
        call = await CallSession.start(recorder, "call-vt", agent="booker", framework="livekit", modality="text")
        clock["start"] = loop.time() - t0
        llm_ = ScriptedLLM([Step("Booking.", [("call_1", "book", {"when": "7pm"})]), Step("Booked for seven.")])
        session: AgentSession[Any] = AgentSession(llm=llm_)
        tap = attach(session, call)
        await session.start(Booker())
        await session.run(user_input="a table at seven")
        clock["run"] = loop.time() - t0
        await session.aclose()
        await tap.drain()
        guard.cancel()  # the test's own reads of the store below are not part of the call
        await recorder.flush()
        native = (await build_context(store, "call-vt")).native()
        await recorder.close()
        await store.close()
        return native

    try:
        native = loop.run_until_complete(scenario())
    finally:
        loop.close()

    assert timed_out == []
    assert clock["start"] < 1.0  # starting the call took no virtual time
    # the run took the tool's two virtual seconds, not a jump to a timer
    assert 2.0 <= clock["run"] < 5.0
    outputs = [i["output"] for i in native["items"] if i["type"] == "function_call_output"]
    assert outputs == ["booked 7pm"]


def test_connect_and_start_inside_the_timed_part(tmp_path: Path) -> None:
    """``calltape.connect`` and ``start`` inside the virtual-time part take no virtual time (LiveKit's
    timers pending meanwhile must not fire early), and ``start`` hands back what
    ``session.start(capture_run=True)`` returns (issue 26, item 5)."""
    loop = JumpingClockLoop()
    fired: list[float] = []
    clock: dict[str, float] = {}

    class Greeter(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You greet.")

        async def on_enter(self) -> None:
            self.session.generate_reply()

    async def scenario() -> list[str]:
        # stands for the timers LiveKit has pending (endpointing, user away, a tool's timeout)
        guard = loop.call_later(5.0, lambda: fired.append(loop.time()))
        t0 = loop.time()
        session: AgentSession[Any] = AgentSession(llm=ScriptedLLM([Step("Hello, how can I help?")]))
        async with calltape.connect(f"sqlite:///{tmp_path}/calltape.db") as ct:
            tap = await start(session, Greeter(), ct, call_id="call-vt", capture_run=True)
            clock["started"] = loop.time() - t0
            run = tap.start_result
            assert isinstance(run, RunResult)
            await run  # the greeting the agent's on_enter asked for
            said = [ev.item.text_content for ev in run.events if isinstance(ev, ChatMessageEvent)]
            await session.aclose()
            await tap.drain()
        clock["closed"] = loop.time() - t0
        guard.cancel()
        return [s or "" for s in said]

    try:
        said = loop.run_until_complete(scenario())
    finally:
        loop.close()

    assert fired == []
    assert clock["started"] < 1.0 and clock["closed"] < 1.0
    assert [s.strip() for s in said] == ["Hello, how can I help?"]
