"""calltape on a LiveKit Agents session, offline: a scripted LLM, no room, no keys.

    pip install 'calltape[livekit]'
    python examples/livekit_quickstart.py

The caller asks for a booking, barges in while the booking tool runs and asks about parking. The
booking result lands after the barge-in; calltape's context keeps it in the turn that asked for it,
and a second agent is then seeded with that context, tool items included.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from typing import Any

from livekit.agents import Agent, AgentSession, RunContext, function_tool

import calltape
from calltape.adapters.livekit import guarded, rehydrate, start
from calltape.testing.livekit import Call, Say, ScriptedLLM  # offline stand-in for the LLM service


class Concierge(Agent):
    def __init__(self) -> None:
        super().__init__(instructions="You book tables.")

    @function_tool
    @guarded  # runs under calltape: durable start, 10 s timeout, never twice for one call id
    async def book(self, ctx: RunContext[Any], when: str) -> str:
        """Books a table."""

        async def reserve() -> str:  # the restaurant's system: a real-world action
            await asyncio.sleep(0.5)
            return f"table booked for {when}"

        # an effect named by the booking: run once, whatever call id the LLM asks under again
        return str(await calltape.effect("book_table", when, reserve))


async def main() -> None:
    session: AgentSession[Any] = AgentSession(
        llm=ScriptedLLM([[Say("One moment."), Call("book", "call_1", {"when": "7pm"})], [Say("Parking is free.")]])
    )
    async with calltape.connect(f"sqlite:///{tempfile.mkdtemp()}/calltape.db") as ct:
        # attach calltape: this line replaces `await session.start(agent)` (in a worker: room=ctx.room)
        tap = await start(session, Concierge(), ct, call_id="demo-call")

        session.generate_reply(user_input="Book a table at 7pm.")
        await asyncio.sleep(0.1)
        session.interrupt()  # the caller barges in while the booking runs
        await session.generate_reply(user_input="Is there parking?")
        await asyncio.sleep(0.6)  # the booking result lands after the barge-in

        print("calltape context (OpenAI format):")
        print(json.dumps(tap.call.context("openai"), indent=2))

        # a second agent without the `book` tool still sees the booking
        billing = await rehydrate(Agent(instructions="You handle billing."), tap.call.context())
        print("\nseeded agent's items:", [item.type for item in billing.chat_ctx.items])

        await session.aclose()
        await tap.drain()


if __name__ == "__main__":
    asyncio.run(main())
