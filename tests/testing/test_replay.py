"""Replay of a recorded call into a changed agent, on SQLite and PostgreSQL: the fork is the ``replay
--to`` prefix copy, the recorded outputs answer the recorded calls (the real tool never runs again),
and the first difference between the recorded and the new context is named with its instants."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from calltape import CallSession
from calltape.eventstore import EventStore
from calltape.eventstore.fork import ForkRefused
from calltape.eventstore.recorder import Recorder
from calltape.testing.replay import RecordedCall, replay

BOOKINGS: list[dict[str, Any]] = []

Confirm = Callable[[dict[str, Any]], str]
Runner = Callable[[CallSession, str, str, dict[str, Any], str], Any]


def confirm_v1(output: dict[str, Any]) -> str:
    if "reference" not in output:
        return "Sorry, I could not book it."
    return f"Your table is booked, reference {output['reference']}."


async def book_table() -> dict[str, Any]:
    """The real tool: a side effect a replay must never repeat."""
    booking = {"reference": f"BK-{len(BOOKINGS) + 1}"}
    BOOKINGS.append(booking)
    return booking


class Agent:
    """A small scripted agent: books when asked, confirms with the tool's output, says goodbye."""

    def __init__(self, confirm: Confirm = confirm_v1, when: str = "20:00") -> None:
        self.confirm, self.when = confirm, when

    def _say(self, call: CallSession, reply: str, text: str, tool: tuple[str, str, dict[str, Any]] | None) -> None:
        call.emit("agent.reply.started", {"reply": reply})
        call.emit("agent.text", {"reply": reply, "text": text})
        if tool is not None:
            call_id, name, arguments = tool
            call.emit("tool.call", {"reply": reply, "call": call_id, "name": name, "arguments": arguments})
        call.emit("agent.reply.done", {"reply": reply})
        call.emit("agent.speech.started", {"reply": reply})
        call.emit("agent.speech.ended", {"reply": reply, "interrupted": False})

    async def respond(self, call: CallSession, run: Runner) -> None:
        items = call.context()["items"]
        n = sum(1 for i in items if i.get("role") == "assistant")
        question = items[-1]["content"] if items[-1].get("role") == "user" else ""
        if "table" in question:
            arguments = {"people": 2, "time": self.when}
            self._say(call, f"r{n}", "Let me book that.", (f"c{n}", "book_table", arguments))
            outcome = await run(call, f"c{n}", "book_table", arguments, f"r{n}")
            self._say(call, f"r{n}b", self.confirm(outcome.output), None)
        else:
            self._say(call, f"r{n}", "Goodbye!", None)

    @staticmethod
    def hear(call: CallSession, text: str) -> None:
        call.emit("user.speech.started", {"source": "vad"})
        call.emit("user.transcript", {"text": text, "final": True})
        call.emit("user.speech.stopped")

    async def live(self, call: CallSession, turns: list[str]) -> None:
        async def run(call: CallSession, call_id: str, name: str, arguments: dict[str, Any], reply: str) -> Any:
            return await call.run_tool(call_id, name, arguments, book_table, reply=reply)

        for text in turns:
            self.hear(call, text)
            await self.respond(call, run)

    async def continue_call(self, call: CallSession, recorded: RecordedCall) -> None:
        """The replay entry point: answer what is pending at the fork, then the caller's later turns."""

        async def run(call: CallSession, call_id: str, name: str, arguments: dict[str, Any], reply: str) -> Any:
            return await recorded.run_tool(call, call_id, name, arguments, reply=reply)

        if call.context()["items"][-1].get("role") == "user":
            await self.respond(call, run)
        for text in recorded.user_turns:
            self.hear(call, text)
            await self.respond(call, run)


async def record(store: EventStore, session: str) -> int:
    """Records the original call; returns the seq of the caller's first transcript (the fork point)."""
    recorder = Recorder(store)
    await recorder.start()
    try:
        call = await CallSession.start(recorder, session, agent="concierge-v1", instructions="Book tables.")
        await Agent().live(call, ["a table for two at eight please", "no that's all"])
        await call.end()
    finally:
        await recorder.close()
    events = await store.read(session)
    return next(e.seq for e in events if e.type == "user.transcript" and e.seq is not None)


async def test_the_same_agent_replays_without_a_difference_and_without_running_the_tool(
    store: EventStore, session_id: str
) -> None:
    at = await record(store, session_id)
    bookings = len(BOOKINGS)
    result = await replay(store, session_id, Agent().continue_call, at=at, into=f"{session_id}-v1")
    assert result.same, result.divergence and result.divergence.describe()
    result.assert_same()
    assert len(BOOKINGS) == bookings  # the recorded output answered the call
    assert result.unanswered == []
    # the fork is the recorded prefix (types, data, times), then the new agent's events
    original = await store.read(session_id)
    assert [(e.type, e.data, e.at_ms) for e in result.events[:at]] == [(e.type, e.data, e.at_ms) for e in original[:at]]
    assert {e.session for e in result.events} == {f"{session_id}-v1"}
    assert len({e.id for e in result.events} & {e.id for e in original}) == 0
    outputs = [i for i in result.new if i["type"] == "function_call_output"]
    assert [json.dumps(o["output"]) for o in outputs] == [json.dumps(original_output(original))]


def original_output(events: list[Any]) -> Any:
    return next(e.data["output"] for e in events if e.type == "tool.result")


async def test_a_changed_reply_is_the_first_difference_with_its_instants(
    store: EventStore, session_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    at = await record(store, session_id)
    v2 = Agent(confirm=lambda output: f"Done! Booking {output['reference']} is yours.")
    result = await replay(store, session_id, v2.continue_call, at=at)
    assert not result.same and result.into.startswith(f"{session_id}-replay-{at}-")
    d = result.divergence
    assert d is not None and d.kind() == "assistant message"
    assert d.recorded is not None and d.new is not None
    assert d.recorded["content"].startswith("Your table is booked") and d.new["content"].startswith("Done!")
    # the items before it are the same: system, the question, "Let me book that.", the call, its output
    assert [i["type"] for i in result.new[: d.index]] == [
        "message",
        "message",
        "message",
        "function_call",
        "function_call_output",
    ]
    recorded_events = {e.seq: e for e in await store.read(session_id)}
    new_events = {e.seq: e for e in result.events}
    assert d.recorded_seq is not None and d.new_seq is not None
    assert recorded_events[d.recorded_seq].type == "agent.text"  # the instant the reply's text was generated
    assert new_events[d.new_seq].type == "agent.text" and d.new_seq > at
    assert d.recorded_offset_ms is not None and d.recorded_offset_ms >= 0
    text = d.describe()
    assert "first difference at context item 5" in text and f"seq {d.recorded_seq}" in text and "Done!" in text
    with pytest.raises(AssertionError) as failure:
        result.assert_same()
    message = str(failure.value)
    assert f"item {d.index} (assistant message)" in message and f"recorded seq {d.recorded_seq}" in message
    assert "Done" not in message and "booked" not in message  # the call's words go to stderr, not the error
    assert "Done! Booking" in capsys.readouterr().err


async def test_a_call_the_record_cannot_answer_is_reported(store: EventStore, session_id: str) -> None:
    at = await record(store, session_id)
    bookings = len(BOOKINGS)
    result = await replay(store, session_id, Agent(when="20:30").continue_call, at=at)
    assert result.unanswered == ["c0"] and len(BOOKINGS) == bookings
    d = result.divergence
    assert d is not None and d.kind() == "function_call" and d.index == 3
    assert d.recorded is not None and d.new is not None
    assert json.loads(d.recorded["arguments"])["time"] == "20:00" and json.loads(d.new["arguments"])["time"] == "20:30"
    output = next(i for i in result.new if i["type"] == "function_call_output")
    assert output["status"] == "error" and "no output left for tool 'book_table'" in output["output"]["error"]


async def test_a_new_agent_that_stops_early_diverges_where_its_context_ends(store: EventStore, session_id: str) -> None:
    at = await record(store, session_id)

    async def silent(call: CallSession, recorded: RecordedCall) -> None:
        assert recorded.user_turns == ["no that's all"]

    result = await replay(store, session_id, silent, at=at)
    d = result.divergence
    assert d is not None and d.new is None and d.new_seq is None and d.recorded is not None
    assert d.index == len(result.new) and "(nothing)" in d.describe()


async def test_fork_refusals(store: EventStore, session_id: str) -> None:
    at = await record(store, session_id)
    last = len(await store.read(session_id))
    with pytest.raises(ForkRefused, match=f"seq {last + 1} is past the end of session"):
        await replay(store, session_id, Agent().continue_call, at=last + 1)
    await replay(store, session_id, Agent().continue_call, at=at, into=f"{session_id}-x")
    with pytest.raises(ForkRefused, match="already has"):
        await replay(store, session_id, Agent().continue_call, at=at, into=f"{session_id}-x")
