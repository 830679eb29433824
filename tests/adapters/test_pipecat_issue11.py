"""Issue 11 on a real Pipecat pipeline: each failure reproduced on the framework, then what calltape keeps.

Every test drives Pipecat's own machinery (aggregators, function-call runner, mute strategies, output
transport); only the LLM and TTS are scripted (no network).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("pipecat")

from pipecat.frames.frames import (
    InterimTranscriptionFrame,
    LLMMessagesAppendFrame,
    LLMMessagesTransformFrame,
    LLMMessagesUpdateFrame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pipecat.turns.user_mute import FunctionCallUserMuteStrategy
from pipecat.turns.user_start import MinWordsUserTurnStartStrategy
from pipecat_support import LIVE_BOTS, Call, Say, ScriptedLLM, VoiceBot, build_voice_bot, eventually

from calltape.adapters.pipecat import CalltapeObserver, guard, register_function
from calltape.errors import CalltapeError
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.runtime import CallSession, ToolSpec

pytestmark = pytest.mark.pipecat

SYSTEM = "You are a test bot."


@pytest.fixture
async def recorder(store: EventStore) -> AsyncIterator[Recorder]:
    rec = Recorder(store)
    await rec.start()
    try:
        yield rec
    finally:
        while LIVE_BOTS:
            await LIVE_BOTS.pop().stop()
        await rec.close()


@pytest.fixture
async def call(recorder: Recorder, session_id: str) -> CallSession:
    return await CallSession.start(recorder, session_id, agent="support", instructions=SYSTEM, framework="pipecat")


async def user_says(bot: VoiceBot, text: str) -> None:
    await bot.push(
        VADUserStartedSpeakingFrame(), TranscriptionFrame(text, "user", "now"), VADUserStoppedSpeakingFrame()
    )


async def barge_in(bot: VoiceBot, text: str = "wait") -> None:
    await bot.push(VADUserStartedSpeakingFrame(), InterimTranscriptionFrame(text, "user", "now"))


def tool_messages(messages: list[dict[str, Any]]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages if m.get("role") == "tool"}


def user_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m.get("role") == "user"]


async def logged(call: CallSession, store: EventStore, kind: str) -> list[dict[str, Any]]:
    await call.recorder.flush()
    return [e.data for e in await store.read(call.session_id) if e.type == kind]


# ---------------------------------------------------------------------------------------------
# Barge-in while the tool of a tool-only (or fully played preamble) generation runs


@pytest.mark.parametrize("preamble", [False, True], ids=["tool-only", "preamble-played"])
async def test_barge_in_while_the_tool_runs_cancels_a_cancel_policy_tool(
    preamble: bool, call: CallSession, store: EventStore
) -> None:
    turn: list[Any] = [Say("One moment.")] if preamble else []
    llm = ScriptedLLM([[*turn, Call("book", "c1", {"slot": "9am"})], [Say("Okay, I stopped.")]])
    entered, cancelled = asyncio.Event(), asyncio.Event()

    async def book(params: FunctionCallParams) -> None:
        entered.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        await params.result_callback({"booked": True})

    register_function(llm, call, "book", book, spec=ToolSpec(on_interrupt="cancel", timeout=8))
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call)])
    await bot.start()
    await user_says(bot, "book me at nine")
    await asyncio.wait_for(entered.wait(), 5)
    if preamble:
        await eventually(lambda: bool(call.fold.replies()) and call.fold.replies()[-1].speech_ended)
    await asyncio.sleep(0.1)
    await barge_in(bot, "no wait")

    # Pipecat cancels the call on the barge-in (cancel_on_interruption defaults to True) ...
    await eventually(lambda: not bot.assistant.has_function_calls_in_progress)
    # ... and calltape records the interruption, cancels the body, and says so.
    await asyncio.wait_for(cancelled.wait(), 2)
    await eventually(lambda: call.call_state("c1") is not None and call.call_state("c1").status != "in_progress")
    interruptions = await logged(call, store, "interruption")
    assert len(interruptions) == 1 and interruptions[0]["cause"] == "user_speech"
    cancels = await logged(call, store, "tool.cancelled")
    assert [(c["call"], c["reason"]) for c in cancels] == [("c1", "interrupted")]
    assert await logged(call, store, "tool.result") == []
    output = json.loads(tool_messages(call.context("openai"))["c1"])
    assert output["status"] in ("cancelled", "unknown")
    # The live context says the same.
    await eventually(lambda: json.loads(tool_messages(bot.messages())["c1"]) == output)
    await bot.cancel()


# ---------------------------------------------------------------------------------------------
# The live agent is reconciled: a finish-policy result after a barge-in reaches Pipecat's LLMContext


async def test_finish_policy_result_after_barge_in_reaches_the_live_context(call: CallSession) -> None:
    llm = ScriptedLLM([[Call("book", "c1", {"slot": "9am"})], [Say("Booked. Anything else?")]])
    entered, release = asyncio.Event(), asyncio.Event()

    async def book(params: FunctionCallParams) -> None:
        entered.set()
        await release.wait()
        await params.result_callback({"booked": True})

    register_function(llm, call, "book", book)  # on_interrupt="finish"
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call)])
    await bot.start()
    await user_says(bot, "book me at nine")
    await asyncio.wait_for(entered.wait(), 5)
    await barge_in(bot, "hello")
    await eventually(lambda: tool_messages(bot.messages()).get("c1") is not None)
    await asyncio.sleep(0.2)
    release.set()
    await eventually(lambda: call.call_state("c1") is not None and call.call_state("c1").status == "completed")
    assert json.loads(tool_messages(call.context("openai"))["c1"]) == {"booked": True}
    # The live LLMContext holds the one real output, not CANCELLED ...
    await eventually(lambda: tool_messages(bot.messages()).get("c1") == '{"booked": true}')
    # ... and the next inference sees it.
    await bot.push(VADUserStoppedSpeakingFrame(), TranscriptionFrame("is it booked", "user", "now"))
    await bot.push(VADUserStartedSpeakingFrame(), VADUserStoppedSpeakingFrame())
    await eventually(lambda: len(llm.received) == 2)
    assert tool_messages(llm.received[1]) == {"c1": '{"booked": true}'}
    assert sum(1 for m in llm.received[1] if m.get("role") == "tool") == 1
    await bot.cancel()


# ---------------------------------------------------------------------------------------------
# User speech Pipecat's mute strategies discard is not a calltape user turn


async def test_speech_muted_while_a_tool_runs_is_not_a_user_turn(call: CallSession, store: EventStore) -> None:
    llm = ScriptedLLM([[Call("lookup", "c1", {"q": "42"})], [Say("It shipped.")]])
    entered, release = asyncio.Event(), asyncio.Event()

    async def lookup(params: FunctionCallParams) -> None:
        entered.set()
        await release.wait()
        await params.result_callback({"status": "shipped"})

    register_function(llm, call, "lookup", lookup)
    bot = build_voice_bot(
        llm, observers=[CalltapeObserver(call)], user_mute_strategies=[FunctionCallUserMuteStrategy()]
    )
    await bot.start()
    await user_says(bot, "where is my order")
    await asyncio.wait_for(entered.wait(), 5)
    await asyncio.sleep(0.2)
    await user_says(bot, "Hello? Are you there?")
    await asyncio.sleep(0.3)
    release.set()
    await eventually(lambda: len(llm.received) == 2)
    await eventually(lambda: "It shipped." in [m.get("content") for m in call.context("openai")])

    # Pipecat dropped the muted speech: its context has one user turn.
    assert user_texts(bot.messages()) == ["where is my order"]
    assert user_texts(call.context("openai")) == user_texts(bot.messages())
    assert await logged(call, store, "interruption") == []
    muted = await logged(call, store, "x.pipecat.muted")
    assert [m["text"] for m in muted] == ["Hello? Are you there?"]
    await bot.cancel()


# ---------------------------------------------------------------------------------------------
# Messages injected with LLMMessagesAppendFrame / UpdateFrame / TransformFrame


async def test_appended_messages_are_recorded(call: CallSession) -> None:
    llm = ScriptedLLM([[Say("Hello, thanks for calling.")]])
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call)])
    await bot.start()
    await bot.push(LLMMessagesAppendFrame([{"role": "user", "content": "Please greet the caller."}], run_llm=True))
    await eventually(lambda: "Hello, thanks for calling." in [m.get("content") for m in call.context("openai")])
    await eventually(lambda: len(bot.messages()) == 3)
    assert call.context("openai") == bot.messages()
    await bot.cancel()


async def test_updated_and_transformed_messages_are_recorded(call: CallSession) -> None:
    llm = ScriptedLLM([[Say("Hi, I am Ada.")], [Say("Sure.")]])
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call)])
    await bot.start()
    new_system = {"role": "system", "content": "You are Ada, a support bot."}
    await bot.push(
        LLMMessagesUpdateFrame([new_system, {"role": "user", "content": "Introduce yourself."}], run_llm=True)
    )
    await eventually(lambda: "Hi, I am Ada." in [m.get("content") for m in call.context("openai")])
    await eventually(lambda: len(bot.messages()) == 3)
    assert call.context("openai") == bot.messages()

    def add_note(messages: list[Any]) -> list[Any]:
        return [*messages, {"role": "user", "content": "Keep it short."}]

    await bot.push(LLMMessagesTransformFrame(add_note, run_llm=True))
    await eventually(lambda: "Sure." in [m.get("content") for m in call.context("openai")])
    await eventually(lambda: len(bot.messages()) == 5)
    assert call.context("openai") == bot.messages()
    await bot.cancel()


# ---------------------------------------------------------------------------------------------
# Interruption cause when the VAD frame comes first


async def test_interruption_cause_is_user_speech_when_the_vad_edge_came_first(
    call: CallSession, store: EventStore
) -> None:
    # A transcript-based start strategy interrupts on the words, after the VAD edges are over.
    llm = ScriptedLLM([[Say("Your order shipped on Monday and it should arrive by Friday at the latest.")]])
    bot = build_voice_bot(
        llm,
        observers=[CalltapeObserver(call)],
        word_secs=0.1,
        user_turn_start=[MinWordsUserTurnStartStrategy(min_words=2)],
    )
    await bot.start()
    await user_says(bot, "where is my order")
    await eventually(lambda: bool(call.fold.replies()) and call.fold.replies()[-1].speech_started)
    await bot.push(VADUserStartedSpeakingFrame(), VADUserStoppedSpeakingFrame())
    await asyncio.sleep(0.1)
    await bot.push(TranscriptionFrame("no stop", "user", "now"))
    await eventually(lambda: bool(call.fold.replies()) and call.fold.replies()[-1].interrupted)
    assert [i["cause"] for i in await logged(call, store, "interruption")] == ["user_speech"]
    await bot.cancel()


# ---------------------------------------------------------------------------------------------
# Guarded tools: a drop-in of llm.register_function, and no silently unguarded tool


async def test_guard_makes_llm_register_function_guarded(call: CallSession) -> None:
    llm = ScriptedLLM([[Call("book", "c1", {"slot": "9am"})], [Call("book", "c1", {"slot": "9am"})], [Say("Done.")]])
    runs: list[str] = []

    async def book(params: FunctionCallParams) -> None:
        runs.append(params.tool_call_id)
        await params.result_callback({"booked": True})

    guard(llm, call)
    llm.register_function("book", book)  # Pipecat's own shape, now under calltape
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call)])
    await bot.start()
    await user_says(bot, "book me at nine")
    await eventually(lambda: len(llm.received) == 3)
    assert runs == ["c1"]  # the repeated call id was answered from the log
    state = call.call_state("c1")
    assert state is not None and state.started and state.status == "completed"
    await bot.cancel()


async def test_guard_refuses_a_tool_registered_before_it(call: CallSession) -> None:
    llm = ScriptedLLM([])

    async def book(params: FunctionCallParams) -> None:
        await params.result_callback({"booked": True})

    llm.register_function("book", book)
    with pytest.raises(CalltapeError, match="book"):
        guard(llm, call)


@pytest.mark.parametrize("way", ["context-tools", "service-tools", "register_direct_function"])
async def test_a_direct_function_runs_guarded_however_pipecat_registers_it(way: str, call: CallSession) -> None:
    # Pipecat registers the direct functions a context lists (or a service is configured with, as
    # the realtime services are) on its own, through a path that never reaches
    # llm.register_function; under guard() they run guarded all the same.
    runs: list[str] = []

    async def book(params: FunctionCallParams, slot: str) -> None:
        """Books a slot.

        Args:
            slot: The time to book.
        """
        runs.append(params.tool_call_id)
        await params.result_callback({"booked": slot})

    class ConfiguredLLM(ScriptedLLM):
        def _service_tools(self) -> list[Any]:
            return [book] if way == "service-tools" else []

    llm = ConfiguredLLM([[Call("book", "c1", {"slot": "9am"})], [Call("book", "c1", {"slot": "9am"})], [Say("Ok.")]])
    guard(llm, call)
    if way == "register_direct_function":
        llm.register_direct_function(book)  # deprecated in Pipecat, still a way to register a tool
    tools = [book] if way == "context-tools" else None
    bot = build_voice_bot(llm, tools=tools, observers=[CalltapeObserver(call)])
    await bot.start()
    await user_says(bot, "book me at nine")
    await eventually(lambda: len(llm.received) == 3)
    assert runs == ["c1"]  # the repeated call id was answered from the log, not run again
    state = call.call_state("c1")
    assert state is not None and state.started and state.status == "completed"
    assert state.output == {"booked": "9am"}
    await bot.cancel()


async def test_a_tool_registered_past_the_guard_is_named_in_an_error(
    call: CallSession, caplog: pytest.LogCaptureFixture
) -> None:
    async def book(params: FunctionCallParams) -> None:
        await params.result_callback({"booked": True})

    llm = ScriptedLLM([[Say("Hello.")], [Say("Hi.")]])
    guard(llm, call)
    LLMService.register_function(llm, "book", book)  # the class's own method: past the guard
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call)])
    with caplog.at_level(logging.ERROR, logger="calltape.adapters.pipecat"):
        await bot.start()
        await user_says(bot, "hello")
        await eventually(lambda: len(llm.received) == 1)
        await user_says(bot, "hello again")
        await eventually(lambda: len(llm.received) == 2)
    named = [r.getMessage() for r in caplog.records if "'book' runs unguarded" in r.getMessage()]
    assert len(named) == 1  # once, however many inferences
    await bot.cancel()
