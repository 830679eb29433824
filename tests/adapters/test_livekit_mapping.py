"""Event mapping of the LiveKit tap on a real ``AgentSession`` (scripted LLM, no store)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession, RunContext, function_tool, llm
from livekit.agents.voice.events import UserInputTranscribedEvent

from calltape.adapters.livekit import attach, rehydrate, to_chat_ctx
from tests.adapters.livekit_support import ScriptedLLM, Sink, Step

pytestmark = pytest.mark.livekit


class Booker(Agent):
    def __init__(self) -> None:
        super().__init__(instructions="You book tables.")

    @function_tool
    async def book(self, ctx: RunContext[Any], when: str) -> str:
        """Books a table."""
        await asyncio.sleep(0.05)
        return f"booked {when}"


async def test_tool_turn_maps_to_two_replies_in_context_order() -> None:
    llm_ = ScriptedLLM([Step("Let me book that.", [("call_1", "book", {"when": "7pm"})]), Step("Booked.")])
    session: AgentSession[Any] = AgentSession(llm=llm_)
    sink = Sink()
    tap = attach(session, sink)
    await session.start(Booker())
    await session.run(user_input="book at 7")
    await session.aclose()
    await tap.drain()

    types = sink.types()
    first, second = (d["reply"] for d in sink.of("agent.reply.started"))
    assert first.endswith("_1") and second.endswith("_2") and first[:-2] == second[:-2]
    # the reply is opened before its tool call and its text, though LiveKit adds the message last
    assert types.index("user.text") < types.index("agent.reply.started") < types.index("tool.call")
    assert sink.of("tool.call") == [{"call": "call_1", "name": "book", "arguments": '{"when": "7pm"}', "reply": first}]
    assert sink.of("tool.started") == [{"call": "call_1"}]
    assert sink.of("tool.result") == [{"call": "call_1", "output": "booked 7pm"}]
    assert [d["text"] for d in sink.of("agent.text")] == ["Let me book that. ", "Booked. "]
    ended = sink.of("agent.speech.ended")
    assert ended == [
        {"reply": first, "interrupted": False, "heard": "Let me book that. "},
        {"reply": second, "interrupted": False, "heard": "Booked. "},
    ]
    assert [d["reply"] for d in sink.of("agent.reply.done")] == [first, second]
    assert types[-1] == "session.ended"


async def test_voice_events_and_committed_turn_are_not_doubled() -> None:
    session: AgentSession[Any] = AgentSession(llm=ScriptedLLM([Step("Hi there.")]))
    sink = Sink()
    tap = attach(session, sink)
    await session.start(Agent(instructions="hi"))
    # what AudioRecognition calls on VAD edges and STT results
    session._update_user_state("speaking")
    session._user_input_transcribed(UserInputTranscribedEvent(transcript="hel", is_final=False))
    session._user_input_transcribed(UserInputTranscribedEvent(transcript="hello", is_final=True))
    session._update_user_state("listening")
    # the committed user turn repeats the final transcript: it must not be recorded twice
    await session.generate_reply(user_input="hello")
    await session.aclose()
    await tap.drain()

    assert sink.of("user.speech.started") == [{"source": "vad"}]
    assert sink.of("user.speech.stopped") == [{}]
    # STT results are pending user text; the turn is recorded once, when LiveKit commits it
    assert sink.of("user.transcript") == [
        {"text": "hel", "final": False},
        {"text": "hello", "final": False},
        {"text": "hello", "final": True},
    ]
    assert sink.of("user.text") == []
    assert sink.types().index("user.speech.stopped") < sink.types().index("agent.reply.started")


def test_to_chat_ctx_keeps_every_call_with_an_output() -> None:
    native = {
        "items": [
            {"type": "message", "role": "system", "content": "old prompt"},
            {"type": "message", "role": "user", "content": "book at 7"},
            {"type": "message", "role": "assistant", "content": "Let me", "interrupted": True},
            {"type": "function_call", "call_id": "c1", "name": "book", "arguments": '{"when": "7pm"}'},
            {"type": "function_call_output", "call_id": "c1", "output": {"status": "unknown"}, "status": "unknown"},
            {"type": "handoff", "from": "triage", "to": "billing"},
        ]
    }
    ctx = to_chat_ctx(native)
    kinds = [item.type for item in ctx.items]
    assert kinds == ["message", "message", "function_call", "function_call_output", "agent_handoff"]
    assistant = ctx.items[1]
    assert isinstance(assistant, llm.ChatMessage) and assistant.interrupted
    output = ctx.items[3]
    assert isinstance(output, llm.FunctionCallOutput)
    assert output.name == "book" and output.output == '{"status": "unknown"}' and not output.is_error
    created = [item.created_at for item in ctx.items]
    assert created == sorted(created)
    messages, _ = ctx.to_provider_format("openai")
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]


async def test_agent_chat_ctx_drops_foreign_calls_and_rehydrate_keeps_them() -> None:
    native = [
        {"type": "message", "role": "user", "content": "order 42?"},
        {"type": "function_call", "call_id": "c1", "name": "lookup_order", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "shipped", "status": "completed"},
    ]
    plain = Agent(instructions="billing", chat_ctx=to_chat_ctx(native))  # upstream: drops them
    assert [item.type for item in plain.chat_ctx.items] == ["message"]
    seeded = await rehydrate(Agent(instructions="billing"), native)
    assert [item.type for item in seeded.chat_ctx.items] == ["message", "function_call", "function_call_output"]
