"""Retell webhooks: ``call`` objects from the ``retell`` SDK types, transfer events, idempotent ingest."""

from __future__ import annotations

import json
from typing import Any

import pytest
from retell.types import PhoneCallResponse

from calltape.adapters.retell import retell_webhook_events
from calltape.errors import InvalidEvent
from calltape.eventstore import EventStore
from calltape.projections import build_context

START = 1_735_810_000_000


def call(**extra: Any) -> dict[str, Any]:
    model = PhoneCallResponse.model_validate(
        {
            "call_id": "retell-tx-1",
            "agent_id": "ag_1",
            "agent_version": 1,
            "agent_name": "front-desk",
            "call_status": "ongoing",
            "call_type": "phone_call",
            "direction": "inbound",
            "from_number": "+15550001",
            "to_number": "+15550002",
            "start_timestamp": START,
            **extra,
        }
    )
    dumped: dict[str, Any] = json.loads(model.model_dump_json(exclude_none=True))
    return dumped


def webhook(event: str, **extra: Any) -> dict[str, Any]:
    return {"event": event, "call": call(**extra)}


async def test_transfer_events(store: EventStore) -> None:
    sid = "retell-tx-1"
    started = retell_webhook_events(webhook("call_started"))
    assert [e.type for e in started] == ["session.started"]
    assert started[0].data["agent"] == "front-desk" and started[0].data["framework"] == "retell"
    await store.append(started)
    dest = "+15559999"
    transfer_started = retell_webhook_events(webhook("transfer_started", transfer_destination=dest), started=True)
    assert [(e.type, e.data) for e in transfer_started] == [
        ("x.retell.transfer_started", {"transfer_destination": dest})
    ]
    bridged = retell_webhook_events(webhook("transfer_bridged", transfer_destination=dest), started=True)
    assert [(e.type, e.data) for e in bridged] == [
        ("agent.handoff", {"from": "front-desk", "to": dest, "reason": "transfer"})
    ]
    ended = retell_webhook_events(
        webhook("transfer_ended", transfer_destination=dest, transfer_end_timestamp=START + 90_000), started=True
    )
    assert [e.type for e in ended] == ["x.retell.transfer_ended"]
    cancelled = retell_webhook_events(webhook("transfer_cancelled"), started=True)
    assert [(e.type, e.data) for e in cancelled] == [("x.retell.transfer_cancelled", {})]
    for batch in (transfer_started, bridged, ended, cancelled):
        await store.append(batch)
    # redelivery of any of them writes nothing
    info = await store.session_info(sid)
    assert info is not None
    await store.append(retell_webhook_events(webhook("transfer_bridged", transfer_destination=dest), started=True))
    after = await store.session_info(sid)
    assert after is not None and after.last_seq == info.last_seq
    native = (await build_context(store, sid)).native()
    assert native["agent"] == dest
    assert [i for i in native["items"] if i["type"] == "handoff"] == [
        {"type": "handoff", "from": "front-desk", "to": dest}
    ]


def test_call_ended_with_tool_calls_is_reconstructed() -> None:
    body = webhook(
        "call_ended",
        call_status="ended",
        end_timestamp=START + 60_000,
        disconnection_reason="call_transfer",
        transfer_destination="+15559999",
        transcript_with_tool_calls=[
            {"role": "user", "content": "Where is my order?", "words": [{"word": "Where", "start": 1.0, "end": 1.2}]},
            {"role": "tool_call_invocation", "tool_call_id": "t1", "name": "lookup", "arguments": '{"id": 7}'},
            {"role": "tool_call_result", "tool_call_id": "t1", "content": '{"eta": "Friday"}', "successful": True},
            {"role": "agent", "content": "It arrives Friday.", "words": [{"word": "It", "start": 3.0, "end": 3.1}]},
        ],
    )
    events = retell_webhook_events(body)
    types = [e.type for e in events]
    assert types[0] == "session.started" and events[0].data["metadata"]["reconstructed"] is True
    assert types[-1] == "session.ended" and events[-1].data == {"reason": "call_transfer"}
    assert ("tool.call", "lookup") in [(e.type, e.data.get("name")) for e in events]
    assert [e.data["output"] for e in events if e.type == "tool.result"] == [{"eta": "Friday"}]
    assert events[1].at_ms == START + 1000  # word timings place the lines


def test_malformed_webhooks_are_rejected() -> None:
    with pytest.raises(InvalidEvent):
        retell_webhook_events({"event": "call_started"})
    with pytest.raises(InvalidEvent):
        retell_webhook_events({"call": {"call_id": "x"}})
