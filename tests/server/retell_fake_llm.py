"""A scripted LLM for the Retell custom-LLM route (no network): imported by the receiver subprocess."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from calltape.adapters.retell import RetellTurn
from calltape.runtime import ToolSpec
from calltape.server.retell_llm import RetellLLMEndpoint

TOKEN = "llm-path-secret"
BOOK_SECONDS = 0.6


async def book(slot: str) -> dict[str, Any]:
    await asyncio.sleep(BOOK_SECONDS)  # long enough for Retell to re-ask while it runs
    return {"booked": slot}


async def respond(turn: RetellTurn) -> AsyncIterator[str]:
    """Answers from the calltape context: a mention of booking books 3pm (asking the tool on every try)."""
    if turn.interaction_type == "reminder_required":
        yield "Are you still there?"
        return
    context: list[dict[str, Any]] = turn.context("openai")
    last_user = next((str(m["content"]) for m in reversed(context) if m["role"] == "user"), "")
    if "book" not in last_user.lower():
        yield "Anything "
        yield "else?"
        return
    yield "Sure, booking 3pm. "
    outcome = await turn.run_tool("book", {"slot": "15:00"}, lambda: book("15:00"))
    yield f"Done: booked {outcome.output['booked']}."


ENDPOINT = RetellLLMEndpoint(
    respond,
    agent="scheduler",
    instructions="Book appointments.",
    begin_message="Hi, this is Ava.",
    tools={"book": ToolSpec(timeout=5.0)},
    token=TOKEN,
)
