"""The OpenAI Agents SDK realtime adapter on the SDK's real session, runner, agent and tools, with the
SDK's own ``ScriptedRealtimeModel`` as the network (``tests/adapters/openai_agents_support.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents.realtime.testing")

from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner, RealtimeSession
from agents.realtime.model import RealtimePlaybackTracker
from agents.realtime.model_events import (
    RealtimeModelConnectionStatusEvent,
    RealtimeModelEndOfStreamEvent,
    RealtimeModelErrorEvent,
)
from agents.realtime.model_inputs import RealtimeModelSendRawMessage, RealtimeModelSendToolOutput
from agents.realtime.testing import ScriptedRealtimeModel

import calltape
from calltape.adapters.openai_agents import NOT_RUN, REANCHOR, attach, restore
from calltape.runtime import ToolSpec
from tests.adapters.openai_agents_support import (
    FakeRealtimeServer,
    ask_tool,
    audio_interrupted,
    call_in_open_response,
    data_of,
    function_call,
    logged,
    raw,
    sent,
    server_done,
    server_reply,
    spoken_reply,
    tool_output_echo,
    turn_ended,
    until,
    user_text,
)

pytestmark = pytest.mark.openai_agents


def booking_agent(runs: list[str]) -> RealtimeAgent[Any]:
    @function_tool
    async def book(when: str) -> str:
        """Books a table."""
        runs.append(when)
        return f"booked for {when}"

    return RealtimeAgent(name="concierge", instructions="You book tables.", tools=[book])


def shape(native: dict[str, Any]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for item in native["items"]:
        if item["type"] == "message":
            out.append((item["role"], item["content"], item.get("interrupted", False)))
        elif item["type"] == "function_call":
            out.append(("call", item["call_id"], item["name"]))
        elif item["type"] == "function_call_output":
            out.append(("output", item["call_id"], item["output"]))
    return out


BOOKED = [
    ("system", "You book tables.", False),
    ("user", "A table for two at seven", False),
    ("assistant", "Let me check.", False),
    ("call", "c1", "book"),
    ("output", "c1", "booked for 19:00"),
    ("assistant", "Your table for two is", True),
]


async def book_then_barge_in(
    session: RealtimeSession, model: ScriptedRealtimeModel, tracker: RealtimePlaybackTracker
) -> None:
    """The user asks for a table; the agent books it; the user cuts the confirmation halfway (BOOKED)."""
    await session.send_message("A table for two at seven")
    await model.emit(*user_text("u1", "A table for two at seven"))
    await model.emit(
        *spoken_reply("r1", "a1", "Let me check.", 800),
        function_call("c1", "book", '{"when": "19:00"}', "f1"),
        turn_ended("r1"),
    )
    await until(lambda: sent(model, RealtimeModelSendToolOutput))
    await model.emit(*tool_output_echo(sent(model, RealtimeModelSendToolOutput)[0], "f1"))
    tracker.on_play_ms("a1", 0, 800)  # the player played "Let me check." out
    await model.emit(*spoken_reply("r2", "a2", "Your table for two is booked for seven tonight.", 3000))
    tracker.on_play_ms("a2", 0, 1500)  # the user heard half of it, then spoke
    await model.emit(audio_interrupted("a2"), turn_ended("r2"))


async def test_the_tap_records_the_call_as_the_session_runs_it(store_url: str, session_id: str) -> None:
    runs: list[str] = []
    model = ScriptedRealtimeModel(strict=False)
    tracker = RealtimePlaybackTracker()
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(booking_agent(runs), model=model).run(model_config={"playback_tracker": tracker})
        await attach(session, ct, session_id, playback=tracker)
        async with session:
            await book_then_barge_in(session, model, tracker)
        native = (await ct.context(session_id)).native()
        events = await logged(ct, session_id)
    assert runs == ["19:00"]
    assert shape(native) == BOOKED
    started = next(e for e in events if e.type == "session.started")
    assert started.data["framework"] == "openai-agents" and started.data["agent"] == "concierge"
    call = next(e for e in events if e.type == "tool.call")
    assert call.data["reply"] == "r1" and call.data["name"] == "book"


async def test_raw_server_events_are_the_source_when_the_transport_forwards_them(
    store_url: str, session_id: str
) -> None:
    """The OpenAI transport forwards every server event before its normalized ones: the tap maps those
    (calltape's Realtime mapping), and the server's truncation says what was heard."""
    model = ScriptedRealtimeModel(strict=False)

    text = "Your table for two is booked for seven tonight."
    audio = "A" * (3000 * 48 * 4 // 3)  # base64 of 3 s of pcm16
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(booking_agent([]), model=model).run()
        await attach(session, ct, session_id)
        async with session:
            await model.emit(
                raw(type="session.created", session={"audio": {"output": {"format": {"type": "audio/pcm"}}}}),
                raw(type="input_audio_buffer.speech_started", item_id="u1"),
                raw(type="input_audio_buffer.speech_stopped", item_id="u1"),
                raw(type="input_audio_buffer.committed", item_id="u1"),
                raw(type="conversation.item.input_audio_transcription.completed", item_id="u1", transcript="Book it"),
                raw(type="response.created", response={"id": "r1"}),
                raw(type="response.output_audio_transcript.delta", response_id="r1", item_id="a1", delta=text),
                raw(type="response.output_audio.delta", response_id="r1", item_id="a1", delta=audio),
                # normalized events the transport also emits: ignored once raw events are the source
                *spoken_reply("r1", "a1", text, 3000),
                raw(type="input_audio_buffer.speech_started", item_id="u2"),
                raw(type="conversation.item.truncated", item_id="a1", content_index=0, audio_end_ms=1500),
                raw(type="response.done", response={"id": "r1", "status": "cancelled"}),
            )
        native = (await ct.context(session_id)).native()
    assert shape(native)[1:] == [("user", "Book it", False), ("assistant", "Your table for two is", True)]


# -- guarded tools --------------------------------------------------------------------------------


def slow_agent(calls: list[str], *, seconds: float, store: Any = None, session_id: str = "") -> RealtimeAgent[Any]:
    @function_tool
    async def book(when: str) -> str:
        """Books a table (slowly)."""
        if store is not None:  # the body runs only once the call's start is committed
            types = [e.type for e in await store.read(session_id)]
            calls.append(f"started durable: {'tool.started' in types}")
        calls.append(when)
        await asyncio.sleep(seconds)
        calls.append("finished")
        return f"booked for {when}"

    return RealtimeAgent(name="concierge", instructions="You book tables.", tools=[book])


async def _ask(model: ScriptedRealtimeModel, response: str = "r1", call_id: str = "c1") -> None:
    await ask_tool(model, response, call_id, "book", '{"when": "19:00"}', "Let me check.", 500)


async def test_a_guarded_tool_starts_durably_and_times_out(store_url: str, session_id: str) -> None:
    calls: list[str] = []
    model = ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        agent = slow_agent(calls, seconds=5, store=ct.store, session_id=session_id)
        session = await RealtimeRunner(agent, model=model).run()
        await attach(session, ct, session_id, tools={"book": ToolSpec(timeout=0.3)})
        async with session:
            await _ask(model)
            await until(lambda: sent(model, RealtimeModelSendToolOutput))
        events = await logged(ct, session_id)
    assert calls == ["started durable: True", "19:00"]
    (output,) = sent(model, RealtimeModelSendToolOutput)
    assert output.tool_call.call_id == "c1" and output.output == "the tool timed out"
    assert data_of(events, "tool.cancelled") == [{"call": "c1", "reason": "timeout", "outcome": "unknown"}]


async def test_a_session_without_a_tap_runs_its_guarded_tool_as_before(store_url: str, session_id: str) -> None:
    """Two sessions of one agent (its tools guarded once) driven from one task, only the first recorded:
    the second's call, with the same call id, runs unguarded and leaves nothing in the first's call (a
    guarded tool finds its tap from the session handling the call, never from another session)."""
    calls: list[str] = []
    agent = slow_agent(calls, seconds=0)
    recorded, other = ScriptedRealtimeModel(strict=False), ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        tapped = await RealtimeRunner(agent, model=recorded).run()
        untapped = await RealtimeRunner(agent, model=other).run()
        await attach(tapped, ct, session_id)
        async with tapped, untapped:
            await _ask(recorded)
            await until(lambda: sent(recorded, RealtimeModelSendToolOutput))
            await _ask(other)
            await until(lambda: sent(other, RealtimeModelSendToolOutput))
        events = await logged(ct, session_id)
    assert calls == ["19:00", "finished", "19:00", "finished"]  # each body ran, once per session
    assert [e.type for e in events].count("tool.started") == 1
    (output,) = sent(other, RealtimeModelSendToolOutput)
    assert output.output == "booked for 19:00"


async def test_tools_the_sdk_cancels_at_close_are_settled(store_url: str, session_id: str) -> None:
    calls: list[str] = []
    model = ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(slow_agent(calls, seconds=30), model=model).run()
        tap = await attach(session, ct, session_id)
        async with session:
            await _ask(model)
            await until(lambda: calls == ["19:00"])
        await until(lambda: getattr(tap.realtime.replies.fold.tool_call("c1"), "status", None) != "in_progress")
        native = (await ct.context(session_id)).native()
        events = await logged(ct, session_id)
    assert calls == ["19:00"]  # cancelled with the session: never finished
    assert data_of(events, "tool.cancelled") == [{"call": "c1", "reason": "cancelled", "outcome": "unknown"}]
    assert ("output", "c1", {"status": "unknown"}) in shape(native)


async def test_a_barge_in_cancels_a_cancel_policy_tool(store_url: str, session_id: str) -> None:
    calls: list[str] = []
    model = ScriptedRealtimeModel(strict=False)
    tracker = RealtimePlaybackTracker()
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(slow_agent(calls, seconds=30), model=model).run()
        await attach(session, ct, session_id, tools={"book": ToolSpec(on_interrupt="cancel")}, playback=tracker)
        async with session:
            await _ask(model)
            await until(lambda: calls == ["19:00"])
            tracker.on_play_ms("a_r1", 0, 200)
            await model.emit(audio_interrupted("a_r1"))
            await until(lambda: sent(model, RealtimeModelSendToolOutput))
        events = await logged(ct, session_id)
    (output,) = sent(model, RealtimeModelSendToolOutput)
    assert "cancelled by the interruption" in output.output
    assert data_of(events, "tool.cancelled") == [{"call": "c1", "reason": "interrupted", "outcome": "unknown"}]


async def test_a_call_of_a_cancelled_response_never_runs(store_url: str, session_id: str) -> None:
    """The server sends a call's arguments before it knows the response will complete: a response
    cancelled after them (a barge-in) leaves a call that must not run."""
    calls: list[str] = []
    model = ScriptedRealtimeModel(strict=False)

    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(slow_agent(calls, seconds=0), model=model).run()
        await attach(session, ct, session_id)
        async with session:
            args = '{"when": "19:00"}'
            await model.emit(*call_in_open_response("r1", "c1", "book", args, "f1"))
            await asyncio.sleep(0.05)
            assert calls == []  # waiting for its response
            await model.emit(raw(type="response.done", response={"id": "r1", "status": "cancelled"}))
            await until(lambda: sent(model, RealtimeModelSendToolOutput))
        events = await logged(ct, session_id)
    assert calls == []
    assert sent(model, RealtimeModelSendToolOutput)[0].output == NOT_RUN
    assert not data_of(events, "tool.call") and not data_of(events, "tool.started")
    assert data_of(events, "x.realtime.discarded_calls")[0]["calls"] == [{"call": "c1", "name": "book"}]


# -- restore --------------------------------------------------------------------------------------


def cli_context(store_url: str, session_id: str) -> list[dict[str, Any]]:
    """``calltape context SESSION --format realtime``, run as users run it."""
    exe = shutil.which("calltape", path=str(Path(sys.executable).parent)) or "calltape"
    env = {k: v for k, v in os.environ.items() if k not in ("CALLTAPE_DATABASE_URL", "CALLTAPE_TENANT")}
    proc = subprocess.run(
        [exe, "--db", store_url, "context", session_id, "--format", "realtime"],
        capture_output=True,
        env=env,
        timeout=120,
        check=True,
    )
    result: list[dict[str, Any]] = json.loads(proc.stdout)
    return result


def seeded(model: ScriptedRealtimeModel) -> list[dict[str, Any]]:
    """The items the session put into its new conversation (ids aside)."""
    items = []
    for event in sent(model, RealtimeModelSendRawMessage):
        assert event.message["type"] == "conversation.item.create"
        items.append({k: v for k, v in event.message["other_data"]["item"].items() if k != "id"})
    return items


async def test_a_dropped_call_restored_into_a_new_session_has_the_context_at_the_drop(
    store_url: str, session_id: str
) -> None:
    runs: list[str] = []
    first = ScriptedRealtimeModel(strict=False)
    tracker = RealtimePlaybackTracker()
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(booking_agent(runs), model=first).run()
        tap = await attach(session, ct, session_id, playback=tracker)
        async with session:
            await book_then_barge_in(session, first, tracker)
            assert tap.live is not None
            await tap.live.drop("network")  # the process loses the call here
        await ct.recorder.flush()
    at_the_drop = await asyncio.to_thread(cli_context, store_url, session_id)
    assert [e["item"] for e in at_the_drop][-1]["content"] == [{"type": "output_text", "text": "Your table for two is"}]

    second = ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        async with restore(RealtimeRunner(booking_agent(runs), model=second), ct, session_id) as restored:
            items = seeded(second)
            assert items[:-1] == [e["item"] for e in at_the_drop]
            assert items[-1] == {
                "type": "message",
                "role": "system",
                "content": [{"type": "input_text", "text": REANCHOR}],
            }
            # the server echoes the seeded user message: not a new user turn
            await second.emit(*user_text(_seed_id(second, 0), "A table for two at seven"))
            # the model asks for the booking again under the same call id: answered from the log
            await second.emit(
                *spoken_reply("r3", "a3", "Booked.", 500),
                function_call("c1", "book", '{"when": "19:00"}', "f9"),
                turn_ended("r3"),
            )
            await until(lambda: sent(second, RealtimeModelSendToolOutput))
            assert restored is not None
        events = await logged(ct, session_id)
        native = (await ct.context(session_id)).native()
    assert runs == ["19:00"]  # once, in the first session
    assert sent(second, RealtimeModelSendToolOutput)[0].output == "booked for 19:00"
    assert [e.data["text"] for e in events if e.type == "user.text"] == ["A table for two at seven"]
    assert data_of(events, "session.resumed")[0]["epoch"] == 2
    assert shape(native)[:6] == BOOKED and shape(native)[6] == ("assistant", "Booked.", False)


def _seed_id(model: ScriptedRealtimeModel, n: int) -> str:
    return str(sent(model, RealtimeModelSendRawMessage)[n].message["other_data"]["item"]["id"])


# -- renew ----------------------------------------------------------------------------------------


async def test_a_session_the_provider_ends_is_renewed_with_the_running_tool_result_delivered(
    store_url: str, session_id: str
) -> None:
    calls: list[str] = []
    release = asyncio.Event()

    @function_tool
    async def book(when: str) -> str:
        """Books a table (the booking system is slow)."""
        calls.append(when)
        await release.wait()
        calls.append("finished")
        return f"booked for {when}"

    agent = RealtimeAgent(name="concierge", instructions="You book tables.", tools=[book])
    first, second = ScriptedRealtimeModel(strict=False), ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(agent, model=first).run()
        tap = await attach(session, ct, session_id)
        await session.enter()
        await session.send_message("A table for two at seven")
        await first.emit(*user_text("u1", "A table for two at seven"))
        await _ask(first)
        await until(lambda: calls == ["19:00"])
        # the server's session limit: an error, then the connection closes
        await first.emit(
            RealtimeModelErrorEvent(error={"type": "invalid_request_error", "code": "session_expired", "message": "x"}),
            RealtimeModelConnectionStatusEvent(status="disconnected"),
            RealtimeModelEndOfStreamEvent(),
        )
        assert tap.ended == "session_expired"
        renewed = await tap.renew(RealtimeRunner(agent, model=second))
        try:
            assert first.closed and calls == ["19:00"]  # the old session closed; the booking goes on
            items = seeded(second)
            assert [i["type"] for i in items] == ["message", "message", "function_call", "message"]
            assert items[2]["call_id"] == "c1" and items[-1]["role"] == "system"  # no output yet: it runs
            release.set()
            await until(lambda: sent(second, RealtimeModelSendToolOutput))
            (delivered,) = sent(second, RealtimeModelSendToolOutput)
            assert delivered.tool_call.call_id == "c1" and delivered.start_response
            assert delivered.output == "booked for 19:00"
        finally:
            await renewed.close()
        events = await logged(ct, session_id)
        native = (await ct.context(session_id)).native()
    assert calls == ["19:00", "finished"]
    assert not data_of(events, "tool.cancelled")
    assert data_of(events, "x.openai_agents.renewed") == [{"reason": "session_expired"}]
    assert data_of(events, "x.openai_agents.error") == [{"type": "invalid_request_error", "code": "session_expired"}]
    assert ("output", "c1", "booked for 19:00") in shape(native)


async def test_the_sdks_openai_transport_against_a_realtime_server(store_url: str, session_id: str) -> None:
    """The SDK's real OpenAI WebSocket transport, connected to a fake Realtime server: the raw server
    events it forwards are the tap's source; its own truncate (at the playback tracker's position) comes
    back as the server's ``conversation.item.truncated``, which says what the user heard."""
    runs: list[str] = []
    tracker = RealtimePlaybackTracker()
    call = {"id": "f1", "type": "function_call", "status": "completed", "call_id": "c1", "name": "book"}
    call["arguments"] = '{"when": "19:00"}'
    user = {"id": "u1", "type": "message", "role": "user", "status": "completed"}
    user["content"] = [{"type": "input_text", "text": "A table for two at seven"}]
    async with FakeRealtimeServer() as server, calltape.connect(store_url) as ct:
        config: Any = {"url": server.url, "headers": {"x-test": "1"}, "playback_tracker": tracker}
        session = await RealtimeRunner(booking_agent(runs)).run(model_config=config)
        tap = await attach(session, ct, session_id, playback=tracker)
        async with session:
            await session.send_message("A table for two at seven")
            await until(lambda: server.got("response.create"))
            await server.send(
                {"type": "conversation.item.added", "previous_item_id": None, "item": user},
                *server_reply("r1", "a1", "Let me check.", 800),
                {"type": "response.output_item.done", "response_id": "r1", "output_index": 1, "item": call},
                server_done("r1", "completed", call),
            )
            await until(lambda: server.got("conversation.item.create", type="function_call_output"))
            await until(lambda: len(server.got("response.create")) == 2)
            tracker.on_play_ms("a2", 0, 1500)  # what the app played of the next reply when the user spoke
            await server.send(*server_reply("r2", "a2", "Your table for two is booked for seven tonight.", 3000))
            await server.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": 5000, "item_id": "u2"})
            await until(lambda: server.got("conversation.item.truncate"))
            await server.send(server_done("r2", "cancelled", reason="turn_detected"))
            await until(lambda: getattr(tap.realtime.replies.state("r2"), "done", False))
        events = await logged(ct, session_id)
        native = (await ct.context(session_id)).native()
    assert runs == ["19:00"]
    assert (
        server.got("conversation.item.create", type="function_call_output")[0]["item"]["output"] == "booked for 19:00"
    )
    assert server.got("conversation.item.truncate")[0]["audio_end_ms"] == 1500
    assert not data_of(events, "x.openai_agents.error")
    assert shape(native) == BOOKED


# -- recording only, handoffs ---------------------------------------------------------------------


async def test_recording_only_unguarded_outputs_by_call_id_and_settled_at_close(session_id: str) -> None:
    """Into a recording-only sink the tools run as the SDK runs them: the output the SDK sends is the
    call's result (by call id), and a tool still running at close is settled, its outcome unknown."""
    from calltape.adapters.replies import EventCollector

    calls: list[str] = []

    @function_tool
    async def lookup(when: str) -> str:
        """Looks a slot up."""
        return f"free at {when}"

    @function_tool
    async def book(when: str) -> str:
        """Books (never finishes here)."""
        calls.append(when)
        await asyncio.sleep(30)
        return "booked"

    agent = RealtimeAgent(name="concierge", instructions="You book tables.", tools=[lookup, book])
    model = ScriptedRealtimeModel(strict=False)
    sink = EventCollector(session_id)
    session = await RealtimeRunner(agent, model=model).run()
    await attach(session, sink)
    async with session:
        await model.emit(*spoken_reply("r1", "a1", "One moment.", 500))
        await model.emit(function_call("c1", "lookup", '{"when": "19:00"}', "f1"))
        await until(lambda: sent(model, RealtimeModelSendToolOutput))
        # the output reaches the model before its response is done: kept until the call is recorded
        await model.emit(*tool_output_echo(sent(model, RealtimeModelSendToolOutput)[0], "f1"))
        await model.emit(function_call("c2", "book", '{"when": "19:00"}', "f2"), turn_ended("r1"))
        await until(lambda: calls == ["19:00"])
    kinds = [(e.type, e.data.get("call")) for e in sink.events if e.type.startswith("tool.")]
    # both calls are recorded when their response completes; the early output right after
    assert kinds == [("tool.call", "c1"), ("tool.call", "c2"), ("tool.result", "c1"), ("tool.cancelled", "c2")]
    assert sink.events[-1].data == {"call": "c2", "reason": "session_closed", "outcome": "unknown"}
    outputs = [i for i in sink.fold.native()["items"] if i["type"] == "function_call_output"]
    assert [(o["call_id"], o["output"]) for o in outputs] == [("c1", "free at 19:00"), ("c2", {"status": "unknown"})]


async def test_a_handoff_is_recorded_with_the_new_agents_instructions(store_url: str, session_id: str) -> None:
    billing = RealtimeAgent(name="billing", instructions="You answer billing questions.")
    triage = RealtimeAgent(name="triage", instructions="You route calls.", handoffs=[billing])
    model = ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(triage, model=model).run()
        await attach(session, ct, session_id)
        async with session:
            await model.emit(
                *spoken_reply("r1", "a1", "Let me transfer you.", 500),
                function_call("c1", "transfer_to_billing", "{}", "f1"),
                turn_ended("r1"),
            )
            await until(lambda: sent(model, RealtimeModelSendToolOutput))
        events = await logged(ct, session_id)
        native = (await ct.context(session_id)).native()
    (handoff,) = data_of(events, "agent.handoff")
    assert handoff == {"from": "triage", "to": "billing", "instructions": "You answer billing questions."}
    assert native["agent"] == "billing" and native["items"][0]["content"] == "You answer billing questions."
