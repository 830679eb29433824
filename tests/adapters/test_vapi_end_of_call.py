"""Vapi ``end-of-call-report`` for a call calltape never saw live: rebuilt from ``artifact.messages``."""

from __future__ import annotations

import json
from typing import Any

from vapi.types import (
    Analysis,
    Artifact,
    BotMessage,
    Call,
    ServerMessageEndOfCallReport,
    SystemMessage,
    ToolCallMessage,
    ToolCallResultMessage,
    UserMessage,
)

from calltape.adapters.vapi import VapiIngest
from calltape.eventstore import EventStore
from calltape.projections import build_context, render
from tests.adapters.hosted_support import tool_json

T0 = 1_735_812_000_000  # 2025-01-02T10:00:00Z
CALL = Call(id="vapi-eoc-1", org_id="org", created_at="2025-01-02T10:00:00Z", updated_at="2025-01-02T10:02:00Z")


def report() -> dict[str, Any]:
    msg = ServerMessageEndOfCallReport(
        type="end-of-call-report",
        ended_reason="customer-ended-call",
        call=CALL,
        analysis=Analysis(summary="Booked a table."),
        started_at="2025-01-02T10:00:00Z",
        ended_at="2025-01-02T10:02:00Z",
        artifact=Artifact(
            messages=[
                SystemMessage(role="system", message="You book tables.", time=T0, seconds_from_start=0),
                BotMessage(
                    role="bot", message="Hi, how can I help?", time=T0 + 1000, end_time=T0 + 2000, seconds_from_start=1
                ),
                UserMessage(
                    role="user", message="A table for two.", time=T0 + 3000, end_time=T0 + 4000, seconds_from_start=3
                ),
                ToolCallMessage(
                    role="tool_calls",
                    message="",
                    time=T0 + 5000,
                    seconds_from_start=5,
                    tool_calls=[
                        {"id": "tc-1", "type": "function", "function": {"name": "book", "arguments": '{"people": 2}'}}
                    ],
                ),
                ToolCallResultMessage(
                    role="tool_call_result",
                    tool_call_id="tc-1",
                    name="book",
                    result='{"booked": true}',
                    time=T0 + 6000,
                    seconds_from_start=6,
                ),
                BotMessage(
                    role="bot", message="Booked for two.", time=T0 + 7000, end_time=T0 + 8000, seconds_from_start=7
                ),
            ]
        ),
    )
    return {"message": json.loads(json.dumps(msg.dict(by_alias=True), default=str))}


async def test_a_call_never_seen_live_is_reconstructed(store: EventStore) -> None:
    body = report()
    events = VapiIngest().events(body)
    await store.append(events)
    stored = await store.read("vapi-eoc-1")
    assert stored[0].type == "session.started"
    assert stored[0].data["metadata"]["reconstructed"] is True
    assert stored[0].data["metadata"]["source"] == "vapi.end_of_call_report"
    assert stored[0].data["instructions"] == "You book tables."
    assert stored[-1].type == "session.ended" and stored[-1].data == {"reason": "customer-ended-call"}
    assert stored[0].at_ms == T0 and stored[-1].at_ms == T0 + 120_000

    context = render((await build_context(store, "vapi-eoc-1")).native(), "openai")
    assert tool_json(context) == [
        {"role": "system", "content": "You book tables."},
        {"role": "assistant", "content": "Hi, how can I help?"},
        {"role": "user", "content": "A table for two."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "tc-1", "type": "function", "function": {"name": "book", "arguments": '{"people":2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "tc-1", "content": {"booked": True}},
        {"role": "assistant", "content": "Booked for two."},
    ]
    # Vapi redelivers the report (a fresh ingest, e.g. after a restart): nothing new is written
    before = len(stored)
    await store.append(VapiIngest().events(body))
    assert len(await store.read("vapi-eoc-1")) == before


async def test_a_report_for_a_live_call_only_closes_it(store: EventStore) -> None:
    ingest = VapiIngest()
    live = {"message": {"type": "model-output", "output": "Hello.", "call": {"id": "vapi-eoc-2"}}}
    await store.append(ingest.events(live))
    body = report()
    body["message"]["call"]["id"] = "vapi-eoc-2"
    added = ingest.events(body)
    assert [e.type for e in added] == ["agent.reply.done", "session.ended"]
    await store.append(added)
    assert not any(e.data.get("metadata", {}).get("reconstructed") for e in await store.read("vapi-eoc-2"))
