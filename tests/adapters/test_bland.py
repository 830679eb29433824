"""Bland post-call webhook → a reconstructed session. Bland publishes no Python SDK types: the payload
follows its documented post-call webhook (``call_id``, ``transcripts[]`` with ``user``/``text``/``created_at``)."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest

from calltape.adapters.bland import BlandPostCall, bland_events, verify_bland_signature
from calltape.errors import InvalidEvent
from calltape.events import parse_time
from calltape.eventstore import EventStore
from calltape.projections import build_context, render

POST_CALL: dict[str, Any] = {
    "call_id": "bland-t1",
    "created_at": "2025-01-02 09:59:58",
    "started_at": "2025-01-02T10:00:00.000Z",
    "end_at": "2025-01-02T10:01:00.000Z",
    "completed": True,
    "inbound": True,
    "from": "+15550001",
    "to": "+15550002",
    "call_length": 1.0,
    "call_ended_by": "USER",
    "summary": "Rescheduled.",
    "metadata": {"crm": "42"},
    "transcripts": [
        {"id": 1, "created_at": "2025-01-02T10:00:01.000Z", "text": "Hello, this is Ava.", "user": "assistant"},
        {"id": 2, "created_at": "2025-01-02T10:00:04.000Z", "text": "I need to reschedule.", "user": "user"},
        {"id": 3, "created_at": "2025-01-02T10:00:05.000Z", "text": "Looked up booking", "user": "agent-action"},
        {"id": 4, "created_at": "2025-01-02T10:00:08.000Z", "text": "Sure, what day works?", "user": "assistant"},
        {"id": 5, "created_at": "2025-01-02T10:00:11.000Z", "text": "Friday.", "user": "user"},
    ],
}


def test_signature() -> None:
    body = json.dumps(POST_CALL).encode()
    good = hmac.new(b"whsec", body, hashlib.sha256).hexdigest()
    assert verify_bland_signature(body, "whsec", good)
    assert verify_bland_signature(body, "whsec", good.upper())
    assert not verify_bland_signature(body, "other", good)
    assert not verify_bland_signature(body + b" ", "whsec", good)
    assert not verify_bland_signature(body, "whsec", None)
    assert not verify_bland_signature(body, "whsec", "")


def test_mapping_and_reconstructed_flag() -> None:
    events = bland_events(POST_CALL)
    assert [e.type for e in events] == [
        "session.started",
        "agent.reply.started",
        "agent.text",
        "agent.reply.done",
        "agent.speech.started",
        "agent.speech.ended",
        "user.transcript",
        "x.bland.agent_action",
        "agent.reply.started",
        "agent.text",
        "agent.reply.done",
        "agent.speech.started",
        "agent.speech.ended",
        "user.transcript",
        "session.ended",
    ]
    start = events[0]
    assert start.session == "bland-t1"
    assert start.data["framework"] == "bland"
    assert start.data["metadata"]["reconstructed"] is True
    assert start.data["metadata"]["from"] == "+15550001" and start.data["metadata"]["bland_metadata"] == {"crm": "42"}
    assert start.at_ms == parse_time("2025-01-02T10:00:00.000Z")
    assert events[6].at_ms == parse_time("2025-01-02T10:00:04.000Z")
    assert events[-1].data == {"reason": "USER"} and events[-1].at_ms == parse_time("2025-01-02T10:01:00.000Z")
    assert all(e.id.startswith("bland.post_call:bland-t1:") for e in events)
    assert [e.id for e in bland_events(POST_CALL)] == [e.id for e in events]  # stable ids: redelivery is a no-op
    assert BlandPostCall.model_validate(POST_CALL).from_ == "+15550001"


async def test_context_from_the_store(store: EventStore) -> None:
    await store.append(bland_events(POST_CALL))
    await store.append(bland_events(POST_CALL))
    assert len(await store.read("bland-t1")) == len(bland_events(POST_CALL))
    context = render((await build_context(store, "bland-t1")).native(), "openai")
    assert [m for m in context if m["role"] != "system"] == [
        {"role": "assistant", "content": "Hello, this is Ava."},
        {"role": "user", "content": "I need to reschedule."},
        {"role": "assistant", "content": "Sure, what day works?"},
        {"role": "user", "content": "Friday."},
    ]


@pytest.mark.parametrize(
    "body",
    [
        {"transcripts": []},
        {"call_id": "", "transcripts": []},
        {"call_id": "x", "transcripts": [{"text": "no speaker"}]},
        {"call_id": "x", "transcripts": "not a list"},
    ],
)
def test_invalid_payloads_are_rejected(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidEvent, match="Bland post-call webhook"):
        bland_events(body)
