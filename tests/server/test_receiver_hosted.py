"""``POST /elevenlabs`` and ``POST /ultravox`` on the receiver: signed with each platform's scheme, forged
or stale requests refused with nothing written, replays adding nothing, and the same events as
``calltape import --format`` (so either may come first). The receiver runs in-process over ASGI; the
Ultravox REST API that serves a call's messages is a fake on loopback (real HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from calltape.adapters.postcall import postcall_events
from calltape.adapters.ultravox import api_messages
from calltape.adapters.webhook_auth import sign_elevenlabs, sign_ultravox
from calltape.eventstore import EventStore
from calltape.server.app import create_app

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
from receiver_support import free_port  # noqa: E402

from tests.adapters import postcall_payloads as p  # noqa: E402

EL_SECRET = "wsec_elevenlabs_test_secret"
UV_SECRET = "ultravox-webhook-secret"
UV_KEY = "uv-api-key"


@contextlib.asynccontextmanager
async def receiver(store: EventStore, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(store, metrics=False, **options)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://receiver") as client:
        yield client


async def stored(store: EventStore, session: str) -> list[tuple[str, str]]:
    return [(e.id, e.type) for e in await store.read(session)]


# ---------------------------------------------------------------------------------------------
# ElevenLabs


def _el_post(client: httpx.AsyncClient, body: bytes, signature: str | None) -> Any:
    headers = {"ElevenLabs-Signature": signature} if signature is not None else {}
    return client.post("/elevenlabs", content=body, headers=headers)


async def test_elevenlabs_forged_or_stale_is_refused_and_writes_nothing(store: EventStore, session_id: str) -> None:
    conv = f"{session_id}-el"
    body = json.dumps(p.elevenlabs_webhook(conv)).encode()
    now = int(time.time())
    async with receiver(store, elevenlabs_secret=EL_SECRET) as client:
        answers = [
            await _el_post(client, body, None),
            await _el_post(client, body, sign_elevenlabs(body, "not-the-secret")),
            await _el_post(client, body + b" ", sign_elevenlabs(body, EL_SECRET)),  # tampered after signing
            await _el_post(client, body, sign_elevenlabs(body, EL_SECRET, now - 31 * 60)),  # stale
            await _el_post(client, body, sign_elevenlabs(body, EL_SECRET, now + 3600)),  # from the future
            await _el_post(client, body, "t=abc,v0=00"),
        ]
    assert [r.status_code for r in answers] == [401] * 6, [r.text for r in answers]
    assert all("\n" not in r.json()["error"] for r in answers)
    assert await store.session_info(conv) is None
    async with receiver(store) as client:  # no secret configured: refused, not accepted unsigned
        unconfigured = await _el_post(client, body, sign_elevenlabs(body, EL_SECRET))
    assert unconfigured.status_code == 403 and await store.session_info(conv) is None


async def test_elevenlabs_post_call_recorded_once_like_the_import(store: EventStore, session_id: str) -> None:
    conv = f"{session_id}-el"
    payload = p.elevenlabs_webhook(conv)
    body = json.dumps(payload).encode()
    signature = sign_elevenlabs(body, EL_SECRET)
    async with receiver(store, elevenlabs_secret=EL_SECRET) as client:
        first = await _el_post(client, body, signature)
        replayed = await _el_post(client, body, signature)  # the same delivery again
        resigned = await _el_post(client, body, sign_elevenlabs(body, EL_SECRET))  # a retry, signed anew
        audio = json.dumps({"type": "post_call_audio", "data": {"conversation_id": conv}}).encode()
        other = await _el_post(client, audio, sign_elevenlabs(audio, EL_SECRET))
    imported = postcall_events("elevenlabs", payload)[0]
    assert first.status_code == 200 and first.json() == {"appended": len(imported)}, first.text
    assert [r.json() for r in (replayed, resigned, other)] == [{"appended": 0}] * 3
    assert await stored(store, conv) == [(e.id, e.type) for e in imported]
    assert ("interruption" in {t for _, t in await stored(store, conv)}) is True
    # importing the saved payload after the webhook adds nothing
    before = (await store.session_info(conv)).last_seq  # type: ignore[union-attr]
    await store.append(imported)
    assert (await store.session_info(conv)).last_seq == before  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------
# Ultravox


def _uv_headers(body: bytes, secret: str = UV_SECRET, timestamp: str | None = None) -> dict[str, str]:
    ts, signature = sign_ultravox(body, secret, timestamp)
    return {"X-Ultravox-Webhook-Timestamp": ts, "X-Ultravox-Webhook-Signature": signature}


def _uv_body(event: str, call: dict[str, Any]) -> bytes:
    return json.dumps({"event": event, "call": call}).encode()


@contextlib.asynccontextmanager
async def fake_ultravox_api(pages: list[dict[str, Any]], fail: list[bool]) -> AsyncIterator[str]:
    """Ultravox's list-messages endpoint on loopback: the given pages chained by ``next`` links;
    ``fail[0]`` True answers 503 (an outage)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}/api"

    async def messages(request: Request) -> JSONResponse:
        if request.headers.get("x-api-key") != UV_KEY:
            return JSONResponse({"detail": "unauthorized"}, status_code=401)
        if fail[0]:
            return JSONResponse({"detail": "unavailable"}, status_code=503)
        n = int(request.query_params.get("cursor", "0"))
        page = dict(pages[n])
        call = request.path_params["call"]
        page["next"] = f"{base}/calls/{call}/messages?cursor={n + 1}" if n + 1 < len(pages) else None
        return JSONResponse(page)

    app = Starlette(routes=[Route("/api/calls/{call}/messages", messages)])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(600):
            if server.started:
                break
            await asyncio.sleep(0.05)
        assert server.started, "the fake Ultravox API did not start"
        yield base
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)


async def test_ultravox_call_webhooks_started_joined_ended(store: EventStore, session_id: str) -> None:
    call_id = f"{session_id}-uv"
    call = p.ultravox_call(call_id, end_reason="hangup")
    results = p.ultravox_messages()["results"]
    pages = [{"results": results[:4], "total": len(results)}, {"results": results[4:], "total": len(results)}]
    fail = [True]
    async with fake_ultravox_api(pages, fail) as base:
        source = api_messages(UV_KEY, base_url=base)
        async with receiver(store, ultravox_secret=UV_SECRET, ultravox_messages=source) as client:

            async def post(event: str, body_call: dict[str, Any]) -> httpx.Response:
                body = _uv_body(event, body_call)
                return await client.post("/ultravox", content=body, headers=_uv_headers(body))

            live = {**call, "ended": None, "endReason": None}
            started = await post("call.started", {**live, "joined": None})
            joined = await post("call.joined", live)
            outage = await post("call.ended", call)  # the messages cannot be fetched: nothing written
            assert [e for _, e in await stored(store, call_id)] == ["session.started", "x.ultravox.joined"]
            fail[0] = False
            ended = await post("call.ended", call)  # Ultravox's retry
            again = [await post(e, c) for e, c in (("call.started", live), ("call.joined", live), ("call.ended", call))]
            billed = await post("call.billed", call)
    assert [r.status_code for r in (started, joined, outage, ended)] == [200, 200, 503, 200], outage.text
    assert "retry" in outage.json()["error"]
    assert [r.json() for r in [*again, billed]] == [{"appended": 0}] * 4
    log = await stored(store, call_id)
    imported = postcall_events("ultravox", {"call": call, "messages": {"results": results}})[0]
    # the same events as the import (the join is the webhook's own), so either may come first
    assert [x for x in log if x[1] != "x.ultravox.joined"] == [(e.id, e.type) for e in imported]
    assert log[-1][1] == "session.ended"
    await store.append(imported)
    assert await stored(store, call_id) == log


async def test_ultravox_forged_or_stale_is_refused(store: EventStore, session_id: str) -> None:
    call_id = f"{session_id}-uv"
    body = _uv_body("call.started", p.ultravox_call(call_id))
    stale = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 600))
    good = _uv_headers(body)
    async with receiver(store, ultravox_secret=UV_SECRET) as client:
        answers = [
            await client.post("/ultravox", content=body),
            await client.post("/ultravox", content=body, headers=_uv_headers(body, "wrong-secret")),
            await client.post("/ultravox", content=body + b"\n", headers=good),
            await client.post("/ultravox", content=body, headers=_uv_headers(body, timestamp=stale)),
            await client.post("/ultravox", content=body, headers={**good, "X-Ultravox-Webhook-Timestamp": "yesterday"}),
        ]
        rotated = {**good, "X-Ultravox-Webhook-Signature": "00" * 32 + "," + good["X-Ultravox-Webhook-Signature"]}
        accepted = await client.post("/ultravox", content=body, headers=rotated)  # one of several keys matches
    assert [r.status_code for r in answers] == [401] * 5, [r.text for r in answers]
    assert accepted.status_code == 200 and accepted.json()["appended"] == 1, accepted.text


@pytest.mark.parametrize("reason", ["hangup", "connection_error"])
async def test_ultravox_end_without_a_message_source_closes_the_call(
    store: EventStore, session_id: str, reason: str
) -> None:
    call_id = f"{session_id}-uv-{reason}"
    call = p.ultravox_call(call_id, end_reason=reason)
    body = _uv_body("call.ended", call)
    async with receiver(store, allow_unsigned=True) as client:
        r = await client.post("/ultravox", content=body)
    assert r.status_code == 200, r.text
    kinds = [t for _, t in await stored(store, call_id)]
    assert kinds == ["session.started", "session.dropped" if reason == "connection_error" else "session.ended"]
