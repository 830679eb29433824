"""calltape in a LiveKit Agents worker: one recorded call per room.

    pip install 'calltape[livekit]'
    python examples/livekit_worker.py dev      # LiveKit's CLI: needs LIVEKIT_URL, LIVEKIT_API_KEY/SECRET

``calltape.connect`` must outlive ``session.start`` returning: the call goes on after ``start``
returns, so the connect object is closed by the job's shutdown, after the session (never by an
``async with`` around ``start``). tests/adapters/test_livekit_worker.py runs this entrypoint offline.
"""

from __future__ import annotations

from typing import Any

from livekit.agents import Agent, AgentServer, AgentSession, JobContext, cli

import calltape
from calltape.adapters.livekit import start

server = AgentServer()


def new_session() -> AgentSession[Any]:
    """Your STT, LLM and TTS (LiveKit Inference model names here; plugins work the same)."""
    return AgentSession(stt="deepgram/nova-3", llm="openai/gpt-4.1-mini", tts="cartesia/sonic-2")


@server.rtc_session()
async def entrypoint(ctx: JobContext) -> None:
    ct = await calltape.connect()  # $CALLTAPE_DATABASE_URL, else the embedded SQLite file: no `async with`
    session = new_session()
    tap = await start(session, Agent(instructions="You book tables."), ct, room=ctx.room)  # call id: the room's name

    async def hang_up() -> None:  # the job's end: the session's end is recorded, then the store closes
        await session.aclose()
        await tap.drain()
        await ct.close()

    ctx.add_shutdown_callback(hang_up)
    session.say("Hello, you are through to the booking line.")


if __name__ == "__main__":
    cli.run_app(server)
