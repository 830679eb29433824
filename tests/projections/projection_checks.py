"""Invariants every context must satisfy, checked against the official SDK types."""

from __future__ import annotations

import itertools
from typing import Any

from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam
from openai.types.realtime import ConversationItemCreateEvent
from pydantic import TypeAdapter

from calltape.projections import to_anthropic, to_openai, to_realtime

_OPENAI = TypeAdapter(list[ChatCompletionMessageParam])
_ANTHROPIC = TypeAdapter(list[MessageParam])

_OPENAI_KEYS = {
    "system": {"role", "content"},
    "user": {"role", "content"},
    "assistant": {"role", "content", "tool_calls"},
    "tool": {"role", "tool_call_id", "content"},
}
_BLOCK_KEYS = {
    "text": {"type", "text"},
    "tool_use": {"type", "id", "name", "input"},
    "tool_result": {"type", "tool_use_id", "content", "is_error"},
}


def check_native(native: dict[str, Any]) -> None:
    items = native["items"]
    assert items[0]["type"] == "message" and items[0]["role"] == "system"
    assert all(not (i["type"] == "message" and i["role"] == "system") for i in items[1:])
    i = 1
    seen_calls: set[str] = set()
    while i < len(items):
        item = items[i]
        if (item["type"] == "message" and item["role"] == "assistant") or item["type"] == "function_call":
            if item["type"] == "message":
                assert item["content"].strip(), "rule 6: empty assistant message"
                i += 1
            calls = []
            while i < len(items) and items[i]["type"] == "function_call":
                calls.append(items[i]["call_id"])
                i += 1
            outputs = []
            while i < len(items) and items[i]["type"] == "function_call_output":
                outputs.append(items[i]["call_id"])
                i += 1
            assert outputs == calls, "every included call has exactly one output right after its message"
            assert not seen_calls & set(calls)
            seen_calls |= set(calls)
            continue
        assert item["type"] != "function_call_output", "an output away from its message"
        if item["type"] == "message":
            assert item["role"] == "user" and item["content"] and "interrupted" not in item
            assert item["content"] == " ".join(item["content"].split())
        i += 1
    in_progress = [o for o in items if o["type"] == "function_call_output" and o["status"] == "in_progress"]
    assert [p["call_id"] for p in native["pending"]["tools"]] == [o["call_id"] for o in in_progress]
    assert native["last_clean_seq"] <= native["seq"]
    if native["clean"]:
        assert not in_progress and native["pending"]["user_text"] is None
        assert native["last_clean_seq"] == native["seq"]


def check_openai(messages: list[dict[str, Any]]) -> None:
    _OPENAI.validate_python(messages)
    for m in messages:
        assert set(m) <= _OPENAI_KEYS[m["role"]], m
        if m["role"] == "assistant":
            assert m["content"] is not None or m.get("tool_calls")
        if m["role"] == "tool":
            assert isinstance(m["content"], str)
    i = 0
    while i < len(messages):
        m = messages[i]
        i += 1
        if m["role"] == "tool":
            raise AssertionError("a tool message that does not answer the assistant message before it")
        if m["role"] == "assistant" and m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            answered = []
            while i < len(messages) and messages[i]["role"] == "tool":
                answered.append(messages[i]["tool_call_id"])
                i += 1
            assert sorted(answered) == sorted(ids) and len(set(answered)) == len(answered)


def check_anthropic(body: dict[str, Any]) -> None:
    assert set(body) <= {"system", "messages"}
    if "system" in body:
        assert isinstance(body["system"], str) and body["system"]
    messages = body["messages"]
    _ANTHROPIC.validate_python(messages)
    for a, b in itertools.pairwise(messages):
        assert a["role"] != b["role"], "strict alternation"
    pending: list[str] = []
    for m in messages:
        blocks = m["content"]
        assert blocks
        for block in blocks:
            assert set(block) <= _BLOCK_KEYS[block["type"]]
            if block["type"] == "text":
                assert block["text"].strip() == block["text"] and block["text"]
        if m["role"] == "user":
            results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            assert sorted(results) == sorted(pending), "tool_result blocks answer the previous tool_use"
            kinds = [b["type"] for b in blocks]
            assert kinds == sorted(kinds, key=lambda k: k != "tool_result"), "tool_result blocks come first"
            pending = []
        else:
            assert not pending
            assert all(b["type"] in ("text", "tool_use") for b in blocks)
            pending = [b["id"] for b in blocks if b["type"] == "tool_use"]
            assert all(isinstance(b["input"], dict) for b in blocks if b["type"] == "tool_use")
    assert not pending, "every tool_use is answered (outputs are always present)"


def check_realtime(events: list[dict[str, Any]]) -> None:
    for event in events:
        ConversationItemCreateEvent.model_validate(event)
        item = event["item"]
        if item["type"] == "message":
            assert item["role"] in ("user", "assistant")
            (part,) = item["content"]
            assert part["type"] == ("input_text" if item["role"] == "user" else "output_text")
        elif item["type"] == "function_call_output":
            assert isinstance(item["output"], str)


def check_all(native: dict[str, Any]) -> None:
    check_native(native)
    check_openai(to_openai(native))
    check_anthropic(to_anthropic(native))
    check_realtime(to_realtime(native))
