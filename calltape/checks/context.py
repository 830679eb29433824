"""The section 2 invariants a context must keep, whatever happened in the call.

``calltape.testing.assert_invariants`` runs these on top of the section 7 rules: every included call
has exactly one output right after its assistant message, and the provider formats are requests the
providers accept (roles, tool-call answering, strict alternation). Structural checks only, so the
package does not need the providers' SDKs.
"""

from __future__ import annotations

from typing import Any

from calltape.projections.formats import to_anthropic, to_openai, to_realtime, to_ultravox


def native_problems(native: dict[str, Any]) -> list[str]:
    """What is wrong with a ``native`` context (empty when it keeps every invariant)."""
    problems: list[str] = []
    items = native.get("items") or []
    if not items or items[0].get("type") != "message" or items[0].get("role") != "system":
        problems.append("the context does not begin with its system message")
    seen: set[str] = set()
    i = 1
    while i < len(items):
        item = items[i]
        kind = item.get("type")
        if (kind == "message" and item.get("role") == "assistant") or kind == "function_call":
            if kind == "message":
                i += 1
            calls: list[str] = []
            while i < len(items) and items[i].get("type") == "function_call":
                calls.append(str(items[i].get("call_id")))
                i += 1
            outputs: list[str] = []
            while i < len(items) and items[i].get("type") == "function_call_output":
                outputs.append(str(items[i].get("call_id")))
                i += 1
            if outputs != calls:
                problems.append(
                    f"calls {calls} are not answered by exactly one output each right after their message "
                    f"(outputs: {outputs})"
                )
            repeated = seen.intersection(calls)
            if repeated:
                problems.append(f"calls {sorted(repeated)} appear twice in the context")
            seen.update(calls)
            continue
        if kind == "function_call_output":
            problems.append(f"the output of call [{item.get('call_id')}] is away from its assistant message")
        i += 1
    return problems


def openai_problems(messages: list[dict[str, Any]]) -> list[str]:
    """What the Chat Completions API would refuse in ``messages``."""
    problems: list[str] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        i += 1
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            problems.append(f"openai: unknown role {role!r}")
        if role == "tool":
            problems.append(f"openai: tool message [{m.get('tool_call_id')}] does not answer the message before it")
            continue
        if role == "assistant":
            if m.get("content") is None and not m.get("tool_calls"):
                problems.append("openai: an assistant message with neither content nor tool calls")
            ids = [c.get("id") for c in m.get("tool_calls") or []]
            answered: list[Any] = []
            while i < len(messages) and messages[i].get("role") == "tool":
                answered.append(messages[i].get("tool_call_id"))
                i += 1
            if sorted(answered) != sorted(ids) or len(set(answered)) != len(answered):
                problems.append(f"openai: tool calls {ids} are answered by {answered}")
        elif not isinstance(m.get("content"), str):
            problems.append(f"openai: a {role} message without string content")
    return problems


def anthropic_problems(body: dict[str, Any]) -> list[str]:
    """What the Messages API would refuse in the request body."""
    problems: list[str] = []
    messages = body.get("messages") or []
    pending: list[str] = []
    previous: str | None = None
    for m in messages:
        role = m.get("role")
        if role == previous:
            problems.append(f"anthropic: two {role} messages in a row (strict alternation)")
        previous = role
        blocks = m.get("content") or []
        if not blocks:
            problems.append(f"anthropic: an empty {role} message")
        if role == "user":
            results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
            if sorted(results) != sorted(pending):
                problems.append(f"anthropic: tool_use {pending} answered by tool_result {results}")
            pending = []
        else:
            if pending:
                problems.append(f"anthropic: tool_use {pending} left unanswered")
            pending = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
        for b in blocks:
            if b.get("type") == "text" and not str(b.get("text", "")).strip():
                problems.append("anthropic: a blank text block")
    if pending:
        problems.append(f"anthropic: tool_use {pending} left unanswered")
    return problems


def realtime_problems(events: list[dict[str, Any]]) -> list[str]:
    """What the Realtime API would refuse in the seeding ``conversation.item.create`` events."""
    problems: list[str] = []
    for event in events:
        item = event.get("item") or {}
        if event.get("type") != "conversation.item.create":
            problems.append("realtime: an event that is not conversation.item.create")
        if item.get("type") == "function_call_output" and not isinstance(item.get("output"), str):
            problems.append("realtime: a function_call_output whose output is not a string")
    return problems


def ultravox_problems(messages: list[dict[str, Any]]) -> list[str]:
    """What Ultravox would refuse in ``initialMessages``: a tool result without its call before it, or
    text that is not a string."""
    problems: list[str] = []
    calls: set[str] = set()
    for message in messages:
        if not isinstance(message.get("text"), str):
            problems.append("ultravox: a message whose text is not a string")
        if message.get("role") == "MESSAGE_ROLE_TOOL_CALL":
            calls.add(message.get("invocationId", ""))
        elif message.get("role") == "MESSAGE_ROLE_TOOL_RESULT" and message.get("invocationId") not in calls:
            problems.append("ultravox: a tool result before (or without) its tool call")
    return problems


def context_problems(native: dict[str, Any]) -> list[str]:
    """Every section 2 invariant of one context and of its provider formats."""
    problems = native_problems(native)
    try:
        problems += openai_problems(to_openai(native))
        problems += anthropic_problems(to_anthropic(native))
        problems += realtime_problems(to_realtime(native))
        problems += ultravox_problems(to_ultravox(native))
    except Exception as exc:  # a format that cannot even be built is the worst violation
        problems.append(f"a provider format could not be built ({type(exc).__name__})")
    return problems
