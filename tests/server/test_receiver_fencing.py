"""The receiver is fenced like any writer (issue 16): it writes as the call's first writer (epoch 1), so
once ``resume`` hands the call to another agent a late webhook gets 409 and the resumed call stays
clean; ``allow_after_resume`` is the explicit opt-out. Real HTTP: uvicorn on loopback, httpx over TCP."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from receiver_support import free_port

from calltape.eventstore import EventStore
from calltape.runtime import resume
from calltape.server.app import create_app

LATE = 11


@contextlib.asynccontextmanager
async def serving(store: EventStore, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    port = free_port()
    app = create_app(store, allow_unsigned=True, **options)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(600):
            if server.started:
                break
            await asyncio.sleep(0.05)
        assert server.started, "uvicorn did not start"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=20) as client:
            yield client
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)


def _vapi(call: str, k: int, **message: Any) -> bytes:
    body = {"type": "transcript", "role": "user", "transcriptType": "final", "transcript": f"line {k}"}
    body |= {"timestamp": 1_735_810_000_000 + k, "call": {"id": call}, **message}
    return json.dumps({"message": body}).encode()


async def test_late_webhooks_after_a_resume_are_refused(store: EventStore, session_id: str) -> None:
    call = f"{session_id}-vapi"
    async with serving(store) as client:
        for k in range(3):
            r = await client.post("/vapi", content=_vapi(call, k))
            assert r.status_code == 200 and r.json()["appended"] > 0, r.text
        plan = await resume(store, call, "rescue")
        assert plan.epoch == 2
        before = (await store.session_info(call)).last_seq  # type: ignore[union-attr]
        answers = [await client.post("/vapi", content=_vapi(call, 100 + k)) for k in range(LATE)]
    assert [r.status_code for r in answers] == [409] * LATE, [r.text for r in answers]
    assert "resumed" in answers[0].json()["error"] and "\n" not in answers[0].json()["error"]
    assert (await store.session_info(call)).last_seq == before  # type: ignore[union-attr]
    assert all(e.epoch in (1, 2) for e in await store.read(call))  # what it wrote carried epoch 1

    async with serving(store, allow_after_resume=True) as client:
        r = await client.post("/vapi", content=_vapi(call, 200))
    assert r.status_code == 200 and r.json()["appended"] == 1, r.text
    assert (await store.read(call))[-1].epoch is None
