"""Interruptions not made by the caller's voice, on a real ``AgentSession`` on a virtual clock
(issue 26): typed input that interrupts a reply keeps what was heard (item 2), a guarded tool that
finished before the barge-in stays in LiveKit's live context (item 3), an unguarded tool waiting on
``ctx.wait_for_playout()`` is released by the barge-in (item 4, a guard).

Each scenario runs on a :class:`~calltape.testing.virtualtime.JumpingClockLoop`: the TTS renders
silence, the speaker plays it on the loop's clock, so a scenario's seconds take no wall time and a
starved machine cannot reshape it. The store is SQLite: a PostgreSQL connection's own timeouts run
on the loop's clock, which jumps (the store is not what these tests are about)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession, RunContext, llm
from livekit.agents import function_tool as lk_function_tool

from calltape.adapters.livekit import LiveKitTap, attach, function_tool
from calltape.eventstore import open_store
from calltape.eventstore.recorder import Recorder
from calltape.projections import build_context
from calltape.runtime import CallSession
from calltape.testing.virtualtime import JumpingClockLoop
from tests.adapters.livekit_support import (
    ScriptedLLM,
    ScriptedRealtime,
    Step,
    calltape_turns,
    livekit_turns,
    voice_session,
)

pytestmark = pytest.mark.livekit

STORY = "Once upon a time a small fox lived at the edge of a very large forest and every single morning it went out."


def voice_call(
    tmp_path: Path,
    session_id: str,
    llm_: ScriptedLLM | None,
    agent: Agent,
    drive: Callable[[AgentSession[Any], LiveKitTap], Awaitable[None]],
) -> tuple[AgentSession[Any], dict[str, Any], list[Any]]:
    """A voice ``AgentSession`` with calltape attached, driven by ``drive`` on a virtual clock; returns
    LiveKit's session, calltape's durable context and the call's events. ``llm_`` is the session's
    LLM (None: the agent brings its own model, e.g. a realtime one)."""

    async def scenario() -> tuple[AgentSession[Any], dict[str, Any], list[Any]]:
        store = await open_store(f"sqlite:///{tmp_path}/calltape.db")
        recorder = await Recorder(store).start()
        call = await CallSession.start(recorder, session_id, agent=agent.id, framework="livekit", modality="voice")
        session, _ = voice_session([], llm_)
        tap = attach(session, call)
        await session.start(agent)
        await drive(session, tap)
        await session.aclose()
        await tap.drain()
        await recorder.flush()
        native = (await build_context(store, session_id)).native()
        events = await store.read(session_id)
        await recorder.close()
        await store.close()
        return session, native, events

    loop = JumpingClockLoop()  # on this thread: Python 3.11's AST check is not safe across threads
    try:
        return loop.run_until_complete(scenario())
    finally:
        leftover = asyncio.all_tasks(loop)  # LiveKit's transcript tasks still winding down
        for task in leftover:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def interrupted_messages(session: AgentSession[Any]) -> list[str]:
    return [
        (m.text_content or "").strip()
        for m in session.history.items
        if isinstance(m, llm.ChatMessage) and m.role == "assistant" and m.interrupted
    ]


@pytest.mark.parametrize("model", ["pipeline", "realtime"])
def test_typed_input_interrupting_a_reply_keeps_what_was_heard(tmp_path: Path, session_id: str, model: str) -> None:
    """Upstream test_interruption_by_text_input (and its realtime interruption tests): ``interrupt()``
    then ``generate_reply(user_input=...)``, with an LLM and TTS or with a realtime model."""

    async def drive(session: AgentSession[Any], _: LiveKitTap) -> None:
        session.generate_reply(user_input="Tell me a story.")
        await asyncio.sleep(2.0)  # about half the story has played
        session.interrupt()
        session.generate_reply(user_input="stop from text input")
        await asyncio.sleep(3.0)

    replies = [STORY, "Ok, I'll stop now."]
    if model == "pipeline":
        llm_, agent = ScriptedLLM([Step(r) for r in replies]), Agent(instructions="Stories.")
    else:
        llm_, agent = None, Agent(instructions="Stories.", llm=ScriptedRealtime(replies))
    session, native, events = voice_call(tmp_path, session_id, llm_, agent, drive)

    # upstream: the story was cut partway and LiveKit kept what was heard
    [heard] = interrupted_messages(session)
    assert 0 < len(heard) < len(STORY.strip())
    assert calltape_turns(native) == livekit_turns(session.history)
    cut = [i["content"].strip() for i in native["items"] if i["type"] == "message" and i.get("interrupted")]
    assert cut == [heard]
    roles = [i["role"] for i in native["items"] if i["type"] == "message" and i["role"] != "system"]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert [e.data["cause"] for e in events if e.type == "interruption"] == ["api"]


PREAMBLE = "Let me book that table for you right now, it will only take a moment of your time, thank you."


def live_calls(session: AgentSession[Any]) -> dict[str, Any]:
    """The calls and outputs of LiveKit's history and of the agent's live context, by call id."""
    found: dict[str, Any] = {}
    for where, chat_ctx in (("history", session.history), ("live", session.current_agent.chat_ctx)):
        for item in chat_ctx.items:
            if isinstance(item, llm.FunctionCall | llm.FunctionCallOutput):
                found.setdefault(where, []).append((type(item).__name__, item.call_id, getattr(item, "output", None)))
    return found


def test_guarded_tool_done_before_the_barge_in_stays_in_livekits_context(tmp_path: Path, session_id: str) -> None:
    """LiveKit 1.6/1.7 drop every call of an interrupted turn, also one that had returned (1.8 keeps
    it): calltape puts it back, with its one output, into the live context and the history."""
    ran: list[str] = []
    seen: dict[str, Any] = {}

    class Booker(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You book tables.")

        @function_tool
        async def book(self, ctx: RunContext[Any], when: str) -> str:
            """Books a table."""
            ran.append(when)
            return f"booked {when}"

    async def drive(session: AgentSession[Any], _: LiveKitTap) -> None:
        handle = session.generate_reply(user_input="a table at seven")
        await asyncio.sleep(1.0)  # the tool has returned; the preamble is still playing
        assert ran == ["7pm"] and not handle.done()
        session.interrupt()
        await asyncio.sleep(2.0)
        seen.update(live_calls(session))

    steps = [Step(PREAMBLE, [("call_1", "book", {"when": "7pm"})], calls_first=True), Step("Anything else?")]
    _, native, events = voice_call(tmp_path, session_id, ScriptedLLM(steps), Booker(), drive)

    assert [e.data["output"] for e in events if e.type == "tool.result"] == ["booked 7pm"]
    expected = [("FunctionCall", "call_1", None), ("FunctionCallOutput", "call_1", "booked 7pm")]
    assert seen == {"history": expected, "live": expected}
    assert [(i["call_id"], i["output"]) for i in native["items"] if i["type"] == "function_call_output"] == [
        ("call_1", "booked 7pm")
    ]


def released_by_the_barge_in(tmp_path: Path, session_id: str) -> None:
    """A LiveKit tool (unguarded) waits on ``ctx.wait_for_playout()``; the reply is interrupted while it
    plays: the tool must be released soon after, not when the session closes."""
    released: list[float] = []

    class Announcer(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You book tables.")

        @lk_function_tool
        async def book(self, ctx: RunContext[Any], when: str) -> str:
            """Books a table once the caller heard the preamble."""
            try:
                await ctx.wait_for_playout()
            finally:
                released.append(asyncio.get_running_loop().time())
            return f"booked {when}"

    async def drive(session: AgentSession[Any], _: LiveKitTap) -> None:
        session.generate_reply(user_input="a table at seven")
        await asyncio.sleep(1.0)  # the tool waits for the preamble, still playing
        assert released == []
        cut = asyncio.get_running_loop().time()
        session.interrupt()
        await asyncio.sleep(30.0)
        assert released and released[0] - cut < 1.0, "the tool was not released by the barge-in"

    steps = [
        Step(PREAMBLE, [("call_1", "book", {"when": "7pm"})], calls_first=False, word_delay=0.02),
        Step("Anything else?"),
    ]
    voice_call(tmp_path, session_id, ScriptedLLM(steps), Announcer(), drive)


def test_unguarded_tool_waiting_for_playout_is_released_by_the_barge_in(tmp_path: Path, session_id: str) -> None:
    """``ctx.wait_for_playout()`` in a tool LiveKit runs itself ends soon after the barge-in, with
    calltape attached (it must not wait for the session to close)."""
    released_by_the_barge_in(tmp_path, session_id)


def test_a_failing_tap_handler_never_breaks_livekits_own_flow(
    tmp_path: Path, session_id: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 4's hang: LiveKit's event emitter re-raises a listener's ``TypeError`` into the task that
    emitted the event; raised by the tap while LiveKit adds an interrupted reply's message, it skipped
    LiveKit's "generation done", so ``ctx.wait_for_playout()`` waited until the session closed. Whatever
    goes wrong in the tap stays in the tap (logged by type, without the event's content)."""

    def broken(self: LiveKitTap, ev: Any) -> None:
        raise TypeError("a tap defect")

    monkeypatch.setattr(LiveKitTap, "_on_item_added", broken)
    released_by_the_barge_in(tmp_path, session_id)
    assert "TypeError" in caplog.text and "a tap defect" not in caplog.text
