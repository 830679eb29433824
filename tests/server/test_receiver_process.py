"""``calltape serve`` as a real uvicorn process on loopback: auth, size limits, 4xx with nothing written,
and the Retell custom-LLM WebSocket. The store is read in-process (same URL), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from calltape.adapters.retell import sign_retell
from calltape.checks import check_events
from calltape.events import Event
from calltape.eventstore import EventStore, open_store
from calltape.projections import build_context, render

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from receiver_support import free_port, running_receiver  # noqa: E402
from retell_fake_llm import TOKEN  # noqa: E402

RETELL_KEY = "key_test_retell"
BLAND_SECRET = "bland-signing-secret"
VAPI_SECRET = "vapi-shared-secret"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('serve')}/serve.db"
    else:
        url = request.getfixturevalue("pg_url")
    port = free_port()
    code = (
        f"import sys; sys.path.insert(0, {str(HERE)!r});"
        "from retell_fake_llm import ENDPOINT;"
        "from calltape.server import run_server;"
        f"run_server({url!r}, '127.0.0.1', {port}, log_level='warning', retell_api_key={RETELL_KEY!r},"
        f" bland_secret={BLAND_SECRET!r}, vapi_secret={VAPI_SECRET!r}, max_body_bytes=65536,"
        " retell_llm=ENDPOINT)"
    )
    with running_receiver(code, port) as (base, proc):
        yield base, url
    assert proc.returncode in (0, -15), f"the receiver exited with {proc.returncode}"


@pytest.fixture
async def reader(server: tuple[str, str]) -> AsyncIterator[EventStore]:
    """The server's store, opened in this process."""
    store = await open_store(server[1])
    try:
        yield store
    finally:
        await store.close()


async def _events(store: EventStore, session: str) -> list[dict[str, Any]]:
    return [{"id": e.id, "type": e.type, "data": e.data} for e in await store.read(session)]


async def _until(
    store: EventStore, session: str, done: Callable[[list[Event]], bool], timeout: float = 5
) -> list[Event]:
    """The session's events once ``done`` holds (the server writes asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        events = await store.read(session)
        if done(events):
            return events
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; the log has {[e.type for e in events]}")
        await asyncio.sleep(0.05)


BLAND = {
    "call_id": "srv-bland-1",
    "started_at": "2025-01-02T10:00:00.000Z",
    "end_at": "2025-01-02T10:01:00.000Z",
    "completed": True,
    "call_ended_by": "USER",
    "transcripts": [
        {"id": 1, "created_at": "2025-01-02T10:00:01.000Z", "text": "Hello, this is Ava.", "user": "assistant"},
        {"id": 2, "created_at": "2025-01-02T10:00:04.000Z", "text": "Hi, I need to reschedule.", "user": "user"},
        {"id": 3, "created_at": "2025-01-02T10:00:05.000Z", "text": "Transferred to calendar", "user": "agent-action"},
        {"id": 4, "created_at": "2025-01-02T10:00:08.000Z", "text": "Sure, what day works?", "user": "assistant"},
    ],
}


async def test_bland_post_call_is_reconstructed_once(server: tuple[str, str], reader: EventStore) -> None:
    base, _ = server
    body = json.dumps(BLAND).encode()
    sig = hmac.new(BLAND_SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {"content-type": "application/json", "x-webhook-signature": sig}
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        first = await client.post("/bland", content=body, headers=headers)
        assert first.status_code == 200, first.text
        assert first.json()["appended"] > 0
        again = await client.post("/bland", content=body, headers=headers)
    assert again.json() == {"appended": 0}  # a redelivery writes nothing
    events = await _events(reader, "srv-bland-1")
    assert len(events) == first.json()["appended"]
    assert events[0]["type"] == "session.started"
    assert events[0]["data"]["metadata"]["reconstructed"] is True
    assert [e["data"]["text"] for e in events if e["type"] == "user.transcript"] == ["Hi, I need to reschedule."]
    assert "x.bland.agent_action" in [e["type"] for e in events]
    assert events[-1]["type"] == "session.ended"


@pytest.mark.parametrize(
    ("path", "headers", "body", "status"),
    [
        ("/bland", {"x-webhook-signature": "0" * 64}, json.dumps(BLAND | {"call_id": "bad-sig"}).encode(), 401),
        ("/vapi", {"x-vapi-secret": "wrong"}, b'{"message": {"type": "status-update", "call": {"id": "v-bad"}}}', 401),
        # malformed credentials (non-ASCII bytes) are refused like wrong ones: 401, never 500 (issue 17)
        (
            "/vapi",
            {"x-vapi-secret": b"\xff\xfe s\xc3\xa9"},
            b'{"message": {"type": "x", "call": {"id": "v-bad"}}}',
            401,
        ),
        ("/bland", {"x-webhook-signature": b"\xe9" * 64}, json.dumps(BLAND | {"call_id": "bad-sig"}).encode(), 401),
        (
            "/retell",
            {"x-retell-signature": b"v=1,d=\xe9"},
            b'{"event": "call_started", "call": {"call_id": "v-bad"}}',
            401,
        ),
        # a call id the store cannot keep: one 4xx (a platform retries a 500 forever)
        ("/bland", {"x-webhook-signature": "SIGN"}, json.dumps(BLAND | {"call_id": "bad\u0000sig"}).encode(), 422),
        ("/vapi", {"x-vapi-secret": VAPI_SECRET}, b"{not json", 400),
        ("/vapi", {"x-vapi-secret": VAPI_SECRET}, b'{"message": {"type": "status-update"}}', 422),
        ("/vapi", {"x-vapi-secret": VAPI_SECRET}, b"[1, 2]", 400),
        (
            "/vapi",
            {"x-vapi-secret": VAPI_SECRET},
            b'{"message": {"type": "x", "call": {"id": "big"}}, "p": "' + b"a" * 70000 + b'"}',
            413,
        ),
    ],
)
async def test_bad_requests_get_a_clear_4xx_and_write_nothing(
    server: tuple[str, str], reader: EventStore, path: str, headers: dict[str, str | bytes], body: bytes, status: int
) -> None:
    base, _ = server
    if headers.get("x-webhook-signature") == "SIGN":
        headers = {"x-webhook-signature": hmac.new(BLAND_SECRET.encode(), body, hashlib.sha256).hexdigest()}
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        for _ in range(2):  # a redelivery gets the same answer
            r = await client.post(path, content=body, headers={"content-type": "application/json", **headers})
            assert r.status_code == status, r.text
    assert isinstance(r.json()["error"], str) and r.json()["error"]
    for session in ("bad-sig", "v-bad", "big"):
        assert await _events(reader, session) == []


async def test_retell_webhooks_signed_and_verified(server: tuple[str, str], reader: EventStore) -> None:
    base, _ = server
    call = {
        "call_id": "srv-retell-w1",
        "agent_id": "ag_1",
        "call_type": "phone_call",
        "call_status": "ended",
        "start_timestamp": 1_735_810_000_000,
        "end_timestamp": 1_735_810_060_000,
        "disconnection_reason": "user_hangup",
        "transcript_object": [
            {"role": "agent", "content": "Hi there.", "words": [{"word": "Hi", "start": 0.5, "end": 0.7}]},
            {"role": "user", "content": "Cancel my order.", "words": [{"word": "Cancel", "start": 2.0, "end": 2.3}]},
        ],
    }
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        bad_body = json.dumps({"event": "call_started", "call": call | {"call_id": "srv-retell-w0"}}).encode()
        bad = await client.post("/retell", content=bad_body, headers={"x-retell-signature": sign_retell(bad_body, "x")})
        assert bad.status_code == 401
        for event in ("call_started", "call_ended"):
            body = json.dumps({"event": event, "call": call}, separators=(",", ":")).encode()
            r = await client.post(
                "/retell",
                content=body,
                headers={"content-type": "application/json", "x-retell-signature": sign_retell(body, RETELL_KEY)},
            )
            assert r.status_code == 200, r.text
    assert await _events(reader, "srv-retell-w0") == []
    events = await _events(reader, "srv-retell-w1")
    types = [e["type"] for e in events]
    assert types.count("session.started") == 1
    assert types[-1] == "session.ended" and events[-1]["data"] == {"reason": "user_hangup"}
    assert [e["data"]["text"] for e in events if e["type"] == "user.transcript"] == ["Cancel my order."]


async def test_oversized_body_without_content_length_is_refused(server: tuple[str, str]) -> None:
    base, _ = server

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"x" * 8192

    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        r = await client.post("/vapi", content=chunks(), headers={"x-vapi-secret": VAPI_SECRET})
    assert r.status_code == 413


# ---------------------------------------------------------------------------------------------
# Retell custom LLM over a real WebSocket.


async def _recv(ws: ClientConnection) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), timeout=5))
    return frame


async def _recv_until(ws: ClientConnection, stop: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while True:
        frame = await _recv(ws)
        if frame["response_type"] == "ping_pong":
            continue
        frames.append(frame)
        if stop(frame):
            return frames


def _ws_url(base: str, call_id: str, token: str = TOKEN) -> str:
    return f"{base.replace('http://', 'ws://')}/retell/llm/{token}/{call_id}"


async def test_retell_custom_llm_session_over_a_websocket(server: tuple[str, str], reader: EventStore) -> None:
    base, _ = server
    call_id = "srv-retell-llm-1"
    hi = {"role": "agent", "content": "Hi, this is Ava."}
    user = {"role": "user", "content": "Book me at 3pm."}
    async with connect(_ws_url(base, call_id)) as ws:
        config = await _recv(ws)
        assert config["response_type"] == "config" and config["config"]["auto_reconnect"] is True
        assert await _recv(ws) == {
            "response_type": "response",
            "response_id": 0,
            "content": "Hi, this is Ava.",
            "content_complete": True,
        }
        await ws.send(json.dumps({"interaction_type": "update_only", "transcript": [hi]}))
        await ws.send(json.dumps({"interaction_type": "ping_pong", "timestamp": 1}))
        await ws.send("{not json")  # skipped, the call goes on
        await ws.send(json.dumps({"interaction_type": "response_required", "response_id": 1, "transcript": [hi, user]}))
        # response_required → the reply is streamed, then the tool is invoked
        first = await _recv_until(ws, lambda f: f["response_type"] == "tool_call_invocation")
        assert first[0] == {
            "response_type": "response",
            "response_id": 1,
            "content": "Sure, booking 3pm. ",
            "content_complete": False,
        }
        assert first[-1]["name"] == "book" and json.loads(first[-1]["arguments"]) == {"slot": "15:00"}
        # Retell heard part of it, then re-asks (response 2) while the tool still runs
        spoken = {"role": "agent", "content": "Sure, booking"}
        await ws.send(json.dumps({"interaction_type": "update_only", "transcript": [hi, user, spoken]}))
        await ws.send(
            json.dumps({"interaction_type": "response_required", "response_id": 2, "transcript": [hi, user, spoken]})
        )
        second = await _recv_until(ws, lambda f: f.get("response_id") == 2 and f.get("content_complete") is True)
        frames = first + second
        assert [f["response_type"] for f in frames].count("tool_call_invocation") == 1
        assert [f["response_type"] for f in frames].count("tool_call_result") == 1
        assert not any(f.get("response_id") == 1 and f.get("content_complete") for f in frames)  # 1 was dropped
        assert "".join(f["content"] for f in second if f.get("response_id") == 2) == (
            "Sure, booking 3pm. Done: booked 15:00."
        )
        said = {"role": "agent", "content": "Sure, booking 3pm. Done: booked 15:00."}
        await ws.send(
            json.dumps(
                {"interaction_type": "update_only", "transcript": [hi, user, spoken, said], "turntaking": "user_turn"}
            )
        )
        # a reminder is a newer response too; reply 2 was heard in full, so nothing is interrupted
        await ws.send(
            json.dumps(
                {"interaction_type": "reminder_required", "response_id": 3, "transcript": [hi, user, spoken, said]}
            )
        )
        await _recv_until(ws, lambda f: f.get("response_id") == 3 and f.get("content_complete") is True)

    events = await _until(
        reader, call_id, lambda ev: any(e.type == "agent.reply.done" and e.data["reply"] == "retell-3" for e in ev)
    )
    types = [e.type for e in events]
    assert types.count("tool.call") == 1 and types.count("tool.started") == 1 and types.count("tool.result") == 1
    interruptions = [e.data for e in events if e.type == "interruption"]
    assert interruptions == [{"reply": "retell-1", "cause": "user_speech", "heard": "Sure, booking"}]
    context = render((await build_context(reader, call_id)).native(), "openai")
    assert context == [
        {"role": "system", "content": "Book appointments."},
        {"role": "assistant", "content": "Hi, this is Ava."},
        {"role": "user", "content": "Book me at 3pm."},
        {
            "role": "assistant",
            "content": "Sure, booking",
            "tool_calls": [
                {
                    "id": "retell-1:book:1",
                    "type": "function",
                    "function": {"name": "book", "arguments": '{"slot":"15:00"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "retell-1:book:1", "content": '{"booked":"15:00"}'},
        # response 2 asked for the call again: its reply ends there, the words after the result are a new one
        {"role": "assistant", "content": "Sure, booking 3pm."},
        {"role": "assistant", "content": "Done: booked 15:00."},
        {"role": "assistant", "content": "Are you still there?"},
    ]

    # Retell reconnects to the same call: the session is attached, nothing is said twice, ids stay unique
    async with connect(_ws_url(base, call_id)) as ws:
        assert (await _recv(ws))["response_type"] == "config"
        assert (await _recv(ws))["content"] == ""
    events = await _until(
        reader, call_id, lambda ev: any(e.type == "agent.reply.done" and e.data["reply"] == "retell-c2-0" for e in ev)
    )
    assert [e.data for e in events if e.type == "x.retell.connection"] == [{"number": 1}, {"number": 2}]
    assert [e.type for e in events].count("session.started") == 1
    replies = [e.data["reply"] for e in events if e.type == "agent.reply.started"]
    assert len(replies) == len(set(replies)) and replies[-1] == "retell-c2-0"


async def test_retell_custom_llm_refuses_an_unknown_path_token(server: tuple[str, str], reader: EventStore) -> None:
    base, _ = server
    with pytest.raises(InvalidStatus) as refused:
        async with connect(_ws_url(base, "srv-retell-llm-x", token="guess")):
            pass
    assert refused.value.response.status_code == 403
    async with connect(_ws_url(base, "srv-retell-llm-y")) as ws:  # the right token connects
        assert (await _recv(ws))["response_type"] == "config"
    assert await _events(reader, "srv-retell-llm-x") == []


# A heard-first effect in a tool the receiver runs: Retell's transcript says when the announcement played.


HEARD_CALL, CUT_CALL = "srv-retell-effect-heard", "srv-retell-effect-cut"


async def _ask_charge(ws: ClientConnection, spoken: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Asks for a charge, then Retell shows the first words of the announcement (``spoken``) said; returns
    the user's utterance, the whole announcement and what was said of it, as Retell's transcript has them."""
    assert (await _recv(ws))["response_type"] == "config"
    await _recv(ws)  # the begin message
    user = {"role": "user", "content": "Please charge my order."}
    await ws.send(json.dumps({"interaction_type": "response_required", "response_id": 1, "transcript": [user]}))
    frames = await _recv_until(ws, lambda f: f["response_type"] == "tool_call_invocation")
    assert frames[-1]["name"] == "charge_card"
    partly = {"role": "agent", "content": spoken}
    await ws.send(json.dumps({"interaction_type": "update_only", "transcript": [user, partly]}))
    return user, {"role": "agent", "content": frames[0]["content"].strip()}, partly


async def test_retell_heard_first_effect_runs_once_the_announcement_played(
    server: tuple[str, str], reader: EventStore
) -> None:
    async with connect(_ws_url(server[0], HEARD_CALL)) as ws:
        user, said, _ = await _ask_charge(ws, "Charging 40 dollars")
        with pytest.raises(TimeoutError):  # half the announcement: the action waits
            await asyncio.wait_for(ws.recv(), timeout=0.5)
        assert not [e for e in await reader.read(HEARD_CALL) if e.type == "tool.effect"]
        await ws.send(json.dumps({"interaction_type": "update_only", "transcript": [user, said]}))
        rest = await _recv_until(ws, lambda f: f.get("content_complete") is True)
    assert json.loads(rest[0]["content"]) == {"charged": 40}
    assert "".join(f.get("content", "") for f in rest[1:]) == "Charged."
    events = await _until(reader, HEARD_CALL, lambda ev: any(e.data.get("phase") == "done" for e in ev))
    ended = next(e.seq for e in events if e.type == "agent.speech.ended" and e.data["reply"] == "retell-1")
    started = next(e for e in events if e.type == "tool.effect" and e.data["phase"] == "started")
    assert started.seq > ended and started.data["heard"] is True
    assert check_events(events) == []


async def test_retell_heard_first_effect_is_not_run_after_a_barge_in(
    server: tuple[str, str], reader: EventStore
) -> None:
    async with connect(_ws_url(server[0], CUT_CALL)) as ws:
        user, _, partly = await _ask_charge(ws, "Charging 40")
        stop = {"role": "user", "content": "No, stop."}
        asked = time.monotonic()
        await ws.send(
            json.dumps({"interaction_type": "response_required", "response_id": 2, "transcript": [user, partly, stop]})
        )
        result = (await _recv_until(ws, lambda f: f["response_type"] == "tool_call_result"))[-1]
        assert time.monotonic() - asked < 2  # promptly, not at the tool's timeout
    assert json.loads(result["content"]) == {"reason": "interrupted", "status": "cancelled"}
    events = await _until(reader, CUT_CALL, lambda ev: any(e.type == "tool.cancelled" for e in ev))
    assert [e.data["outcome"] for e in events if e.type == "tool.cancelled"] == ["not_run"]
    assert not [e for e in events if e.type == "tool.effect"]
    assert [v.rule for v in check_events(events)] == []
