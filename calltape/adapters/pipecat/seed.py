"""Seeding a new pipeline (resume or handoff) with calltape's settled context."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pipecat.processors.aggregators.llm_context import LLMContext

from calltape.runtime.protocol import LiveCall


def context_messages(source: LiveCall | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of a new ``LLMContext``: calltape's ``openai`` context, settled.

    ``source`` is a :class:`~calltape.runtime.LiveCall` (a ``CallSession``, e.g. attached after ``resume``) or an
    already projected ``openai`` messages list (e.g. a resume plan's context in that format). Each tool
    call keeps exactly one output, so a new pipeline never inherits an ``IN_PROGRESS`` placeholder.
    """
    messages = source.context("openai") if isinstance(source, LiveCall) else source
    out: list[dict[str, Any]] = []
    for message in messages:
        item = dict(message)
        if item.get("role") == "assistant" and item.get("tool_calls"):
            item["tool_calls"] = [dict(tc) for tc in item["tool_calls"]]
        out.append(item)
    return out


def seed_llm_context(
    source: LiveCall | Iterable[Mapping[str, Any]],
    *,
    tools: Any = None,
    tool_choice: Any = None,
) -> LLMContext:
    """A new ``LLMContext`` holding calltape's settled context (resume or handoff into a new pipeline)."""
    kwargs: dict[str, Any] = {}
    if tools is not None:
        kwargs["tools"] = tools
    if tool_choice is not None:
        kwargs["tool_choice"] = tool_choice
    messages: list[Any] = context_messages(source)
    return LLMContext(messages=messages, **kwargs)
