"""Offline: a Retell custom LLM behind calltape, over a real WebSocket on 127.0.0.1.

Serves ``retell_llm_app`` with uvicorn on a free loopback port, then plays Retell's part with the
``websockets`` client: the user asks to book, Retell re-asks the response while the booking runs (a
newer ``response_id`` interrupts the older one), and the booking still happens once. The LLM is a script;
no network beyond loopback, no keys. Needs the ``serve`` extra (starlette, uvicorn) and ``websockets``.
"""

import asyncio
import json
import socket
import tempfile
from collections.abc import AsyncIterator

import uvicorn
from websockets.asyncio.client import connect

import calltape
from calltape.adapters.retell import RetellTurn
from calltape.eventstore import open_store
from calltape.projections import build_context, render
from calltape.server.retell_llm import RetellLLMEndpoint, retell_llm_app

RUNS = 0


async def book(slot: str) -> dict[str, str]:
    global RUNS
    RUNS += 1
    await asyncio.sleep(0.3)
    return {"booked": slot}


async def respond(turn: RetellTurn) -> AsyncIterator[str]:
    """Your LLM (scripted here). ``turn.context()`` is what the user heard, with every tool result."""
    yield "Sure, booking 3pm. "
    # the booking is a real-world action: an effect named by its slot, run once whatever call id asks
    outcome = await turn.run_tool(
        "book", {"slot": "15:00"}, lambda: calltape.effect("book", "15:00", lambda: book("15:00"))
    )
    yield f"Done: booked {outcome.output['booked']}."


async def main() -> None:
    store = await open_store(f"sqlite:///{tempfile.mkdtemp()}/retell.db")
    endpoint = RetellLLMEndpoint(respond, agent="scheduler", begin_message="Hi, this is Ava.")  # calltape 1/2
    app = retell_llm_app(store, endpoint)  # calltape 2/2: Retell connects to ws://host/retell/llm/{call_id}
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to await
        await asyncio.sleep(0.01)

    hi, user = {"role": "agent", "content": "Hi, this is Ava."}, {"role": "user", "content": "Book me at 3pm."}
    heard = {"role": "agent", "content": "Sure, booking"}
    async with connect(f"ws://127.0.0.1:{port}/retell/llm/demo-call") as retell:
        for _ in range(2):  # config, begin message
            print("<-", await retell.recv())
        await retell.send(
            json.dumps({"interaction_type": "response_required", "response_id": 1, "transcript": [hi, user]})
        )
        while json.loads(frame := await retell.recv())["response_type"] != "tool_call_invocation":
            print("<-", frame)
        print("<-", frame)
        # the user made a noise: Retell re-asks while the booking runs
        await retell.send(
            json.dumps({"interaction_type": "response_required", "response_id": 2, "transcript": [hi, user, heard]})
        )
        while not (reply := json.loads(frame := await retell.recv())).get("content_complete"):
            print("<-", frame)
        print("<-", frame)
        assert reply["response_id"] == 2
    server.should_exit = True
    await serving

    assert RUNS == 1, "the booking ran once"
    print("bookings made:", RUNS)
    print(json.dumps(render((await build_context(store, "demo-call")).native(), "openai"), indent=2))
    await store.close()


if __name__ == "__main__":
    asyncio.run(main())
