"""The receiver in-process (httpx over ASGI): what it reads from the log to decide, never event ids."""

from __future__ import annotations

import json
from typing import Any

import httpx

from calltape.events import make_event
from calltape.eventstore import EventStore
from calltape.server.app import create_app
from calltape.server.retell_llm import CONNECTION_EVENT

BLAND = {
    "call_id": "rec-bland-1",
    "started_at": "2025-01-02T10:00:00.000Z",
    "end_at": "2025-01-02T10:01:00.000Z",
    "completed": True,
    "transcripts": [
        {"id": 1, "created_at": "2025-01-02T10:00:01.000Z", "text": "Hello.", "user": "assistant"},
        {"id": 2, "created_at": "2025-01-02T10:00:04.000Z", "text": "Hi.", "user": "user"},
    ],
}


async def _post(store: EventStore, path: str, payload: Any) -> httpx.Response:
    app = create_app(store, allow_unsigned=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.post(path, content=json.dumps(payload).encode())


async def test_a_bland_session_is_reconstructed_by_its_record_not_its_ids(store: EventStore) -> None:
    r = await _post(store, "/bland", BLAND)
    assert r.status_code == 200 and r.json()["appended"] > 0, r.text
    again = await _post(store, "/bland", BLAND)  # reconstructed (its record says so): redelivery adds nothing
    assert again.json() == {"appended": 0}

    # a live session (not marked reconstructed) whose ids look like a report's: the report only closes it
    live = make_event("rec-bland-2", "session.started", {"agent": "a"}, id="bland.post_call:rec-bland-2:1")
    await store.append([live])
    r = await _post(store, "/bland", BLAND | {"call_id": "rec-bland-2"})
    assert r.status_code == 200, r.text
    assert [e.type for e in await store.read("rec-bland-2")] == ["session.started", "session.ended"]


async def test_retell_call_ended_closes_a_session_a_custom_llm_recorded(store: EventStore) -> None:
    call = {
        "call_id": "rec-retell-1",
        "agent_id": "ag",
        "start_timestamp": 1_735_810_000_000,
        "end_timestamp": 1_735_810_060_000,
        "disconnection_reason": "user_hangup",
        "transcript_object": [{"role": "user", "content": "Cancel my order."}],
    }
    session = "rec-retell-1"
    await store.append(
        [
            make_event(session, "session.started", {"agent": "a", "framework": "retell"}),
            make_event(session, CONNECTION_EVENT, {"number": 1}),
            # no reply yet: the old id-based check took this for a call never seen live
            make_event(session, "user.transcript", {"text": "Cancel my order.", "final": True}),
        ]
    )
    for _ in range(2):  # a redelivery too
        r = await _post(store, "/retell", {"event": "call_ended", "call": call})
        assert r.status_code == 200, r.text
    types = [e.type for e in await store.read(session)]
    assert types == ["session.started", CONNECTION_EVENT, "user.transcript", "session.ended"]


async def test_a_call_id_the_store_cannot_keep_is_a_4xx_every_time(store: EventStore) -> None:
    before = len(await store.sessions())
    for _ in range(2):
        r = await _post(store, "/bland", BLAND | {"call_id": "bad\x00id"})
        assert r.status_code == 422, r.text
        r = await _post(store, "/vapi", {"message": {"type": "status-update", "call": {"id": "v\x00"}}})
        assert r.status_code == 422, r.text
        r = await _post(store, "/retell", {"event": "call_started", "call": {"call_id": "r" * 600}})
        assert r.status_code == 422, r.text
    assert len(await store.sessions()) == before
