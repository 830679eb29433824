"""Retell custom-LLM protocol on the real runtime: supersession is an interruption, tools run once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from retell.lib.webhook_auth import symmetric

from calltape.adapters.retell import RetellLLMSession, RetellTurn, sign_retell, verify_retell_signature
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.projections import build_context, render
from calltape.runtime import CallSession


def test_signature_scheme_matches_the_retell_sdk() -> None:
    body = b'{"event":"call_started","call":{"call_id":"c1"}}'
    sdk_signature = symmetric["sign"](body.decode(), "key_abc")
    assert verify_retell_signature(body, "key_abc", sdk_signature)
    assert symmetric["verify"](body.decode(), "key_abc", sign_retell(body, "key_abc"))
    assert not verify_retell_signature(body + b" ", "key_abc", sdk_signature)
    assert not verify_retell_signature(body, "other", sdk_signature)
    old = sign_retell(body, "key_abc", timestamp_ms=1_000)
    assert not verify_retell_signature(body, "key_abc", old)  # outside the five-minute window
    assert not verify_retell_signature(body, "key_abc", None)


async def test_reasked_response_never_runs_a_tool_twice(store: EventStore) -> None:
    recorder = Recorder(store)
    await recorder.start()
    call = await CallSession.start(recorder, "retell-1", agent="scheduler", framework="retell")
    sent: list[dict[str, Any]] = []
    release = asyncio.Event()
    runs = 0

    async def send(frame: dict[str, Any]) -> None:
        sent.append(frame)

    async def book(slot: str) -> dict[str, Any]:
        nonlocal runs
        runs += 1
        await release.wait()
        return {"booked": slot}

    async def respond(turn: RetellTurn) -> AsyncIterator[str]:
        yield "Booking 3pm for you. "
        outcome = await turn.run_tool("book", {"slot": "15:00"}, lambda: book("15:00"))
        yield f"Done: {outcome.output['booked']}."

    session = RetellLLMSession(call, respond, send)
    await session.open()
    user = {"role": "user", "content": "Book me at 3pm."}
    await session.receive({"interaction_type": "response_required", "response_id": 1, "transcript": [user]})
    await asyncio.sleep(0.02)
    agent_said = {"role": "agent", "content": "Booking 3pm"}
    await session.receive({"interaction_type": "update_only", "transcript": [user, agent_said]})
    # Retell re-asks (e.g. the user made a noise): response 2 supersedes 1 while the tool runs
    await session.receive({"interaction_type": "response_required", "response_id": 2, "transcript": [user, agent_said]})
    await asyncio.sleep(0.02)
    release.set()
    await session.wait_idle()
    assert runs == 1
    assert [f["response_type"] for f in sent].count("tool_call_invocation") == 1
    final = [f for f in sent if f.get("response_id") == 2 and f["response_type"] == "response"]
    assert final[-1]["content_complete"] is True
    assert any(f["content"] == "Done: 15:00." for f in final)
    assert not any(f.get("response_id") == 1 and f.get("content_complete") for f in sent)

    await recorder.flush()
    context = render((await build_context(store, "retell-1")).native(), "openai")
    assert context == [
        {"role": "user", "content": "Book me at 3pm."},
        {
            "role": "assistant",
            "content": "Booking 3pm",
            "tool_calls": [
                {
                    "id": "retell-1:book:1",
                    "type": "function",
                    "function": {"name": "book", "arguments": '{"slot":"15:00"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "retell-1:book:1", "content": '{"booked":"15:00"}'},
        # response 2 asked for the same call: its reply ends there, the text after the result is a new one
        {"role": "assistant", "content": "Booking 3pm for you. "},
        {"role": "assistant", "content": "Done: 15:00."},
    ]
    await recorder.close()
