"""A scripted LLM for the Retell custom-LLM route (no network): imported by the receiver subprocess."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import calltape
from calltape.adapters.retell import RetellTurn
from calltape.runtime import ToolSpec
from calltape.server.retell_llm import RetellLLMEndpoint

TOKEN = "llm-path-secret"
BOOK_SECONDS = 0.6


async def book(slot: str) -> dict[str, Any]:
    await asyncio.sleep(BOOK_SECONDS)  # long enough for Retell to re-ask while it runs
    return {"booked": slot}


async def charge_card() -> dict[str, Any]:
    async def charge() -> dict[str, Any]:
        return {"charged": 40}

    return dict(await calltape.effect("charge", "order-7", charge, heard=True))


async def respond(turn: RetellTurn) -> AsyncIterator[str]:
    """Answers from the calltape context: a mention of booking books 3pm (asking the tool on every try)."""
    if turn.interaction_type == "reminder_required":
        yield "Are you still there?"
        return
    context: list[dict[str, Any]] = turn.context("openai")
    last_user = next((str(m["content"]) for m in reversed(context) if m["role"] == "user"), "")
    if "charge" in last_user.lower():  # a heard-first effect: runs once the announcement played out
        yield "Charging 40 dollars for order seven now. "
        outcome = await turn.run_tool("charge_card", {"order": "7"}, charge_card)
        yield "Charged." if outcome.status == "completed" else "I did not charge you."
        return
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
    tools={"book": ToolSpec(timeout=5.0), "charge_card": ToolSpec(timeout=30.0)},
    token=TOKEN,
)
