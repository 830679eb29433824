"""Messages an app injects into Pipecat's context (``LLMMessagesAppendFrame`` / ``UpdateFrame`` /
``TransformFrame``), recorded so calltape's context holds them too.

How each OpenAI-shaped message maps onto the log:

* ``user`` — ``user.text`` (typed/API input, final at once).
* ``assistant`` — a reply of its own, done and (in a voice session) heard in full: it is in the
  context as written; its ``tool_calls`` become ``tool.call`` events of that reply.
* ``tool`` — ``tool.result`` of its call.
* ``system`` / ``developer`` — the log has one system prompt per agent (``agent.instructions``), so an
  appended system message is added to the instructions (the one documented difference from
  Pipecat's context: calltape shows it in the first, system message, not at its position).

An update or a transform gives the whole new list: it is compared with calltape's current context
and only what it adds is recorded. A new system prompt becomes ``agent.instructions``. A list that
rewrites history (drops or edits earlier turns) cannot be expressed in an append-only log: calltape
keeps the history, records the messages the rewrite adds, and ``x.pipecat.context_rewritten`` says
how many earlier items the app replaced.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from calltape.adapters.replies import ReplyTracker
from calltape.projections import render

REWRITTEN_EVENT = "x.pipecat.context_rewritten"


def message_text(content: Any) -> str:
    """The text of an OpenAI message ``content`` (a string, or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        return " ".join(p for p in parts if p)
    return ""


class MessageRecorder:
    """Writes injected messages through the call's :class:`ReplyTracker`."""

    def __init__(self, replies: ReplyTracker) -> None:
        self.replies = replies

    @property
    def fold(self) -> Any:
        """The live fold (held events included) the mapping reads."""
        return self.replies.view()

    def current(self) -> list[dict[str, Any]]:
        """calltape's context now, as OpenAI messages (what a transform is applied to)."""
        messages: list[dict[str, Any]] = render(self.fold.native(), "openai")
        return messages

    def append(self, messages: Iterable[Any]) -> None:
        """``LLMMessagesAppendFrame``: every message is new."""
        for message in messages:
            if isinstance(message, Mapping):
                self._record(message)

    def update(self, messages: Sequence[Any]) -> None:
        """``LLMMessagesUpdateFrame``: the whole new list."""
        new = [dict(m) for m in messages if isinstance(m, Mapping)]
        self._replace(new)

    def transform(self, transform: Callable[[list[Any]], list[Any]]) -> None:
        """``LLMMessagesTransformFrame``: the app's function applied to calltape's own context."""
        self._replace([dict(m) for m in transform(copy.deepcopy(self.current())) if isinstance(m, Mapping)])

    # -- mapping ------------------------------------------------------------------------------

    def _replace(self, new: list[dict[str, Any]]) -> None:
        system: list[str] = []
        while new and new[0].get("role") in ("system", "developer"):
            system.append(message_text(new.pop(0).get("content")))
        instructions = "\n\n".join(s for s in system if s)
        if system and instructions != (self.fold.instructions or ""):
            self.replies.emit("agent.instructions", {"text": instructions})
        current = [m for m in self.current() if m.get("role") != "system"]
        kept = 0
        while kept < min(len(current), len(new)) and _same(current[kept], new[kept]):
            kept += 1
        tail = new[kept:]
        if kept < len(current):
            self.replies.emit(REWRITTEN_EVENT, {"replaced": len(current) - kept, "kept": kept})
            # Only what the rewrite really adds: messages calltape already holds stay where they are.
            tail = [m for m in tail if not any(_same(m, c) for c in current[kept:])]
        for message in tail:
            self._record(message)

    def _record(self, message: Mapping[str, Any]) -> None:
        role = message.get("role")
        text = message_text(message.get("content"))
        if role == "user":
            if text.strip():
                self.replies.emit("user.text", {"text": text})
        elif role == "assistant":
            self._assistant(text, message.get("tool_calls") or ())
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if call_id and self.fold.tool_call(call_id) is not None:
                self.replies.emit("tool.result", {"call": call_id, "output": _output(message.get("content"))})
        elif role in ("system", "developer") and text.strip():
            current = self.fold.instructions or ""
            self.replies.emit("agent.instructions", {"text": f"{current}\n\n{text}" if current else text})

    def _assistant(self, text: str, tool_calls: Iterable[Any]) -> None:
        rid = self.replies.begin()
        self.replies.text(rid, text)
        for tc in tool_calls:
            if not isinstance(tc, Mapping):
                continue
            function = tc.get("function") or {}
            self.replies.emit(
                "tool.call",
                {
                    "call": tc.get("id"),
                    "name": function.get("name", ""),
                    "arguments": function.get("arguments") or "{}",
                    "reply": rid,
                },
            )
        self.replies.done(rid)
        if text and self.fold.modality == "voice":
            # Written into the context as is: that is what the agent "said" as far as the LLM knows.
            self.replies.speech_started(rid)
            self.replies.speech_ended(rid, interrupted=False, heard=text)


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if a.get("role") != b.get("role"):
        return False
    if message_text(a.get("content")) != message_text(b.get("content")):
        return False
    if a.get("role") == "tool":
        return bool(a.get("tool_call_id") == b.get("tool_call_id"))
    ids_a = [tc.get("id") for tc in a.get("tool_calls") or ()]
    ids_b = [tc.get("id") for tc in b.get("tool_calls") or ()]
    return ids_a == ids_b


def _output(content: Any) -> Any:
    import orjson

    if isinstance(content, str):
        try:
            return orjson.loads(content)
        except orjson.JSONDecodeError:
            return content
    return content
