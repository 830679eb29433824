"""Vapi: messages built from ``vapi`` SDK types, ingested into the real store, tools under run_tool."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from vapi.core.pydantic_utilities import parse_obj_as
from vapi.types import (
    Call,
    ServerMessageModelOutput,
    ServerMessageResponseToolCalls,
    ServerMessageSpeechUpdate,
    ServerMessageStatusUpdate,
    ServerMessageToolCalls,
    ServerMessageTranscript,
    ServerMessageUserInterrupted,
    ToolCall,
    ToolCallFunction,
)

from calltape.adapters.vapi import VapiIngest, run_tool_calls, tool_calls_of
from calltape.eventstore.recorder import Recorder
from calltape.projections import build_context, render
from calltape.runtime import CallSession

CALL = Call(id="vapi-call-1", org_id="org", created_at="2025-01-01T00:00:00Z", updated_at="2025-01-01T00:00:00Z")


def body(message: Any) -> dict[str, Any]:
    """Serializes an SDK message the way Vapi posts it: ``{"message": {...}}`` with camelCase keys."""
    return {"message": json.loads(json.dumps(message.dict(), default=str))}


def test_all_tool_call_shapes_are_read() -> None:
    nested = body(
        ServerMessageToolCalls(
            type="tool-calls",
            call=CALL,
            tool_with_tool_call_list=[],
            tool_call_list=[
                ToolCall(id="t1", type="function", function=ToolCallFunction(name="a", arguments='{"x": 1}'))
            ],
        )
    )["message"]
    assert [(c.id, c.name, c.arguments) for c in tool_calls_of(nested)] == [("t1", "a", {"x": 1})]
    flat = {"type": "tool-calls", "toolCallList": [{"id": "t2", "name": "b", "arguments": {"y": 2}}]}
    assert [(c.id, c.name, c.arguments) for c in tool_calls_of(flat)] == [("t2", "b", {"y": 2})]
    legacy = {
        "type": "tool-calls",
        "toolCalls": [{"id": "t3", "type": "function", "function": {"name": "c", "arguments": {}}}],
    }
    assert [(c.id, c.name) for c in tool_calls_of(legacy)] == [("t3", "c")]
    wrapped = {
        "type": "tool-calls",
        "toolWithToolCallList": [
            {"type": "function", "toolCall": {"id": "t4", "function": {"name": "d", "arguments": ""}}}
        ],
    }
    assert [(c.id, c.name, c.arguments) for c in tool_calls_of(wrapped)] == [("t4", "d", {})]
    with pytest.raises(ValueError):
        tool_calls_of({"toolCallList": [{"id": "t5", "function": {"name": "e", "arguments": "{not json"}}]})


async def test_barge_in_during_a_tool_call(store: Any) -> None:
    ingest = VapiIngest()

    async def post(message: Any) -> None:
        await store.append(ingest.events(body(message)))

    await post(ServerMessageStatusUpdate(type="status-update", status="in-progress", call=CALL))
    await post(ServerMessageSpeechUpdate(type="speech-update", status="started", role="user", call=CALL))
    await post(
        ServerMessageTranscript(
            type="transcript", role="user", transcript_type="partial", transcript="Book a", call=CALL
        )
    )
    await post(
        ServerMessageTranscript(
            type="transcript", role="user", transcript_type="final", transcript="Book a table for two.", call=CALL
        )
    )
    await post(ServerMessageSpeechUpdate(type="speech-update", status="stopped", role="user", call=CALL))
    # the SDK types ``output`` as an object; live calls carry the token text (construct skips the check)
    await post(ServerMessageModelOutput.construct(type="model-output", output="One moment ", call=CALL))
    await post(
        ServerMessageModelOutput(type="model-output", output={"content": "while I check availability."}, call=CALL)
    )
    tool_msg = ServerMessageToolCalls(
        type="tool-calls",
        call=CALL,
        tool_with_tool_call_list=[],
        tool_call_list=[
            ToolCall(id="tc-1", type="function", function=ToolCallFunction(name="book", arguments='{"people": 2}'))
        ],
    )
    await post(tool_msg)
    await post(ServerMessageSpeechUpdate(type="speech-update", status="started", role="assistant", call=CALL))
    await post(
        ServerMessageTranscript(
            type="transcript", role="assistant", transcript_type="final", transcript="One moment", call=CALL
        )
    )

    # the tool runs under the runtime while the user barges in
    recorder = Recorder(store)
    await recorder.start()
    call = await CallSession.attach(recorder, "vapi-call-1")
    release = asyncio.Event()
    runs = 0

    async def book(people: int) -> dict[str, Any]:
        nonlocal runs
        runs += 1
        await release.wait()
        return {"booked": True, "people": people}

    reply_body = asyncio.create_task(run_tool_calls(call, body(tool_msg), {"book": book}))
    await asyncio.sleep(0.01)
    await recorder.flush()
    await post(ServerMessageUserInterrupted(type="user-interrupted", call=CALL))
    await post(
        ServerMessageTranscript(
            type="transcript", role="user", transcript_type="final", transcript="Make it three.", call=CALL
        )
    )
    release.set()
    result = await reply_body
    assert parse_obj_as(ServerMessageResponseToolCalls, result).results[0].tool_call_id == "tc-1"  # type: ignore[index]
    assert result == {"results": [{"toolCallId": "tc-1", "name": "book", "result": '{"booked":true,"people":2}'}]}
    # Vapi retries the slow webhook: the stored result comes back, the tool does not run again
    assert await run_tool_calls(call, body(tool_msg), {"book": book}) == result
    assert runs == 1
    await recorder.close()

    # the same messages redelivered append nothing
    before = (await store.session_info("vapi-call-1")).last_seq
    await store.append(
        VapiIngest().events(body(ServerMessageStatusUpdate(type="status-update", status="in-progress", call=CALL)))
    )
    assert (await store.session_info("vapi-call-1")).last_seq == before

    context = render((await build_context(store, "vapi-call-1")).native(), "openai")
    assert (
        context
        == [
            {"role": "system", "content": ""},
            {"role": "user", "content": "Book a table for two."},
            {
                "role": "assistant",
                "content": "One moment",
                "tool_calls": [
                    {"id": "tc-1", "type": "function", "function": {"name": "book", "arguments": '{"people":2}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "tc-1", "content": '{"booked":true,"people":2}'},
            {"role": "user", "content": "Make it three."},
        ][0 if _has_system(context) else 1 :]
    )


def _has_system(context: list[dict[str, Any]]) -> bool:
    return bool(context) and context[0]["role"] == "system"
