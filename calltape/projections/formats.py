"""Provider formats, each derived from the ``native`` context (one source of truth).

Every function takes the dict :meth:`ContextFold.native` returns, so the runtime can format a resume
plan's context the same way. Decisions beyond SPEC section 2:

* An empty system prompt is omitted (OpenAI: no system message; Anthropic: no ``system`` key;
  Realtime never carries it: instructions belong in ``session.update``, and a system item there
  would double them).
* Tool output content is the output verbatim when it is a string, else its compact JSON.
* **anthropic**: consecutive same-role messages are merged into one content-block list (handoff
  items vanish and can leave two assistant turns in a row). Text blocks are stripped and a blank
  one is dropped (the API rejects whitespace-only text blocks). ``tool_use.input`` is the parsed
  arguments object; arguments that are not a JSON object are wrapped as ``{"arguments": value}``.
  ``tool_result`` blocks carry ``is_error: true`` for ``error``, ``timeout``, ``unknown`` and
  ``cancelled`` outputs (the call did not deliver), never for ``in_progress``. A leading assistant
  turn (the agent's greeting) is kept as is: the Messages API documents alternating turns and
  combines consecutive ones, it does not require a user turn first; inventing user text would put
  words in the caller's mouth. An empty context gives ``messages: []``: the caller adds the turn
  it is about to send.
* **ultravox**: Ultravox's ``initialMessages`` for a new call (``POST /api/calls``): user and agent
  text as ``MESSAGE_ROLE_USER`` / ``MESSAGE_ROLE_AGENT`` (voice medium), each call as
  ``MESSAGE_ROLE_TOOL_CALL`` (``text``: the arguments) and its output as ``MESSAGE_ROLE_TOOL_RESULT``
  under the same ``invocationId``. The system prompt is the call's ``systemPrompt``, not a message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal

import orjson

from calltape.canonical_json import json_text
from calltape.errors import UnknownFormat

Native = dict[str, Any]

_FAILED: Final = frozenset({"error", "timeout", "unknown", "cancelled"})


def output_text(output: Any) -> str:
    """Tool output as the string the provider APIs want."""
    return json_text(output)


def _input_object(arguments: str) -> dict[str, Any]:
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def _groups(native: Native) -> list[tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]]:
    """Assistant turns regrouped as (message or {}, calls, outputs); user/system as (msg, [], [])."""
    groups: list[tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]] = []
    open_turn = False
    for item in native["items"]:
        kind = item["type"]
        if kind == "message":
            groups.append((item, [], []))
            open_turn = item["role"] == "assistant"
        elif kind == "function_call":
            if not open_turn:
                groups.append(({}, [], []))
                open_turn = True
            groups[-1][1].append(item)
        elif kind == "function_call_output":
            groups[-1][2].append(item)
            open_turn = False
        else:
            open_turn = False
    return groups


def to_openai(native: Native) -> list[dict[str, Any]]:
    """Chat Completions ``messages``."""
    out: list[dict[str, Any]] = []
    for msg, calls, outputs in _groups(native):
        role = msg.get("role", "assistant")
        if role == "system":
            if msg["content"]:
                out.append({"role": "system", "content": msg["content"]})
        elif role == "user":
            out.append({"role": "user", "content": msg["content"]})
        else:
            assistant: dict[str, Any] = {"role": "assistant", "content": msg.get("content")}
            if calls:
                assistant["tool_calls"] = [
                    {
                        "id": c["call_id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls
                ]
            out.append(assistant)
            out.extend(
                {"role": "tool", "tool_call_id": o["call_id"], "content": output_text(o["output"])} for o in outputs
            )
    return out


def to_anthropic(native: Native) -> dict[str, Any]:
    """Messages API request fields: ``system`` (omitted when empty) and ``messages``."""
    body: dict[str, Any] = {}
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for msg, calls, outputs in _groups(native):
        role = msg.get("role", "assistant")
        if role == "system":
            if msg["content"]:
                body["system"] = msg["content"]
            continue
        blocks: list[dict[str, Any]] = []
        text = (msg.get("content") or "").strip()
        if text:
            blocks.append({"type": "text", "text": text})
        for c in calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": c["call_id"],
                    "name": c["name"],
                    "input": _input_object(c["arguments"]),
                }
            )
        add(role, blocks)
        results: list[dict[str, Any]] = []
        for o in outputs:
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": o["call_id"],
                "content": output_text(o["output"]),
            }
            if o["status"] in _FAILED:
                block["is_error"] = True
            results.append(block)
        add("user", results)
    body["messages"] = messages
    return body


def to_realtime(native: Native) -> list[dict[str, Any]]:
    """OpenAI Realtime ``conversation.item.create`` client events that seed a new session."""
    events: list[dict[str, Any]] = []

    def create(item: dict[str, Any]) -> None:
        events.append({"type": "conversation.item.create", "item": item})

    for item in native["items"]:
        kind = item["type"]
        if kind == "message":
            if item["role"] == "user":
                create(
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": item["content"]}],
                    }
                )
            elif item["role"] == "assistant":
                create(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": item["content"]}],
                    }
                )
        elif kind == "function_call":
            create(
                {
                    "type": "function_call",
                    "call_id": item["call_id"],
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            )
        elif kind == "function_call_output":
            create(
                {
                    "type": "function_call_output",
                    "call_id": item["call_id"],
                    "output": output_text(item["output"]),
                }
            )
    return events


_ULTRAVOX_ROLES: Final = {"user": "MESSAGE_ROLE_USER", "assistant": "MESSAGE_ROLE_AGENT"}


def to_ultravox(native: Native) -> list[dict[str, Any]]:
    """Ultravox ``initialMessages`` that seed a new call with this context."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for item in native["items"]:
        kind = item["type"]
        if kind == "message" and item["role"] in _ULTRAVOX_ROLES and item["content"]:
            out.append(
                {"role": _ULTRAVOX_ROLES[item["role"]], "text": item["content"], "medium": "MESSAGE_MEDIUM_VOICE"}
            )
        elif kind == "function_call":
            names[item["call_id"]] = item["name"]
            out.append(
                {
                    "role": "MESSAGE_ROLE_TOOL_CALL",
                    "text": item["arguments"],
                    "toolName": item["name"],
                    "invocationId": item["call_id"],
                }
            )
        elif kind == "function_call_output":
            call_id = item["call_id"]
            message = {"role": "MESSAGE_ROLE_TOOL_RESULT", "text": output_text(item["output"]), "invocationId": call_id}
            if call_id in names:
                message["toolName"] = names[call_id]
            out.append(message)
    return out


ContextFormat = Literal["native", "openai", "anthropic", "realtime", "ultravox"]
"""The names :func:`render` accepts (a test keeps this in step with :data:`FORMATS`)."""

FORMATS: Final[dict[str, Callable[[Native], Any]]] = {
    "native": lambda native: native,
    "openai": to_openai,
    "anthropic": to_anthropic,
    "realtime": to_realtime,
    "ultravox": to_ultravox,
}


def render(native: Native, format: ContextFormat | str = "native") -> Any:
    """The context in ``format`` (one of :data:`FORMATS`)."""
    convert = FORMATS.get(format)
    if convert is None:
        raise UnknownFormat(f"unknown context format '{format}' (use one of: {', '.join(FORMATS)})")
    return convert(native)
