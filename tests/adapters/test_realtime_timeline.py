"""OpenAI Realtime tap on the real runtime and store: a barge-in during a tool call."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from openai.types.realtime import (
    ConversationItemInputAudioTranscriptionCompletedEvent,
    ConversationItemTruncateEvent,
    InputAudioBufferCommittedEvent,
    InputAudioBufferSpeechStartedEvent,
    InputAudioBufferSpeechStoppedEvent,
    ResponseAudioDeltaEvent,
    ResponseAudioTranscriptDeltaEvent,
    ResponseCreatedEvent,
    ResponseDoneEvent,
    ResponseFunctionCallArgumentsDoneEvent,
)

from calltape.adapters.realtime import RealtimeTap, seed_events
from calltape.eventstore.recorder import Recorder
from calltape.projections import build_context, render
from calltape.runtime import CallSession
from tests.adapters.hosted_support import recorder as recorder  # the fixture
from tests.adapters.hosted_support import tool_json


def _id(prefix: str, n: list[int] = [0]) -> str:  # noqa: B006 - a counter
    n[0] += 1
    return f"{prefix}_{n[0]}"


def _user(item: str, text: str) -> list[Any]:
    return [
        InputAudioBufferSpeechStartedEvent(
            type="input_audio_buffer.speech_started", event_id=_id("e"), item_id=item, audio_start_ms=0
        ),
        InputAudioBufferSpeechStoppedEvent(
            type="input_audio_buffer.speech_stopped", event_id=_id("e"), item_id=item, audio_end_ms=800
        ),
        InputAudioBufferCommittedEvent(type="input_audio_buffer.committed", event_id=_id("e"), item_id=item),
        ConversationItemInputAudioTranscriptionCompletedEvent.model_validate(
            {
                "type": "conversation.item.input_audio_transcription.completed",
                "event_id": _id("e"),
                "item_id": item,
                "content_index": 0,
                "transcript": text,
                "usage": {"type": "duration", "seconds": 1.0},
            }
        ),
    ]


def _assistant(rid: str, item: str, text: str, audio_ms: int) -> list[Any]:
    return [
        ResponseCreatedEvent.model_validate(
            {"type": "response.created", "event_id": _id("e"), "response": {"id": rid, "status": "in_progress"}}
        ),
        ResponseAudioTranscriptDeltaEvent(
            type="response.output_audio_transcript.delta",
            event_id=_id("e"),
            response_id=rid,
            item_id=item,
            output_index=0,
            content_index=0,
            delta=text,
        ),
        ResponseAudioDeltaEvent(
            type="response.output_audio.delta",
            event_id=_id("e"),
            response_id=rid,
            item_id=item,
            output_index=0,
            content_index=0,
            delta=base64.b64encode(b"\0" * 48 * audio_ms).decode(),
        ),
    ]


def _done(rid: str, status: str, calls: list[tuple[str, str, str]] = (), reason: str | None = None) -> Any:  # type: ignore[assignment]
    response: dict[str, Any] = {
        "id": rid,
        "status": status,
        "output": [
            {"id": f"it_{c}", "type": "function_call", "call_id": c, "name": n, "arguments": a} for c, n, a in calls
        ],
    }
    if reason:
        response["status_details"] = {"type": status, "reason": reason}
    return ResponseDoneEvent.model_validate({"type": "response.done", "event_id": _id("e"), "response": response})


async def test_barge_in_during_a_tool_call(recorder: Recorder) -> None:
    call = await CallSession.start(recorder, "rt-1", agent="concierge", instructions="Be brief.", framework="openai")
    tap = RealtimeTap(call)
    release = asyncio.Event()
    ran: list[dict[str, Any]] = []

    async def lookup_order(order: int) -> dict[str, Any]:
        ran.append({"order": order})
        await release.wait()
        return {"order": order, "eta": "Friday"}

    for e in _user("u1", "Where is order 42?"):
        tap.server_event(e)
    for e in _assistant("resp_1", "a1", "Let me look that up for you right now.", 2000):
        tap.server_event(e)
    tap.server_event(
        ResponseFunctionCallArgumentsDoneEvent(
            type="response.function_call_arguments.done",
            event_id=_id("e"),
            response_id="resp_1",
            item_id="it_c1",
            output_index=1,
            call_id="c1",
            name="lookup_order",
            arguments='{"order": 42}',
        )
    )
    runnable = tap.server_event(_done("resp_1", "completed", [("c1", "lookup_order", '{"order": 42}')]))
    assert [f.call_id for f in runnable] == ["c1"]
    task = asyncio.create_task(tap.run_tool(runnable[0], lambda: lookup_order(**runnable[0].parsed_arguments())))
    await asyncio.sleep(0.01)

    # the user barges in 0.7 s into the 2 s "let me look" audio, while the lookup runs
    tap.server_event(
        InputAudioBufferSpeechStartedEvent(
            type="input_audio_buffer.speech_started", event_id=_id("e"), item_id="u2", audio_start_ms=3000
        )
    )
    tap.client_event(
        ConversationItemTruncateEvent(
            type="conversation.item.truncate", item_id="a1", content_index=0, audio_end_ms=700
        )
    )
    for e in _user("u2", "Actually, also check order 43.")[1:]:
        tap.server_event(e)
    # a response started and cancelled at once: its function call must never run
    for e in _assistant("resp_2", "a2", "Sure", 100)[:2]:  # cancelled before any audio played
        tap.server_event(e)
    tap.server_event(
        ResponseFunctionCallArgumentsDoneEvent(
            type="response.function_call_arguments.done",
            event_id=_id("e"),
            response_id="resp_2",
            item_id="it_c2",
            output_index=1,
            call_id="c2",
            name="lookup_order",
            arguments='{"order": 43}',
        )
    )
    assert (
        tap.server_event(_done("resp_2", "cancelled", [("c2", "lookup_order", '{"order": 43}')], "turn_detected")) == []
    )

    release.set()
    outcome = await task
    assert outcome.status == "completed" and outcome.ran
    assert ran == [{"order": 42}]
    await recorder.flush()

    live = call.context("openai")
    stored = render((await build_context(recorder.store, "rt-1")).native(), "openai")
    assert tool_json(live) == tool_json(stored)
    assert tool_json(live) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where is order 42?"},
        {
            "role": "assistant",
            "content": "Let me look",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"order": 42}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": {"order": 42, "eta": "Friday"}},
        {"role": "user", "content": "Actually, also check order 43."},
    ]
    # the seeding helper restores this history into a new Realtime session
    seeded = [e.item.model_dump(exclude_none=True) for e in seed_events(call.context())]
    assert [i["type"] for i in seeded] == ["message", "message", "function_call", "function_call_output", "message"]
    assert seeded[1]["content"] == [{"type": "output_text", "text": "Let me look"}]
    # equals the projection's own realtime format
    assert [e.model_dump(exclude_none=True) for e in seed_events(call.context())] == call.context("realtime")
