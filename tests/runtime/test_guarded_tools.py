"""Guarded tool execution (SPEC section 3), each seed failure as a timeline on a real Recorder and a
real store (SQLite and PostgreSQL): the tool body counters prove exactly-once."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest
from runtime_support import (
    Body,
    assert_live_matches_log,
    assistant_then_outputs,
    live_call,
    log_of,
    output_of,
    reply,
    types_of,
)

from calltape.eventstore import EventStore, open_store
from calltape.runtime import DEFAULT_TIMEOUT, ToolSpec, canonical_arguments

# -- a tool result orphaned by a barge-in ------------------------------------------------------


async def test_result_after_barge_in_lands_after_its_assistant_message(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        call.emit("user.transcript", {"text": "Book a table for two.", "final": True})
        reply(call, "r1", "Let me book that for you.", ("t1", "book", {"people": 2}))
        call.emit("agent.speech.started", {"reply": "r1"})
        body = Body({"booking": "B-17"}, gated=True)
        task = asyncio.create_task(call.run_tool("t1", "book", {"people": 2}, body))
        await body.started.wait()

        call.interrupt(heard="Let me book")  # barge-in while the tool runs (policy: finish)
        call.emit("user.transcript", {"text": "Actually, make it three.", "final": True})
        body.release()
        outcome = await task

        assert (outcome.status, outcome.ran, outcome.output) == ("completed", True, {"booking": "B-17"})
        assert body.runs == 1 and body.cancelled == 0
        native = await assert_live_matches_log(live, store, session_id)
        roles = [(i["type"], i.get("role")) for i in native["items"]]
        assert roles == [
            ("message", "system"),
            ("message", "user"),
            ("message", "assistant"),
            ("function_call", None),
            ("function_call_output", None),
            ("message", "user"),
        ]
        assert native["items"][2] == {
            "type": "message",
            "role": "assistant",
            "content": "Let me book",
            "interrupted": True,
        }
        assert output_of(native, "t1") == {
            "type": "function_call_output",
            "call_id": "t1",
            "output": {"booking": "B-17"},
            "status": "completed",
        }
        assert native["clean"] is True

        events = await log_of(store, session_id)
        seq = {e.type: e.seq for e in events if e.type in ("interruption", "tool.result")}
        assert seq["tool.result"] > seq["interruption"]  # it really landed after the barge-in
        (late,) = live.of("late_result")
        assert late.figures["call"] == "t1" and late.figures["duration_ms"] >= 0
        assert [e.data["kind"] for e in events if e.type == "x.recovery"] == ["late_result"]

        # The OpenAI format pairs it too: the tool message follows its assistant tool_calls message.
        messages = call.context("openai")
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
        assert messages[2]["tool_calls"][0]["id"] == messages[3]["tool_call_id"] == "t1"


# -- a tool run twice after the LLM re-asks ----------------------------------------------------


async def test_same_call_id_asked_again_returns_the_stored_result(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        reply(call, "r1", None, ("t1", "book", {"people": 2}))
        body = Body({"booking": "B-1"})
        first = await call.run_tool("t1", "book", {"people": 2}, body)
        again = await call.run_tool("t1", "book", {"people": 2}, body)
        assert body.runs == 1
        assert (first.ran, again.ran) == (True, False)
        assert again.output == first.output == {"booking": "B-1"} and again.status == "completed"
        assert [r.figures["call"] for r in live.of("duplicate_prevented")] == ["t1"]
        await live.recorder.flush()
        events = await log_of(store, session_id)
        assert types_of(events).count("tool.started") == 1
        assert types_of(events).count("tool.result") == 1


async def test_same_call_id_in_a_new_process_is_answered_from_the_log(store: EventStore, session_id: str) -> None:
    """Exactly-once across processes: the second process only has the log."""
    async with live_call(store, session_id) as live:
        reply(live.call, "r1", None, ("t1", "book", {"people": 2}))
        body = Body({"booking": "B-1"})
        await live.call.run_tool("t1", "book", {"people": 2}, body)
    async with live_call(store, session_id, attach=True) as again:
        outcome = await again.call.run_tool("t1", "book", {"people": 2}, body)
    assert (body.runs, outcome.ran, outcome.output) == (1, False, {"booking": "B-1"})


async def test_concurrent_reask_while_running_runs_once(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        reply(call, "r1", None, ("t1", "book", {"people": 2}))
        body = Body({"booking": "B-2"}, gated=True)
        first = asyncio.create_task(call.run_tool("t1", "book", {"people": 2}, body))
        await body.started.wait()
        second = asyncio.create_task(call.run_tool("t1", "book", {"people": 2}, body))
        third = asyncio.create_task(call.run_tool("t1", "book", {"people": 2}, body))
        await asyncio.sleep(0.01)
        body.release()
        outcomes = await asyncio.gather(first, second, third)
        assert body.runs == 1
        assert [o.ran for o in outcomes] == [True, False, False]
        assert {o.status for o in outcomes} == {"completed"}
        assert all(o.output == {"booking": "B-2"} for o in outcomes)
        assert [r.figures.get("while_running") for r in live.of("duplicate_prevented")] == [True, True]
        await live.recorder.flush()
        assert types_of(await log_of(store, session_id)).count("tool.started") == 1


async def test_reuse_identical_answers_an_equal_call_under_a_new_id(store: EventStore, session_id: str) -> None:
    reuse = ToolSpec(reuse_identical=True)
    async with live_call(store, session_id, tools={"book": reuse}) as live:
        call = live.call
        # (keys in PostgreSQL jsonb order: see test_store_gaps.py for why that matters)
        reply(call, "r1", None, ("t1", "book", {"time": "20:00", "people": 2}))
        body = Body({"booking": "B-3"})
        await call.run_tool("t1", "book", {"time": "20:00", "people": 2}, body)
        # The LLM re-asks with a new call id, the keys in another order, as a JSON string.
        asked = '{"people": 2,  "time": "20:00"}'
        reply(call, "r2", None, ("t2", "book", asked))
        outcome = await call.run_tool("t2", "book", asked, body)
        assert (body.runs, outcome.ran, outcome.status) == (1, False, "completed")
        assert outcome.output == {"booking": "B-3"}
        (dup,) = live.of("duplicate_prevented")
        assert dup.figures == {"call": "t2", "name": "book", "identical_to": "t1"}
        native = await assert_live_matches_log(live, store, session_id)
        assert output_of(native, "t2")["output"] == {"booking": "B-3"}
        events = await log_of(store, session_id)
        assert [e.data["call"] for e in events if e.type == "tool.started"] == ["t1"]
        (reused,) = [e for e in events if e.type == "tool.result" and e.data["call"] == "t2"]
        assert reused.data["reused_from"] == "t1"

        # Different arguments are a different call: it runs.
        reply(call, "r3", None, ("t3", "book", {"time": "20:00", "people": 3}))
        third = await call.run_tool("t3", "book", {"time": "20:00", "people": 3}, body)
        assert (body.runs, third.ran) == (2, True)


async def test_identical_call_runs_again_without_the_opt_in(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        body = Body({"booking": "B-4"})
        reply(call, "r1", None, ("t1", "book", {"people": 2}))
        await call.run_tool("t1", "book", {"people": 2}, body)
        reply(call, "r2", None, ("t2", "book", '{"people": 2}'))
        outcome = await call.run_tool("t2", "book", '{"people": 2}', body)
        assert (body.runs, outcome.ran) == (2, True)
        assert live.of("duplicate_prevented") == []


def test_canonical_arguments_ignore_key_order_and_string_form() -> None:
    assert canonical_arguments({"a": 1, "b": [1, 2]}) == canonical_arguments('{"b": [1, 2], "a": 1}')
    assert canonical_arguments(b'{"b":2,"a":1}') == canonical_arguments({"a": 1, "b": 2})
    assert canonical_arguments("") == canonical_arguments({})
    assert canonical_arguments({"a": 1}) != canonical_arguments({"a": 2})


# -- a queued call of a cancelled generation ---------------------------------------------------


async def test_call_of_an_interrupted_reply_is_never_started(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        call = live.call
        call.emit("user.text", {"text": "Cancel my booking and book a new one."})
        reply(call, "r1", "Sure, one moment.", ("t1", "cancel", {"id": "B-1"}), ("t2", "book", {"people": 2}))
        call.emit("agent.speech.started", {"reply": "r1"})
        call.interrupt(heard="Sure,")  # barge-in before the queued calls were started
        body = Body()
        first = await call.run_tool("t1", "cancel", {"id": "B-1"}, body)
        second = await call.run_tool("t2", "book", {"people": 2}, body)
        again = await call.run_tool("t1", "cancel", {"id": "B-1"}, body)

        assert body.runs == 0
        for outcome in (first, second, again):
            assert (outcome.ran, outcome.status) == (False, "cancelled")
            assert outcome.output == {"status": "cancelled", "reason": "interrupted"}
        assert [r.figures["call"] for r in live.of("not_started")] == ["t1", "t2", "t1"]

        native = await assert_live_matches_log(live, store, session_id)
        assistant_then_outputs(native, ["t1", "t2"])
        assert native["items"][2]["interrupted"] is True
        for cid in ("t1", "t2"):
            assert output_of(native, cid)["output"] == {"status": "cancelled", "reason": "interrupted"}
            assert output_of(native, cid)["status"] == "cancelled"
        assert native["clean"] is True

        events = await log_of(store, session_id)
        assert "tool.started" not in types_of(events)
        cancels = [e.data for e in events if e.type == "tool.cancelled"]
        # one explicit "did not run" per call, even though t1 was asked twice
        assert cancels == [
            {"call": "t1", "reason": "interrupted", "outcome": "not_run"},
            {"call": "t2", "reason": "interrupted", "outcome": "not_run"},
        ]


async def test_call_arriving_after_the_interruption_is_never_started(store: EventStore, session_id: str) -> None:
    """Late tool calls of a cancelled generation (the LLM stream still flushing) stay out."""
    async with live_call(store, session_id) as live:
        call = live.call
        reply(call, "r1", "Let me", done=False)  # still generating
        call.interrupt()
        call.emit("tool.call", {"reply": "r1", "call": "t9", "name": "book", "arguments": {}})
        call.emit("agent.reply.done", {"reply": "r1"})
        body = Body()
        outcome = await call.run_tool("t9", "book", {}, body)
        assert (body.runs, outcome.ran, outcome.status) == (0, False, "cancelled")
        native = await assert_live_matches_log(live, store, session_id)
        assert [i for i in native["items"] if i.get("call_id") == "t9"] == []
        assert [i["type"] for i in native["items"]] == ["message"]  # only the system message


# -- a tool that hangs -------------------------------------------------------------------------


def test_every_tool_has_a_timeout_by_default() -> None:
    assert DEFAULT_TIMEOUT == 10.0
    assert ToolSpec().timeout == 10.0
    assert ToolSpec(timeout=2).timeout == 2


@pytest.mark.parametrize("forever", [None, 0, 0.0, -1, math.inf, -math.inf, math.nan, "10", True])
def test_a_forever_timeout_is_refused(forever: Any) -> None:
    with pytest.raises(ValueError, match="timeout"):
        ToolSpec(timeout=forever)


async def test_a_hanging_tool_times_out(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id, tools={"lookup": ToolSpec(timeout=0.2)}) as live:
        call = live.call
        reply(call, "r1", None, ("t1", "lookup", {"q": "menu"}))
        body = Body(gated=True)  # never released: hangs forever
        started = time.perf_counter()
        outcome = await call.run_tool("t1", "lookup", {"q": "menu"}, body)
        elapsed = time.perf_counter() - started
        assert 0.2 <= elapsed < 2.0
        assert (outcome.status, outcome.ran, outcome.output) == ("timeout", True, {"status": "timeout"})
        await asyncio.wait_for(body.finished.wait(), 1)
        assert body.cancelled == 1  # the body was taken down, not left running
        (timeout,) = live.of("timeout")
        assert timeout.figures == {"call": "t1", "name": "lookup", "timeout_s": 0.2}

        native = await assert_live_matches_log(live, store, session_id)
        assert output_of(native, "t1")["output"] == {"status": "timeout"}
        assert output_of(native, "t1")["status"] == "timeout"
        events = await log_of(store, session_id)
        (cancel,) = [e.data for e in events if e.type == "tool.cancelled"]
        assert cancel["reason"] == "timeout"

        # Asked again under the same call id: the timeout stands, the body does not run again.
        again = await call.run_tool("t1", "lookup", {"q": "menu"}, Body())
        assert (again.ran, again.status) == (False, "timeout")


async def test_explicit_spec_argument_overrides_the_session_tools(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id, tools={"lookup": ToolSpec(timeout=5)}) as live:
        reply(live.call, "r1", None, ("t1", "lookup", {}))
        started = time.perf_counter()
        outcome = await live.call.run_tool("t1", "lookup", {}, Body(gated=True), spec=ToolSpec(timeout=0.05))
        assert outcome.status == "timeout" and time.perf_counter() - started < 2


# -- interruption policy -----------------------------------------------------------------------


async def test_on_interrupt_cancel_cancels_the_body(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id, tools={"search": ToolSpec(on_interrupt="cancel")}) as live:
        call = live.call
        reply(call, "r1", "Searching.", ("t1", "search", {"q": "pizza"}))
        call.emit("agent.speech.started", {"reply": "r1"})
        body = Body(gated=True)
        task = asyncio.create_task(call.run_tool("t1", "search", {"q": "pizza"}, body))
        await body.started.wait()
        started = time.perf_counter()
        call.interrupt()
        outcome = await asyncio.wait_for(task, 2)
        assert time.perf_counter() - started < 1.0
        assert body.cancelled == 1 and body.runs == 1
        assert outcome.ran is True

        native = await assert_live_matches_log(live, store, session_id)
        # What run_tool returns is what the context (and so the LLM) shows for the call.
        assert outcome.output == output_of(native, "t1")["output"]
        assert outcome.status == output_of(native, "t1")["status"]
        assert outcome.status in ("cancelled", "unknown")  # it had started: side effects may have happened
        events = await log_of(store, session_id)
        (cancel,) = [e.data for e in events if e.type == "tool.cancelled"]
        assert cancel["call"] == "t1" and cancel["reason"] == "interrupted"
        assert "tool.result" not in types_of(events)
        assert native["clean"] is True


async def test_on_interrupt_finish_keeps_running_and_delivers(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:  # "finish" is the default
        assert ToolSpec().on_interrupt == "finish"
        call = live.call
        reply(call, "r1", "Booking.", ("t1", "book", {}))
        call.emit("agent.speech.started", {"reply": "r1"})
        body = Body({"booking": "B-9"}, gated=True)
        task = asyncio.create_task(call.run_tool("t1", "book", {}, body))
        await body.started.wait()
        call.interrupt()
        await asyncio.sleep(0.05)
        assert not task.done() and body.cancelled == 0
        body.release()
        outcome = await task
        assert (outcome.status, outcome.ran, outcome.output) == ("completed", True, {"booking": "B-9"})
        native = await assert_live_matches_log(live, store, session_id)
        assert output_of(native, "t1")["output"] == {"booking": "B-9"}
        assert [r.figures["call"] for r in live.of("late_result")] == ["t1"]


async def test_caller_cancelling_run_tool_takes_the_body_down(store: EventStore, session_id: str) -> None:
    """The framework tearing the call down (not an interruption): the body does not outlive it."""
    async with live_call(store, session_id) as live:
        reply(live.call, "r1", None, ("t1", "book", {}))
        body = Body(gated=True)
        task = asyncio.create_task(live.call.run_tool("t1", "book", {}, body))
        await body.started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(body.finished.wait(), 1)
        assert body.cancelled == 1


# -- errors, progress, durability --------------------------------------------------------------


async def test_a_raising_tool_records_an_error_result(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        reply(live.call, "r1", None, ("t1", "book", {}))
        body = Body(error=RuntimeError("no table free"))
        outcome = await live.call.run_tool("t1", "book", {}, body)
        assert (outcome.status, outcome.ran, outcome.output) == ("error", True, {"error": "no table free"})
        native = await assert_live_matches_log(live, store, session_id)
        assert output_of(native, "t1") == {
            "type": "function_call_output",
            "call_id": "t1",
            "output": {"error": "no table free"},
            "status": "error",
        }
        (result,) = [e.data for e in await log_of(store, session_id) if e.type == "tool.result"]
        assert result["error"] is True
        again = await live.call.run_tool("t1", "book", {}, body)
        assert (body.runs, again.ran, again.status) == (1, False, "error")


async def test_progress_checkpoints_are_recorded(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        reply(live.call, "r1", None, ("t1", "migrate", {}))

        async def body(progress: Any) -> Any:
            progress({"step": 1})
            progress({"step": 2}, "halfway")
            return {"done": True}

        outcome = await live.call.run_tool("t1", "migrate", {}, body)
        assert outcome.status == "completed"
        await live.recorder.flush()
        progress = [e.data for e in await log_of(store, session_id) if e.type == "tool.progress"]
        assert progress == [
            {"call": "t1", "state": {"step": 1}},
            {"call": "t1", "state": {"step": 2}, "message": "halfway"},
        ]
        state = live.call.call_state("t1")
        assert state is not None and state.progress == {"step": 2} and state.has_progress


async def test_tool_started_is_committed_before_the_body_runs(
    store: EventStore, store_url: str, session_id: str
) -> None:
    other = await open_store(store_url)  # another connection pool: sees only what has committed
    seen: list[list[str]] = []
    try:
        async with live_call(store, session_id) as live:
            reply(live.call, "r1", None, ("t1", "book", {}))

            async def body() -> Any:
                events = await other.read(session_id)
                seen.append([f"{e.type}:{e.data.get('call', '')}" for e in events])
                return {"ok": True}

            await live.call.run_tool("t1", "book", {}, body)
    finally:
        await other.close()
    (log,) = seen
    assert log[-1] == "tool.started:t1"
    assert "tool.call:t1" in log and not any(entry.startswith("tool.result") for entry in log)
