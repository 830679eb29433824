"""Offline building blocks for tests that run a real LiveKit ``AgentSession``.

:class:`ScriptedLLM` subclasses the real ``llm.LLM`` / ``llm.LLMStream``: each ``chat()`` answers with
the next :class:`Step` (text chunks, then or before tool calls), so tool execution, interruption,
the speech queue and the chat context are LiveKit's own. ``session.run()``/``generate_reply()`` work
with no room, no server and no keys (text output only). Every chat context the LLM received is kept
in ``seen``, so a test can check what the model was actually given.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from livekit.agents import llm
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, APIConnectOptions, NotGivenOr

from calltape.events import Event, make_event
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.runtime import CallSession, ToolSpec


@dataclass
class Step:
    text: str = ""
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    """(call_id, name, arguments)"""
    calls_first: bool = False
    word_delay: float = 0.0


class ScriptedLLM(llm.LLM[Any]):
    def __init__(self, steps: list[Step]) -> None:
        super().__init__()
        self.steps = list(steps)
        self.seen: list[llm.ChatContext] = []

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: NotGivenOr[bool] = NOT_GIVEN,
        tool_choice: NotGivenOr[llm.ToolChoice] = NOT_GIVEN,
        extra_kwargs: NotGivenOr[dict[str, Any]] = NOT_GIVEN,
    ) -> llm.LLMStream:
        self.seen.append(chat_ctx.copy())
        step = self.steps.pop(0) if self.steps else Step()
        return _ScriptedStream(self, step, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


class _ScriptedStream(llm.LLMStream):
    def __init__(self, owner: ScriptedLLM, step: Step, **kwargs: Any) -> None:
        super().__init__(owner, **kwargs)
        self._step = step

    async def _run(self) -> None:
        rid = f"resp_{id(self):x}"
        if self._step.calls_first:
            self._send_calls(rid)
        for word in self._step.text.split(" ") if self._step.text else []:
            if self._step.word_delay:
                await asyncio.sleep(self._step.word_delay)
            self._event_ch.send_nowait(
                llm.ChatChunk(id=rid, delta=llm.ChoiceDelta(role="assistant", content=word + " "))
            )
        if not self._step.calls_first:
            self._send_calls(rid)

    def _send_calls(self, rid: str) -> None:
        if not self._step.calls:
            return
        calls = [
            llm.FunctionToolCall(name=name, arguments=json.dumps(args), call_id=cid)
            for cid, name, args in self._step.calls
        ]
        self._event_ch.send_nowait(llm.ChatChunk(id=rid, delta=llm.ChoiceDelta(role="assistant", tool_calls=calls)))


class Sink:
    """A bare ``emit(type, data) -> Event`` recorder, for the pure mapping tests only."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, type: str, data: Any) -> Event:
        self.events.append((type, dict(data)))
        return make_event("sink", type, data)

    def types(self) -> list[str]:
        return [t for t, _ in self.events]

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [d for t, d in self.events if t == type_]


async def start_call(
    store: EventStore,
    session_id: str,
    *,
    agent: str,
    instructions: str = "",
    modality: str = "text",
    tools: dict[str, ToolSpec] | None = None,
) -> tuple[Recorder, CallSession]:
    recorder = Recorder(store)
    await recorder.start()
    call = await CallSession.start(
        recorder,
        session_id,
        agent=agent,
        instructions=instructions,
        modality=modality,
        framework="livekit",
        tools=tools,
    )
    return recorder, call


def items(chat_ctx: llm.ChatContext) -> list[tuple[str, str]]:
    """A chat context as (kind, text) pairs, leaving out config updates."""
    out: list[tuple[str, str]] = []
    for item in chat_ctx.items:
        if isinstance(item, llm.ChatMessage):
            out.append((item.role, item.text_content or ""))
        elif isinstance(item, llm.FunctionCall):
            out.append(("function_call", item.call_id))
        elif isinstance(item, llm.FunctionCallOutput):
            out.append(("function_call_output", f"{item.call_id}={item.output}"))
    return out
