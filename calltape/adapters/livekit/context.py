"""LiveKit ``ChatContext`` from a calltape context, and the agent's instructions as calltape records them.

A plain ``Agent(chat_ctx=...)`` copies the context with ``tools=self._tools`` and silently drops every
function call and output of a tool the new agent does not have; :func:`rehydrate` seeds it without
that filter.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any, cast

from livekit.agents import Agent, AgentSession, llm

__all__ = ["instructions_of", "rehydrate", "to_chat_ctx"]


def instructions_of(agent: Agent, session: AgentSession[Any] | None = None) -> str | None:
    """The agent's instructions as its LLM gets them: a plain string, or an ``Instructions`` object
    rendered for the session's modality (``audio`` when the session has an audio output)."""
    instructions: Any = agent.instructions
    if isinstance(instructions, str):
        return instructions
    render = getattr(instructions, "render", None)
    if not callable(render):
        return None
    modality = "audio" if session is not None and session.output.audio is not None else "text"
    try:
        return str(render(modality=modality))
    except TypeError:  # an Instructions without modalities
        return str(render())


def _items_of(context: Any) -> Iterable[Mapping[str, Any]]:
    if isinstance(context, Mapping):
        items = context.get("items", context.get("context"))
        if items is None:
            raise TypeError("expected a calltape native context (a dict with 'items') or its item list")
        return cast(Iterable[Mapping[str, Any]], items)
    plan_context = getattr(context, "context", None)
    if plan_context is not None:  # a ResumePlan: its context is a native dict (or its item list)
        return _items_of(plan_context if isinstance(plan_context, Mapping) else {"items": plan_context})
    return cast(Iterable[Mapping[str, Any]], context)


def to_chat_ctx(context: Any, *, include_instructions: bool = False) -> llm.ChatContext:
    """A LiveKit ``ChatContext`` from a calltape ``native`` context (dict, item list or resume plan).

    Every function call keeps its output (synthetic ``{"status": ...}`` JSON for calls that did not
    complete), so the provider never sees a dangling call. The system item is left out by default:
    the new agent brings its own instructions.
    """
    items = list(_items_of(context))
    base = time.time() - 0.001 * (len(items) + 1)
    names: dict[str, str] = {}
    out: list[llm.ChatItem] = []
    group: str | None = None  # the assistant message the following calls belong to
    for i, item in enumerate(items):
        at = base + 0.001 * i
        kind = item.get("type")
        if kind == "message":
            role = item.get("role")
            if role == "system" and not include_instructions:
                continue
            if role not in ("system", "user", "assistant", "developer"):
                continue
            msg = llm.ChatMessage(
                role=role,
                content=[str(item.get("content") or "")],
                interrupted=bool(item.get("interrupted", False)),
                created_at=at,
            )
            group = msg.id if role == "assistant" else None
            out.append(msg)
        elif kind == "function_call":
            call_id, name = str(item["call_id"]), str(item["name"])
            names[call_id] = name
            arguments = item.get("arguments", "{}")
            fc = llm.FunctionCall(
                call_id=call_id,
                name=name,
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
                created_at=at,
            )
            # LiveKit groups a reply's text and calls into one provider message by id prefix
            fc.group_id = group = group or fc.id
            out.append(fc)
        elif kind == "function_call_output":
            group = None  # a call after an output starts another reply
            call_id = str(item["call_id"])
            output = item.get("output")
            out.append(
                llm.FunctionCallOutput(
                    call_id=call_id,
                    name=names.get(call_id, ""),
                    output=output if isinstance(output, str) else json.dumps(output),
                    is_error=item.get("status") == "error",
                    created_at=at,
                )
            )
        elif kind == "handoff":
            group = None
            out.append(llm.AgentHandoff(old_agent_id=item.get("from"), new_agent_id=str(item["to"]), created_at=at))
    return llm.ChatContext(out)


async def rehydrate(agent: Agent, context: Any) -> Agent:
    """Seeds ``agent``'s chat context from a calltape context, keeping calls of tools it lacks.

    Uses ``update_chat_ctx(..., exclude_invalid_function_calls=False)``: the public way around the
    tool filter that ``Agent(chat_ctx=...)`` applies.
    """
    await agent.update_chat_ctx(to_chat_ctx(context), exclude_invalid_function_calls=False)
    return agent
