"""Offline: a Vapi tool server (your server URL) that records the call and runs tools exactly once.

Runs a real uvicorn server on 127.0.0.1 (a free port), then plays Vapi's part with the messages it POSTs
to a server URL during a call — including a retried ``tool-calls`` request, which must not book twice.
No network beyond loopback, no keys. Needs the ``serve`` extra (starlette, uvicorn) and httpx.
"""

import asyncio
import json
import socket
import tempfile

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import calltape
from calltape.adapters.vapi import VapiIngest, run_tool_calls
from calltape.eventstore import open_store
from calltape.eventstore.recorder import Recorder
from calltape.projections import build_context, render
from calltape.runtime import CallSession

BOOKINGS: list[dict[str, object]] = []


async def book_table(people: int, time: str) -> dict[str, object]:
    """Your tool: a side effect that must happen once, whatever call id Vapi asks under (an effect,
    named by the booking itself: run once per time and party, its recorded output answers again)."""

    async def book() -> dict[str, object]:
        BOOKINGS.append({"people": people, "time": time})
        return {"confirmed": True, "people": people, "time": time}

    return dict(await calltape.effect("book_table", f"{time}/{people}", book))


def make_app(store, recorder):  # type: ignore[no-untyped-def]
    ingest = VapiIngest()

    async def vapi(request: Request) -> JSONResponse:
        body = await request.json()
        await store.append(ingest.events(body))  # calltape 1/3: record the message
        if body["message"]["type"] == "tool-calls":
            call = await CallSession.attach(recorder, ingest.session_of(body))  # calltape 2/3
            return JSONResponse(await run_tool_calls(call, body, {"book_table": book_table}))  # calltape 3/3
        return JSONResponse({})

    return Starlette(routes=[Route("/vapi", vapi, methods=["POST"])])


def message(kind: str, **fields: object) -> dict[str, object]:
    return {"message": {"type": kind, "call": {"id": "vapi-demo-call"}, **fields}}


CALL = [
    message("status-update", status="in-progress"),
    message("speech-update", role="user", status="started"),
    message("transcript", role="user", transcriptType="final", transcript="A table for two at eight, please."),
    message("speech-update", role="user", status="stopped"),
    message("model-output", output="Let me book that. "),
    message(
        "tool-calls",
        toolCallList=[
            {
                "id": "call_book_1",
                "type": "function",
                "function": {"name": "book_table", "arguments": '{"people": 2, "time": "20:00"}'},
            }
        ],
    ),
    message("speech-update", role="assistant", status="started"),
    message("transcript", role="assistant", transcriptType="final", transcript="Let me book that."),
    message("speech-update", role="assistant", status="stopped"),
    message("status-update", status="ended", endedReason="customer-ended-call"),
]


async def main() -> None:
    store = await open_store(f"sqlite:///{tempfile.mkdtemp()}/vapi.db")
    recorder = await Recorder(store).start()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(make_app(store, recorder), log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to await
        await asyncio.sleep(0.01)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as vapi:
        for body in CALL:
            reply = (await vapi.post("/vapi", json=body)).json()
            if body["message"]["type"] == "tool-calls":  # type: ignore[index]
                print("tool-calls reply:", json.dumps(reply))
                retried = (await vapi.post("/vapi", json=body)).json()  # Vapi retries a slow webhook
                assert retried == reply, "a retry returns the stored result"
    server.should_exit = True
    await serving
    await recorder.close()
    assert len(BOOKINGS) == 1, "the tool ran once"
    print("bookings made:", len(BOOKINGS))
    context = render((await build_context(store, "vapi-demo-call")).native(), "openai")
    print(json.dumps(context, indent=2))
    await store.close()


if __name__ == "__main__":
    asyncio.run(main())
