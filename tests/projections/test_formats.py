"""Provider formats: shapes and SDK validity."""

from __future__ import annotations

import pytest
from projection_checks import check_all
from projection_timeline import Tape

from calltape.projections import UnknownFormat, render, to_anthropic, to_openai, to_realtime


def conversation() -> Tape:
    tape = Tape(instructions="You book tables.")
    tape.reply("r0", "Hi, how can I help?", spoken=True)  # the agent greets first
    tape.said("a table for two")
    tape.add("agent.reply.started", reply="r1")
    tape.add("agent.text", reply="r1", text="Let me check. ")
    tape.call("c1", name="availability", arguments={"people": 2}, reply="r1")
    tape.call("c2", name="weather", arguments="[1, 2]", reply="r1")
    tape.add("agent.reply.done", reply="r1")
    tape.add("agent.speech.started", reply="r1")
    tape.add("agent.speech.ended", reply="r1", interrupted=False)
    tape.add("tool.started", call="c1")
    tape.result("c1", {"slots": ["19:00"]})
    tape.add("tool.cancelled", call="c2", reason="timeout")
    tape.add("agent.handoff", **{"from": "alice", "to": "bob"})
    tape.reply("r2", "Bob here: 19:00 works.", spoken=True)
    tape.said("great")
    return tape


def test_openai_messages() -> None:
    native = conversation().native()
    check_all(native)
    assert to_openai(native) == [
        {"role": "system", "content": "You book tables."},
        {"role": "assistant", "content": "Hi, how can I help?"},
        {"role": "user", "content": "a table for two"},
        {
            "role": "assistant",
            "content": "Let me check. ",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "availability", "arguments": '{"people":2}'}},
                {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": "[1, 2]"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"slots":["19:00"]}'},
        {"role": "tool", "tool_call_id": "c2", "content": '{"status":"timeout"}'},
        {"role": "assistant", "content": "Bob here: 19:00 works."},
        {"role": "user", "content": "great"},
    ]


def test_anthropic_body() -> None:
    body = to_anthropic(conversation().native())
    assert body["system"] == "You book tables."
    assert body["messages"] == [
        {"role": "assistant", "content": [{"type": "text", "text": "Hi, how can I help?"}]},
        {"role": "user", "content": [{"type": "text", "text": "a table for two"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "c1", "name": "availability", "input": {"people": 2}},
                {"type": "tool_use", "id": "c2", "name": "weather", "input": {"arguments": [1, 2]}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": '{"slots":["19:00"]}'},
                {"type": "tool_result", "tool_use_id": "c2", "content": '{"status":"timeout"}', "is_error": True},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Bob here: 19:00 works."}]},
        {"role": "user", "content": [{"type": "text", "text": "great"}]},
    ]


def test_anthropic_merges_turns_split_by_a_handoff() -> None:
    tape = Tape()
    tape.said("hi")
    tape.reply("r1", "one", spoken=True)
    tape.add("agent.handoff", **{"from": "alice", "to": "bob"})
    tape.reply("r2", "two", spoken=True)
    tape.call("c1")  # joins r2
    tape.result("c1", "out")
    tape.said("ok")
    body = to_anthropic(tape.native())
    check_all(tape.native())
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert [b["type"] for b in body["messages"][1]["content"]] == ["text", "text", "tool_use"]
    assert [b["type"] for b in body["messages"][2]["content"]] == ["tool_result", "text"]


def test_realtime_events() -> None:
    events = to_realtime(conversation().native())
    check_all(conversation().native())
    kinds = [(e["item"]["type"], e["item"].get("role")) for e in events]
    assert kinds == [
        ("message", "assistant"),
        ("message", "user"),
        ("message", "assistant"),
        ("function_call", None),
        ("function_call", None),
        ("function_call_output", None),
        ("function_call_output", None),
        ("message", "assistant"),
        ("message", "user"),
    ]
    assert events[3]["item"] == {
        "type": "function_call",
        "call_id": "c1",
        "name": "availability",
        "arguments": '{"people":2}',
    }
    assert events[1] == {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a table for two"}]},
    }


def test_string_output_is_verbatim() -> None:
    tape = Tape()
    tape.call("c1")
    tape.result("c1", "plain text")
    assert to_openai(tape.native())[-1]["content"] == "plain text"
    assert to_realtime(tape.native())[-1]["item"]["output"] == "plain text"


def test_render_by_name() -> None:
    native = conversation().native()
    assert render(native) is native
    assert render(native, "openai") == to_openai(native)
    assert conversation().fold().render("anthropic") == to_anthropic(native)
    with pytest.raises(UnknownFormat, match="unknown context format 'gemini'"):
        render(native, "gemini")


def test_ultravox_initial_messages() -> None:
    native = conversation().native()
    voice = "MESSAGE_MEDIUM_VOICE"
    assert render(native, "ultravox") == [
        {"role": "MESSAGE_ROLE_AGENT", "text": "Hi, how can I help?", "medium": voice},
        {"role": "MESSAGE_ROLE_USER", "text": "a table for two", "medium": voice},
        {"role": "MESSAGE_ROLE_AGENT", "text": "Let me check. ", "medium": voice},
        {"role": "MESSAGE_ROLE_TOOL_CALL", "text": '{"people":2}', "toolName": "availability", "invocationId": "c1"},
        {"role": "MESSAGE_ROLE_TOOL_CALL", "text": "[1, 2]", "toolName": "weather", "invocationId": "c2"},
        {
            "role": "MESSAGE_ROLE_TOOL_RESULT",
            "text": '{"slots":["19:00"]}',
            "invocationId": "c1",
            "toolName": "availability",
        },
        {
            "role": "MESSAGE_ROLE_TOOL_RESULT",
            "text": '{"status":"timeout"}',
            "invocationId": "c2",
            "toolName": "weather",
        },
        {"role": "MESSAGE_ROLE_AGENT", "text": "Bob here: 19:00 works.", "medium": voice},
        {"role": "MESSAGE_ROLE_USER", "text": "great", "medium": voice},
    ]
