"""OpenAI Realtime tap: payloads built from ``openai.types.realtime`` models, mapped to calltape events."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import pytest
from openai.types.realtime import (
    ConversationItemCreateEvent,
    ConversationItemInputAudioTranscriptionCompletedEvent,
    ConversationItemInputAudioTranscriptionDeltaEvent,
    ConversationItemTruncatedEvent,
    ConversationItemTruncateEvent,
    InputAudioBufferCommittedEvent,
    InputAudioBufferSpeechStartedEvent,
    InputAudioBufferSpeechStoppedEvent,
    ResponseAudioDeltaEvent,
    ResponseAudioTranscriptDeltaEvent,
    ResponseCreatedEvent,
    ResponseDoneEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseOutputItemAddedEvent,
)
from openai.types.realtime.realtime_server_event import OutputAudioBufferCleared

from calltape.adapters.realtime import FunctionCall, InworldEndpoint, RealtimeTap, heard_text, seed_events
from calltape.events import Event, make_event


class Sink:
    """Records what the tap emits, validating each event like the runtime does."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, type: str, data: Mapping[str, Any]) -> Event:
        event = make_event("s", type, data)
        self.events.append((type, event.data))
        return event

    def types(self) -> list[str]:
        return [t for t, _ in self.events]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def ev_id(n: list[int] = [0]) -> str:  # noqa: B006 - a counter
    n[0] += 1
    return f"event_{n[0]}"


def created(rid: str) -> ResponseCreatedEvent:
    return ResponseCreatedEvent.model_validate(
        {"type": "response.created", "event_id": ev_id(), "response": {"id": rid, "status": "in_progress"}}
    )


def item_added(rid: str, item_id: str, kind: str = "message") -> ResponseOutputItemAddedEvent:
    item: dict[str, Any] = (
        {"id": item_id, "type": "message", "role": "assistant", "content": []}
        if kind == "message"
        else {"id": item_id, "type": "function_call", "name": "lookup", "arguments": "", "call_id": "c?"}
    )
    return ResponseOutputItemAddedEvent.model_validate(
        {"type": "response.output_item.added", "event_id": ev_id(), "response_id": rid, "output_index": 0, "item": item}
    )


def transcript_delta(rid: str, item_id: str, delta: str) -> ResponseAudioTranscriptDeltaEvent:
    return ResponseAudioTranscriptDeltaEvent(
        type="response.output_audio_transcript.delta",
        event_id=ev_id(),
        response_id=rid,
        item_id=item_id,
        output_index=0,
        content_index=0,
        delta=delta,
    )


def audio_delta(rid: str, item_id: str, ms: int) -> ResponseAudioDeltaEvent:
    pcm = b"\x00\x01" * (24 * ms)  # pcm16 at 24 kHz: 48 bytes a millisecond
    return ResponseAudioDeltaEvent(
        type="response.output_audio.delta",
        event_id=ev_id(),
        response_id=rid,
        item_id=item_id,
        output_index=0,
        content_index=0,
        delta=base64.b64encode(pcm).decode(),
    )


def args_done(rid: str, call_id: str, name: str, arguments: str) -> ResponseFunctionCallArgumentsDoneEvent:
    return ResponseFunctionCallArgumentsDoneEvent(
        type="response.function_call_arguments.done",
        event_id=ev_id(),
        response_id=rid,
        item_id=f"item_{call_id}",
        output_index=1,
        call_id=call_id,
        name=name,
        arguments=arguments,
    )


def done(
    rid: str, status: str, output: list[dict[str, Any]] | None = None, reason: str | None = None
) -> ResponseDoneEvent:
    response: dict[str, Any] = {"id": rid, "status": status, "output": output or []}
    if reason:
        response["status_details"] = {"type": status, "reason": reason}
    return ResponseDoneEvent.model_validate({"type": "response.done", "event_id": ev_id(), "response": response})


def fc_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"item_{call_id}", "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def user_turn(item_id: str) -> list[Any]:
    return [
        InputAudioBufferSpeechStartedEvent(
            type="input_audio_buffer.speech_started", event_id=ev_id(), item_id=item_id, audio_start_ms=0
        ),
        InputAudioBufferSpeechStoppedEvent(
            type="input_audio_buffer.speech_stopped", event_id=ev_id(), item_id=item_id, audio_end_ms=900
        ),
        InputAudioBufferCommittedEvent(type="input_audio_buffer.committed", event_id=ev_id(), item_id=item_id),
    ]


def transcription(item_id: str, text: str) -> ConversationItemInputAudioTranscriptionCompletedEvent:
    return ConversationItemInputAudioTranscriptionCompletedEvent.model_validate(
        {
            "type": "conversation.item.input_audio_transcription.completed",
            "event_id": ev_id(),
            "item_id": item_id,
            "content_index": 0,
            "transcript": text,
            "usage": {"type": "duration", "seconds": 1.2},
        }
    )


def test_function_call_of_a_cancelled_response_is_never_recorded_or_runnable() -> None:
    sink = Sink()
    tap = RealtimeTap(sink, input_transcription=False)
    tap.server_event(created("resp_1"))
    assert tap.server_event(args_done("resp_1", "call_1", "refund", '{"amount": 30}')) == []
    runnable = tap.server_event(
        done("resp_1", "cancelled", [fc_item("call_1", "refund", '{"amount": 30}')], reason="turn_detected")
    )
    assert runnable == []
    assert "tool.call" not in sink.types()
    assert ("interruption", {"reply": "resp_1", "cause": "user_speech"}) in sink.events
    discarded = [d for t, d in sink.events if t == "x.realtime.discarded_calls"]
    assert discarded == [{"reply": "resp_1", "status": "cancelled", "calls": [{"call": "call_1", "name": "refund"}]}]


def test_function_call_counts_once_its_response_completed() -> None:
    sink = Sink()
    tap = RealtimeTap(sink, input_transcription=False)
    tap.server_event(created("resp_1"))
    tap.server_event(args_done("resp_1", "call_1", "lookup", '{"id": 7}'))
    assert "tool.call" not in sink.types()
    runnable = tap.server_event(done("resp_1", "completed", [fc_item("call_1", "lookup", '{"id": 7}')]))
    assert runnable == [FunctionCall("call_1", "lookup", '{"id": 7}', "resp_1", "item_call_1")]
    assert runnable[0].parsed_arguments() == {"id": 7}
    assert (
        "tool.call",
        {"call": "call_1", "name": "lookup", "arguments": '{"id": 7}', "reply": "resp_1"},
    ) in sink.events
    assert sink.types()[-1] == "agent.reply.done"


def test_client_cancel_is_an_api_interruption() -> None:
    sink = Sink()
    tap = RealtimeTap(sink, input_transcription=False)
    tap.server_event(created("resp_1"))
    tap.client_event({"type": "response.cancel"})
    tap.server_event(done("resp_1", "cancelled", reason="client_cancelled"))
    assert ("interruption", {"reply": "resp_1", "cause": "api"}) in sink.events


def test_truncate_sets_heard_text_proportionally_at_a_word_boundary() -> None:
    sink = Sink()
    tap = RealtimeTap(sink, input_transcription=False)
    text = "Your order ships tomorrow and arrives on Friday."
    tap.server_event(created("resp_1"))
    tap.server_event(item_added("resp_1", "item_a"))
    tap.server_event(transcript_delta("resp_1", "item_a", text))
    tap.server_event(audio_delta("resp_1", "item_a", 2000))
    tap.server_event(done("resp_1", "completed"))
    assert sink.types()[-2:] == ["agent.reply.done", "agent.speech.ended"]
    # the user barged in 1 s into 2 s of audio: half the text, whole words only
    tap.client_event(
        ConversationItemTruncateEvent(
            type="conversation.item.truncate", item_id="item_a", content_index=0, audio_end_ms=1000
        )
    )
    heard = "Your order ships"  # "tomorrow" was cut mid-word
    assert sink.events[-2] == ("interruption", {"reply": "resp_1", "cause": "user_speech", "heard": heard})
    assert sink.events[-1] == ("agent.speech.ended", {"reply": "resp_1", "interrupted": True, "heard": heard})
    # the server's confirmation of the same truncation writes nothing new
    n = len(sink.events)
    tap.server_event(
        ConversationItemTruncatedEvent(
            type="conversation.item.truncated", event_id=ev_id(), item_id="item_a", content_index=0, audio_end_ms=1000
        )
    )
    assert len(sink.events) == n


def test_heard_text_edges() -> None:
    assert heard_text("hello there friend", 0, 1000) == ""
    assert heard_text("hello there friend", 5000, 1000) == "hello there friend"
    assert heard_text("hello there friend", 500, 1000) == "hello"
    assert heard_text("", 500, 1000) == ""
    # no audio seen (WebRTC): estimated at 15 characters a second
    assert heard_text("a" * 15 + " " + "b" * 15, 1100, None) == "a" * 15


def test_late_input_transcription_is_placed_before_the_reply_it_answers() -> None:
    sink = Sink()
    clock = Clock()
    tap = RealtimeTap(sink, clock=clock)
    for e in user_turn("item_u1"):
        tap.server_event(e)
    tap.server_event(created("resp_1"))
    tap.server_event(transcript_delta("resp_1", "item_a", "Sure."))
    assert sink.types() == ["user.speech.started", "user.speech.stopped"]  # reply held back
    tap.server_event(
        ConversationItemInputAudioTranscriptionDeltaEvent(
            type="conversation.item.input_audio_transcription.delta",
            event_id=ev_id(),
            item_id="item_u1",
            delta="Can you",
        )
    )
    tap.server_event(transcription("item_u1", "Can you help me?"))
    assert sink.types() == [
        "user.speech.started",
        "user.speech.stopped",
        "user.transcript",
        "user.transcript",
        "agent.reply.started",
        "agent.text",
    ]
    assert sink.events[3] == ("user.transcript", {"text": "Can you help me?", "final": True})


def test_hold_is_bounded_when_transcription_never_arrives() -> None:
    sink = Sink()
    clock = Clock()
    tap = RealtimeTap(sink, clock=clock, transcript_hold_ms=1500)
    for e in user_turn("item_u1"):
        tap.server_event(e)
    tap.server_event(created("resp_1"))
    assert "agent.reply.started" not in sink.types()
    clock.now += 1600
    tap.server_event(transcript_delta("resp_1", "item_a", "Hello"))
    assert sink.types()[-2:] == ["agent.reply.started", "agent.text"]


def test_completed_calls_release_the_hold_before_they_run() -> None:
    sink = Sink()
    tap = RealtimeTap(sink, clock=Clock())
    for e in user_turn("item_u1"):
        tap.server_event(e)
    tap.server_event(created("resp_1"))
    runnable = tap.server_event(done("resp_1", "completed", [fc_item("call_1", "lookup", "{}")]))
    assert [f.call_id for f in runnable] == ["call_1"]
    assert "tool.call" in sink.types()


def test_late_tokens_of_a_cancelled_response_are_dropped() -> None:
    sink = Sink()
    tap = RealtimeTap(sink, input_transcription=False)
    tap.server_event(created("resp_1"))
    tap.server_event(transcript_delta("resp_1", "item_a", "One "))
    tap.server_event(done("resp_1", "cancelled", reason="turn_detected"))
    tap.server_event(transcript_delta("resp_1", "item_a", "two"))
    assert [d["text"] for t, d in sink.events if t == "agent.text"] == ["One "]


def test_webrtc_cleared_buffer_interrupts_a_completed_reply() -> None:
    sink = Sink()
    tap = RealtimeTap(sink, input_transcription=False, playout="output_audio_buffer")
    tap.server_event(created("resp_1"))
    tap.server_event({"type": "output_audio_buffer.started", "event_id": ev_id(), "response_id": "resp_1"})
    tap.server_event(transcript_delta("resp_1", "item_a", "It will be ready soon."))
    tap.server_event(done("resp_1", "completed"))
    assert "agent.speech.ended" not in sink.types()
    tap.server_event(
        OutputAudioBufferCleared(type="output_audio_buffer.cleared", event_id=ev_id(), response_id="resp_1")
    )
    assert sink.events[-2:] == [
        ("interruption", {"reply": "resp_1", "cause": "user_speech"}),
        ("agent.speech.ended", {"reply": "resp_1", "interrupted": True}),
    ]


def test_beta_event_names_and_json_text_are_accepted() -> None:
    sink = Sink()
    tap = RealtimeTap(sink, input_transcription=False)
    tap.server_event('{"type": "response.created", "event_id": "e1", "response": {"id": "resp_9"}}')
    tap.server_event(
        {"type": "response.audio_transcript.delta", "response_id": "resp_9", "item_id": "i", "delta": "Hi"}
    )
    assert sink.events[-1] == ("agent.text", {"reply": "resp_9", "text": "Hi"})


def test_user_text_and_self_run_tool_outputs_from_client_events() -> None:
    sink = Sink()
    tap = RealtimeTap(sink, input_transcription=False)
    tap.client_event(
        ConversationItemCreateEvent.model_validate(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            }
        )
    )
    tap.client_event(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "c1", "output": '{"ok": true}'},
        }
    )
    assert sink.events == [("user.text", {"text": "hi"}), ("tool.result", {"call": "c1", "output": {"ok": True}})]


def test_malformed_events_are_rejected() -> None:
    tap = RealtimeTap(Sink())
    with pytest.raises(ValueError):
        tap.server_event("not json")
    with pytest.raises(ValueError):
        tap.server_event({"no": "type"})


def test_seed_events_restore_history_as_text_items() -> None:
    from calltape.events import make_event
    from calltape.projections import fold_events

    def ev(kind: str, **data: Any) -> Any:
        return make_event("seed", kind, data)

    context = fold_events(
        [
            ev("session.started", agent="a", instructions="Be brief."),
            ev("user.text", text="Where is my order?"),
            ev("agent.reply.started", reply="r1"),
            ev("agent.text", reply="r1", text="Let me check"),
            ev("tool.call", reply="r1", call="c1", name="lookup", arguments={"id": 7}),
            ev("agent.reply.done", reply="r1"),
            ev("agent.speech.started", reply="r1"),
            ev("interruption", reply="r1", heard="Let me check"),
            ev("tool.started", call="c1"),
            ev("tool.result", call="c1", output={"eta": "Friday"}),
            ev("agent.handoff", **{"from": "a", "to": "b"}),
        ]
    ).native()
    events = seed_events(context)
    assert all(isinstance(e, ConversationItemCreateEvent) for e in events)
    dumped = [e.model_dump(exclude_none=True)["item"] for e in events]
    assert dumped == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Where is my order?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check"}]},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"id":7}'},
        {"type": "function_call_output", "call_id": "c1", "output": '{"eta":"Friday"}'},
    ]


def test_inworld_endpoint_configuration() -> None:
    ep = InworldEndpoint(api_key="aWQ6c2VjcmV0", session_key="sess-1")
    assert ep.url == "wss://api.inworld.ai/api/v1/realtime/session?key=sess-1&protocol=realtime"
    assert ep.headers == {"Authorization": "Basic aWQ6c2VjcmV0"}
    assert InworldEndpoint(api_key="id:secret", session_key="x").headers["Authorization"] == "Basic aWQ6c2VjcmV0"


def test_client_playout_mode_waits_for_the_player() -> None:
    sink = Sink()
    tap = RealtimeTap(sink, input_transcription=False, playout="client")
    tap.server_event(created("resp_1"))
    tap.server_event(item_added("resp_1", "item_a"))
    tap.server_event(transcript_delta("resp_1", "item_a", "Your table is booked."))
    tap.server_event(audio_delta("resp_1", "item_a", 1500))
    tap.server_event(done("resp_1", "completed"))
    # the response is done, but the app's player still plays it: not heard yet
    assert "agent.speech.ended" not in sink.types()
    assert sink.types()[-1] == "agent.reply.done"
    tap.playout_finished("resp_1")
    assert sink.events[-1] == ("agent.speech.ended", {"reply": "resp_1", "interrupted": False})
    tap.playout_finished("resp_1")  # reported twice: once only
    assert sink.types().count("agent.speech.ended") == 1

    # a second reply cut by the player: the truncate the app sends decides what was heard
    tap.server_event(created("resp_2"))
    tap.server_event(item_added("resp_2", "item_b"))
    tap.server_event(transcript_delta("resp_2", "item_b", "Anything else I can do"))
    tap.server_event(audio_delta("resp_2", "item_b", 2000))
    tap.server_event(done("resp_2", "completed"))
    tap.client_event(
        ConversationItemTruncateEvent(
            type="conversation.item.truncate", item_id="item_b", content_index=0, audio_end_ms=1200
        )
    )
    heard = "Anything else"
    assert sink.events[-2:] == [
        ("interruption", {"reply": "resp_2", "cause": "user_speech", "heard": heard}),
        ("agent.speech.ended", {"reply": "resp_2", "interrupted": True, "heard": heard}),
    ]
    tap.playout_finished("resp_2", interrupted=True)  # the player's own report comes after: no second end
    assert sink.types().count("agent.speech.ended") == 2
