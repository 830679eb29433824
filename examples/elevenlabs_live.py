"""ElevenLabs Agents, live: record a conversation as it happens (offline: the ElevenLabs server is a
scripted stand-in on 127.0.0.1; the SDK's AsyncConversation and client tools are the real ones).

The user asks for a booking, the agent calls a client tool, then starts reading the code and is cut
off; ElevenLabs corrects the reply to what was actually said. calltape's context has the tool's
output after its call and only the heard part of the cut reply.

    python examples/elevenlabs_live.py
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from elevenlabs.client import ElevenLabs
from elevenlabs.conversational_ai.conversation import AsyncConversation, ClientTools
from websockets.asyncio.server import ServerConnection, serve

import calltape
from calltape.adapters.elevenlabs_live import tap_elevenlabs

SAID = "Booked for two, your code is BK-42. Anything else?"


async def elevenlabs_stand_in(ws: ServerConnection) -> None:
    """What ElevenLabs' conversation websocket sends, for one short call."""
    await ws.recv()  # conversation_initiation_client_data

    async def send(kind: str, key: str, **event: Any) -> None:
        await ws.send(json.dumps({"type": kind, key: event}))

    await send(
        "conversation_initiation_metadata", "conversation_initiation_metadata_event", conversation_id="conv_demo"
    )
    await send("user_transcript", "user_transcription_event", user_transcript="A table for two at eight, please.")
    await send("agent_response", "agent_response_event", agent_response="Let me check.")
    call = {"tool_name": "book", "tool_call_id": "tool_1", "parameters": {"people": 2}}
    await ws.send(json.dumps({"type": "client_tool_call", "client_tool_call": call}))
    print("tool result sent to ElevenLabs:", json.loads(await ws.recv())["result"])
    await send("agent_response", "agent_response_event", agent_response=SAID)
    await send("interruption", "interruption_event", event_id=9)  # the user talks over the agent
    correction = {"original_agent_response": SAID, "corrected_agent_response": "Booked for two, your code"}
    await send("agent_response_correction", "agent_response_correction_event", **correction)
    await send("user_transcript", "user_transcription_event", user_transcript="Sorry, text it to me.")
    await ws.close()


async def book(params: dict[str, Any]) -> dict[str, Any]:
    return {"code": "BK-42", "people": params["people"]}


async def main(store_url: str) -> None:
    async with serve(elevenlabs_stand_in, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        tools = ClientTools()
        tools.register("book", book, is_async=True)
        conversation = AsyncConversation(
            ElevenLabs(api_key="demo", base_url=f"http://127.0.0.1:{port}"),
            "agent_demo",
            requires_auth=False,
            client_tools=tools,
        )
        async with calltape.connect(store_url) as ct:
            tap = tap_elevenlabs(ct, conversation)  # before start_session()
            await conversation.start_session()
            await conversation.wait_for_session_end()
            await tap.close()  # everything the SDK reported is in the log
            fold = await ct.context("conv_demo")
            for message in calltape.render(fold.native(), "openai"):
                print(message)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(f"sqlite:///{Path(tmp) / 'calls.db'}"))
