"""Saved post-call payloads → calltape sessions (``calltape import --format``'s mapping).

Payloads come from :mod:`tests.adapters.postcall_payloads` (the platforms' SDK types where they ship
them). The contexts are compared whole; the barge-ins and the tool call left without a result are
checked with the same rules as ``calltape check``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from calltape.adapters.postcall import PLATFORMS, postcall_events
from calltape.checks.runner import check_events
from calltape.errors import InvalidEvent
from calltape.eventstore import EventStore
from calltape.projections import build_context, fold_events, render
from tests.adapters import postcall_payloads as p
from tests.adapters.hosted_support import tool_json

SAVED: dict[str, Callable[[], dict[str, Any]]] = {
    "vapi": p.vapi_report,
    "retell": p.retell_webhook,
    "bland": p.bland_post_call,
    "elevenlabs": p.elevenlabs_webhook,
    "ultravox": p.ultravox_saved,
}


def one(platform: str, payload: Any) -> list[Any]:
    sessions = postcall_events(platform, payload)
    assert len(sessions) == 1
    return sessions[0]


def openai(events: list[Any]) -> list[dict[str, Any]]:
    return tool_json(render(fold_events(events, events[0].session).native(), "openai"))


def violations(events: list[Any]) -> list[tuple[str, str]]:
    by_seq = {n: e for n, e in enumerate(events, start=1)}
    numbered = [e.with_seq(n) for n, e in by_seq.items()]
    return [(v.rule, by_seq[v.seq].data.get("call", "")) for v in check_events(numbered)]


def test_elevenlabs_barge_in_heard_text_and_the_call_left_without_a_result() -> None:
    events = one("elevenlabs", p.elevenlabs_webhook())
    start = events[0]
    assert start.data["metadata"]["reconstructed"] is True and start.data["framework"] == "elevenlabs"
    assert start.data["agent"] == "bistro" and start.at_ms == p.T0
    cut = [e for e in events if e.type == "interruption"]
    assert [e.data["heard"] for e in cut] == [p.EL_HEARD]
    assert cut[0].at_ms == p.T0 + 9000  # when the user's next line began: the payload's own time
    generated = [e.data["text"] for e in events if e.type == "agent.text"]
    assert p.EL_GENERATED in generated  # what the LLM had generated stays in the log, unheard
    assert not any(e.type.startswith("user.speech") for e in events)  # no VAD edge is invented
    assert openai(events) == [
        {"role": "assistant", "content": "Hi, this is Ava from the bistro. How can I help?"},
        {"role": "user", "content": "Book a table for two at eight."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "el-tool-1",
                    "type": "function",
                    "function": {"name": "book_table", "arguments": '{"people":2,"time":"20:00"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "el-tool-1", "content": {"confirmation": "BK-42"}},
        {"role": "assistant", "content": p.EL_HEARD},
        {"role": "user", "content": "Actually, make it three."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "el-tool-2",
                    "type": "function",
                    "function": {"name": "update_booking", "arguments": '{"people":3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "el-tool-2", "content": {"status": "in_progress"}},
    ]
    assert events[-1].type == "session.ended" and events[-1].at_ms == p.T0 + 15_000
    assert violations(events) == [("orphan-call", "el-tool-2")]


def test_the_conversation_object_maps_like_the_webhook() -> None:
    conversation = json.loads(p.elevenlabs_conversation().json(exclude_none=True))
    assert one("elevenlabs", conversation) == one("elevenlabs", p.elevenlabs_webhook())


def test_vapi_interruption_count_with_overlapping_turns() -> None:
    events = one("vapi", p.vapi_report())
    cut = [e for e in events if e.type == "interruption"]
    # one interruption counted; two lines overlap the next user line, the longer overlap is the cut
    assert [(e.data["heard"], e.at_ms) for e in cut] == [
        ("Booked for two. Would you like a reminder by text", p.T0 + 8200)
    ]
    assert violations(events) == []
    assert openai(events)[-3:] == [
        {"role": "assistant", "content": "Booked for two. Would you like a reminder by text"},
        {"role": "user", "content": "No thanks, that's all."},
        {"role": "assistant", "content": "Okay, goodbye."},
    ]
    # without the count the report does not say a line was cut: nothing is marked
    assert not any(e.type == "interruption" for e in one("vapi", p.vapi_report(interrupted=None)))
    assert sum(e.type == "interruption" for e in one("vapi", p.vapi_report(interrupted=5))) == 2


def test_vapi_call_object_maps_like_the_report() -> None:
    report = p.vapi_report()["message"]
    call = {**report["call"], **{k: report[k] for k in ("artifact", "startedAt", "endedAt", "endedReason")}}
    assert one("vapi", call) == one("vapi", report) == one("vapi", {"message": report})


def test_ultravox_pairs_tool_calls_by_invocation_and_a_lost_call_is_dropped() -> None:
    events = one("ultravox", p.ultravox_saved())
    assert events[0].data["instructions"] == "You book tables." and events[0].data["agent"] == "bistro"
    assert events[-1].type == "session.dropped" and events[-1].data == {"reason": "connection_error"}
    user = [e.at_ms for e in events if e.type == "user.transcript"]
    assert user[0] == p.T0 + 1000 + 2500  # joined + timespan.start
    assert openai(events)[-2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "uv-inv-2",
                    "type": "function",
                    "function": {"name": "send_reminder", "arguments": '{"channel":"sms"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "uv-inv-2", "content": {"status": "in_progress"}},
    ]
    # dropped and nobody resumed it: the drop is reported, the open call is not an orphan (yet)
    assert violations(events) == [("unsettled-drop", "")]
    ended = one("ultravox", p.ultravox_saved(end_reason="hangup"))
    assert ended[-1].type == "session.ended"
    assert violations(ended) == [("orphan-call", "uv-inv-2")]
    # the messages list itself, not only the endpoint's page
    listed = {"call": p.ultravox_call(), "messages": p.ultravox_messages()["results"]}
    assert one("ultravox", listed) == events


def test_retell_and_bland_reuse_their_receivers_mapping() -> None:
    from calltape.adapters.bland import bland_events
    from calltape.adapters.retell import retell_webhook_events

    assert one("retell", p.retell_webhook()) == retell_webhook_events(p.retell_webhook())
    assert one("retell", p.retell_webhook()["call"]) == retell_webhook_events(p.retell_webhook())
    assert one("bland", p.bland_post_call()) == bland_events(p.bland_post_call())


@pytest.mark.parametrize("platform", list(PLATFORMS))
@pytest.mark.parametrize("other", list(SAVED))
def test_another_platforms_payload_is_refused(platform: str, other: str) -> None:
    if platform == other:
        assert postcall_events(platform, SAVED[other]())
        return
    with pytest.raises(InvalidEvent) as caught:
        postcall_events(platform, SAVED[other]())
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("platform", "payload", "fragment"),
    [
        ("ultravox", {"call": p.ultravox_call()}, "needs 'messages'"),
        ("ultravox", {"call": p.ultravox_call(), "messages": {"results": "x"}}, "messages"),
        ("elevenlabs", {"type": "post_call_audio", "data": {}}, "carries no transcript"),
        ("retell", {"event": "call_started", "call": {"call_id": "x"}}, "no finished call"),
        ("vapi", {"message": {"type": "status-update", "call": {"id": "x"}}}, "not an end-of-call report"),
        ("vapi", [p.vapi_report(), "text"], "item 2"),
    ],
)
def test_shapes_that_are_not_a_post_call_payload(platform: str, payload: Any, fragment: str) -> None:
    with pytest.raises(InvalidEvent, match=fragment):
        postcall_events(platform, payload)


def test_a_list_endpoints_array_is_one_session_per_call() -> None:
    sessions = postcall_events("vapi", [p.vapi_report("vapi-a"), p.vapi_report("vapi-b")])
    assert [s[0].session for s in sessions] == ["vapi-a", "vapi-b"]


@pytest.mark.parametrize("platform", list(SAVED))
async def test_stored_twice_adds_nothing(store: EventStore, platform: str) -> None:
    events = one(platform, SAVED[platform]())
    await store.append(events)
    session = events[0].session
    before = await store.read(session)
    await store.append(one(platform, SAVED[platform]()))  # ids derive from the payload
    assert await store.read(session) == before
    native = (await build_context(store, session)).native()
    assert native == fold_events(events, session).native() | {"seq": native["seq"]}
