"""Pipecat's own scenario families, rebuilt with calltape attached (our tests, written from reading theirs).

Each scenario runs on the installed Pipecat with ``pipecat.tests.utils.run_test`` (the aggregators
alone, as upstream tests them) or a full pipeline, and compares calltape's context with Pipecat's own
``LLMContext`` turn by turn. Where calltape differs on purpose, the test says so and asserts the
difference:

* Pipecat keeps an interrupted reply's full aggregated text in a text pipeline; so does calltape
  (``text`` modality, taken from the pipeline).
* A transform or update that rewrites history cannot be expressed in an append-only log: calltape
  records what was added and an ``x.pipecat.context_rewritten`` event.
* Tool placeholders: Pipecat's live context is reconciled to calltape's outputs (``.live``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("pipecat")

from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    FunctionCallCancelFrame,
    FunctionCallFromLLM,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    FunctionCallsStartedFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMMessagesAppendFrame,
    LLMMessagesTransformFrame,
    LLMMessagesUpdateFrame,
    LLMTextFrame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMAssistantAggregator,
    LLMUserAggregator,
    LLMUserAggregatorParams,
)
from pipecat.services.llm_service import FunctionCallParams
from pipecat.tests.utils import SleepFrame, run_test
from pipecat.turns.user_mute import FirstSpeechUserMuteStrategy, FunctionCallUserMuteStrategy
from pipecat_support import LIVE_BOTS, Call, Say, ScriptedLLM, build_voice_bot, eventually

from calltape.adapters.pipecat import CalltapeObserver, modality_of, register_function
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.runtime import CallSession, ToolSpec

pytestmark = pytest.mark.pipecat


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


async def start_call(recorder: Recorder, session_id: str, pipeline: Any, instructions: str = "") -> CallSession:
    """The session as attach() opens it: modality from the pipeline."""
    return await CallSession.start(
        recorder, session_id, agent="bot", instructions=instructions, modality=modality_of(pipeline)
    )


def turns(messages: list[Any]) -> list[tuple[Any, ...]]:
    """A context as comparable turns: (role, text) / (assistant, text, call ids) / (tool, id, output)."""
    out: list[tuple[Any, ...]] = []
    for m in messages:
        role = m.get("role")
        if role == "system":
            if m.get("content"):
                out.append(("system", m["content"]))
        elif role == "assistant":
            ids = tuple(tc["id"] for tc in m.get("tool_calls") or ())
            out.append(("assistant", (m.get("content") or "").strip(), ids))
        elif role == "tool":
            try:
                output = json.loads(m["content"])
            except ValueError:
                output = m["content"]
            out.append(("tool", m["tool_call_id"], output))
        else:
            out.append((role, m.get("content")))
    return merge_assistant(out)


def merge_assistant(items: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Pipecat writes a reply's text and its calls as separate assistant messages; calltape as one."""
    merged: list[tuple[Any, ...]] = []
    for item in items:
        if item[0] == "assistant" and item[2] and merged and merged[-1][0] == "assistant" and not merged[-1][2]:
            prev = merged.pop()
            item = ("assistant", (prev[1] + " " + item[1]).strip(), item[2])
        merged.append(item)
    return merged


async def logged(call: CallSession, store: EventStore, kind: str) -> list[dict[str, Any]]:
    await call.recorder.flush()
    return [e.data for e in await store.read(call.session_id) if e.type == kind]


# ---------------------------------------------------------------------------------------------
# Family 1: messages injected into the user aggregator (append / update / transform)


@pytest.mark.parametrize("run_llm", [False, True])
async def test_messages_append(run_llm: bool, recorder: Recorder, session_id: str) -> None:
    context = LLMContext()
    aggregator = LLMUserAggregator(context)
    call = await start_call(recorder, session_id, aggregator)
    await run_test(
        aggregator,
        frames_to_send=[LLMMessagesAppendFrame(messages=[{"role": "user", "content": "Hi there!"}], run_llm=run_llm)],
        observers=[CalltapeObserver(call)],
    )
    assert turns(context.get_messages()) == [("user", "Hi there!")]
    assert turns(call.context("openai")) == turns(context.get_messages())


async def test_messages_update_with_a_system_prompt(recorder: Recorder, session_id: str) -> None:
    context = LLMContext()
    aggregator = LLMUserAggregator(context)
    call = await start_call(recorder, session_id, aggregator)
    new = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello!"}]
    await run_test(
        aggregator, frames_to_send=[LLMMessagesUpdateFrame(messages=new)], observers=[CalltapeObserver(call)]
    )
    assert turns(call.context("openai")) == turns(context.get_messages()) == turns(new)


async def test_messages_transform_that_adds(recorder: Recorder, session_id: str) -> None:
    context = LLMContext([{"role": "system", "content": "Be brief."}])
    aggregator = LLMUserAggregator(context)
    call = await start_call(recorder, session_id, aggregator, instructions="Be brief.")

    def add_greeting(messages: list[Any]) -> list[Any]:
        return [*messages, {"role": "user", "content": "Please greet the caller."}]

    await run_test(
        aggregator,
        frames_to_send=[LLMMessagesTransformFrame(transform=add_greeting, run_llm=True)],
        observers=[CalltapeObserver(call)],
    )
    assert turns(call.context("openai")) == turns(context.get_messages())


async def test_messages_transform_that_rewrites_history(recorder: Recorder, session_id: str, store: EventStore) -> None:
    # Upstream's "keep only user messages": history is rewritten. calltape's log is append-only, so it
    # keeps the history and says the app rewrote it (documented difference).
    context = LLMContext()
    aggregator = LLMUserAggregator(context)
    call = await start_call(recorder, session_id, aggregator)
    history = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
        {"role": "user", "content": "How are you?"},
    ]

    def keep_user_messages(messages: list[Any]) -> list[Any]:
        return [m for m in messages if m["role"] == "user"]

    await run_test(
        aggregator,
        frames_to_send=[
            LLMMessagesUpdateFrame(messages=history),
            SleepFrame(),
            LLMMessagesTransformFrame(transform=keep_user_messages),
        ],
        observers=[CalltapeObserver(call)],
    )
    assert turns(context.get_messages()) == [("user", "Hello"), ("user", "How are you?")]
    assert turns(call.context("openai")) == turns(history)
    assert await logged(call, store, "x.pipecat.context_rewritten") == [{"replaced": 2, "kept": 1}]


# ---------------------------------------------------------------------------------------------
# Family 2: user mute strategies (first speech, function call)


async def test_user_mute_strategies(recorder: Recorder, session_id: str, store: EventStore) -> None:
    context = LLMContext()
    aggregator = LLMUserAggregator(
        context,
        params=LLMUserAggregatorParams(
            user_mute_strategies=[FirstSpeechUserMuteStrategy(), FunctionCallUserMuteStrategy()]
        ),
    )
    call = await start_call(recorder, session_id, aggregator)
    fc = FunctionCallFromLLM(function_name="fn_1", tool_call_id="1", arguments={}, context=None)
    await run_test(
        Pipeline([aggregator]),
        frames_to_send=[
            BotStartedSpeakingFrame(),  # the bot's first speech: muted
            VADUserStartedSpeakingFrame(),
            VADUserStoppedSpeakingFrame(),
            TranscriptionFrame(text="Hello!", user_id="", timestamp="now"),
            SleepFrame(),
            BotStoppedSpeakingFrame(),
            FunctionCallsStartedFrame(function_calls=[fc]),  # a function call runs: muted
            SleepFrame(),
            VADUserStartedSpeakingFrame(),
            VADUserStoppedSpeakingFrame(),
            TranscriptionFrame(text="Are you there?", user_id="", timestamp="now"),
            FunctionCallResultFrame(function_name="fn_1", tool_call_id="1", arguments={}, result={}),
            SleepFrame(),
        ],
        observers=[CalltapeObserver(call)],
    )
    assert [m for m in context.get_messages() if m.get("role") == "user"] == []
    assert [m for m in call.context("openai") if m.get("role") == "user"] == []
    assert [m["text"] for m in await logged(call, store, "x.pipecat.muted")] == ["Hello!", "Are you there?"]
    assert await logged(call, store, "user.speech.started") == []


# ---------------------------------------------------------------------------------------------
# Family 3: the assistant aggregator (responses, interruptions, function calls)


async def test_multiple_responses_with_an_interruption(recorder: Recorder, session_id: str) -> None:
    context = LLMContext()
    aggregator = LLMAssistantAggregator(context)
    call = await start_call(recorder, session_id, aggregator)
    assert call.fold.modality == "text"
    await run_test(
        aggregator,
        frames_to_send=[
            LLMFullResponseStartFrame(),
            LLMTextFrame("Hello "),
            LLMTextFrame("Pipecat."),
            LLMFullResponseEndFrame(),
            SleepFrame(0.15),
            InterruptionFrame(),
            LLMFullResponseStartFrame(),
            LLMTextFrame("How are "),
            LLMTextFrame("you?"),
            LLMFullResponseEndFrame(),
        ],
        observers=[CalltapeObserver(call)],
    )
    assert turns(context.get_messages()) == [("assistant", "Hello Pipecat.", ()), ("assistant", "How are you?", ())]
    assert turns(call.context("openai")) == turns(context.get_messages())


async def test_interruption_mid_response(recorder: Recorder, session_id: str, store: EventStore) -> None:
    context = LLMContext()
    aggregator = LLMAssistantAggregator(context)
    call = await start_call(recorder, session_id, aggregator)
    await run_test(
        aggregator,
        frames_to_send=[
            LLMFullResponseStartFrame(),
            LLMTextFrame("Hello "),
            SleepFrame(),
            InterruptionFrame(),
            LLMFullResponseStartFrame(),
            LLMTextFrame("Hello "),
            LLMTextFrame("there!"),
            LLMFullResponseEndFrame(),
        ],
        observers=[CalltapeObserver(call)],
    )
    assert turns(context.get_messages()) == [("assistant", "Hello", ()), ("assistant", "Hello there!", ())]
    assert turns(call.context("openai")) == turns(context.get_messages())
    native = call.context("native")
    assert [i.get("interrupted", False) for i in native["items"] if i.get("role") == "assistant"] == [True, False]
    # Nobody spoke: the interruption was the pipeline's.
    assert [i["cause"] for i in await logged(call, store, "interruption")] == ["system"]


async def test_function_call_result(recorder: Recorder, session_id: str) -> None:
    context = LLMContext()
    aggregator = LLMAssistantAggregator(context)
    call = await start_call(recorder, session_id, aggregator)
    args = {"location": "Los Angeles"}
    await run_test(
        aggregator,
        frames_to_send=[
            FunctionCallInProgressFrame(
                function_name="get_weather", tool_call_id="1", arguments=args, cancel_on_interruption=True
            ),
            SleepFrame(),
            FunctionCallResultFrame(
                function_name="get_weather", tool_call_id="1", arguments=args, result={"conditions": "Sunny"}
            ),
        ],
        observers=[CalltapeObserver(call)],
    )
    assert turns(context.get_messages()) == [("assistant", "", ("1",)), ("tool", "1", {"conditions": "Sunny"})]
    assert turns(call.context("openai")) == turns(context.get_messages())


async def test_function_call_cancel(recorder: Recorder, session_id: str) -> None:
    """A call calltape does not guard keeps Pipecat's own message (issue 26.6); the log says how it ended."""

    def frames() -> list[Any]:
        return [
            FunctionCallInProgressFrame(
                function_name="get_weather", tool_call_id="1", arguments={}, cancel_on_interruption=True
            ),
            SleepFrame(),
            FunctionCallCancelFrame(function_name="get_weather", tool_call_id="1"),
        ]

    upstream = LLMContext()  # the same frames without calltape: what Pipecat writes on its own
    await run_test(LLMAssistantAggregator(upstream), frames_to_send=frames())
    context = LLMContext()
    aggregator = LLMAssistantAggregator(context)
    call = await start_call(recorder, session_id, aggregator)
    await run_test(aggregator, frames_to_send=frames(), observers=[CalltapeObserver(call)])
    assert not aggregator.has_function_calls_in_progress
    assert context.get_messages() == upstream.get_messages()
    assert turns(call.context("openai"))[-1] == ("tool", "1", {"status": "cancelled", "reason": "interrupted"})
    assert turns(call.context("openai"))[:-1] == turns(context.get_messages())[:-1]


# ---------------------------------------------------------------------------------------------
# Family 4: function calling through the LLM service (full pipeline)


async def test_pipecat_timeout_of_an_unguarded_tool(recorder: Recorder, session_id: str) -> None:
    llm = ScriptedLLM([[Call("slow", "c1")], [Say("Sorry, that took too long.")]], function_call_timeout_secs=0.2)

    async def slow(params: FunctionCallParams) -> None:
        await asyncio.sleep(5)

    llm.register_function("slow", slow)
    bot = build_voice_bot(llm, observers=[])
    call = await start_call(recorder, session_id, bot.worker, instructions="You are a test bot.")
    bot.worker.add_observer(CalltapeObserver(call))
    await bot.start()
    await bot.push(VADUserStartedSpeakingFrame(), TranscriptionFrame("go", "u", "now"), VADUserStoppedSpeakingFrame())
    await eventually(lambda: len(llm.received) == 2)
    await eventually(lambda: "Sorry, that took too long." in [m.get("content") for m in call.context("openai")])
    state = call.call_state("c1")
    assert state is not None and state.status == "timeout"
    # the call is not guarded: the LLM got Pipecat's own message for it (issue 26.6), the log the timeout
    [pipecat_says] = [m["content"] for m in bot.messages() if m.get("role") == "tool"]
    assert turns(llm.received[1])[-1] == ("tool", "c1", pipecat_says) != ("tool", "c1", {"status": "timeout"})
    assert ("tool", "c1", {"status": "timeout"}) in turns(call.context("openai"))
    await eventually(
        lambda: (
            [t for t in turns(call.context("openai")) if t[0] != "tool"]
            == [t for t in turns(bot.messages()) if t[0] != "tool"]
        )
    )
    await bot.cancel()


async def test_a_raising_guarded_handler_settles_its_call(recorder: Recorder, session_id: str) -> None:
    llm = ScriptedLLM([[Call("boom", "c1")], [Say("Something went wrong.")]])

    async def boom(params: FunctionCallParams) -> None:
        raise RuntimeError("backend down")

    bot = build_voice_bot(llm, observers=[])
    call = await start_call(recorder, session_id, bot.worker, instructions="You are a test bot.")
    register_function(llm, call, "boom", boom)
    bot.worker.add_observer(CalltapeObserver(call))
    await bot.start()
    await bot.push(VADUserStartedSpeakingFrame(), TranscriptionFrame("go", "u", "now"), VADUserStoppedSpeakingFrame())
    await eventually(lambda: len(llm.received) == 2)
    state = call.call_state("c1")
    assert state is not None and state.status == "error"
    assert turns(llm.received[1])[-1] == ("tool", "c1", state.output)
    await eventually(lambda: "Something went wrong." in [m.get("content") for m in call.context("openai")])
    await eventually(lambda: turns(call.context("openai")) == turns(bot.messages()))
    await bot.cancel()


async def test_a_result_after_an_interruption_lands_once(recorder: Recorder, session_id: str) -> None:
    # Upstream: a result delivered after an interruption is rejected by Pipecat. With calltape's
    # default "finish" policy the result is the truth: it lands in the log and in the live context.
    llm = ScriptedLLM([[Say("Checking."), Call("stubborn", "c1")]])
    entered = asyncio.Event()

    async def stubborn(params: FunctionCallParams) -> None:
        entered.set()
        await asyncio.sleep(0.4)
        await params.result_callback({"done": True})

    bot = build_voice_bot(llm, observers=[])
    call = await start_call(recorder, session_id, bot.worker, instructions="You are a test bot.")
    register_function(llm, call, "stubborn", stubborn, spec=ToolSpec(on_interrupt="finish"))
    bot.worker.add_observer(CalltapeObserver(call))
    await bot.start()
    await bot.push(VADUserStartedSpeakingFrame(), TranscriptionFrame("go", "u", "now"), VADUserStoppedSpeakingFrame())
    await asyncio.wait_for(entered.wait(), 5)
    await bot.push(VADUserStartedSpeakingFrame())
    await eventually(lambda: (s := call.call_state("c1")) is not None and s.status == "completed")
    await eventually(lambda: turns(bot.messages())[-1] == ("tool", "c1", {"done": True}))
    assert [t for t in turns(bot.messages()) if t[0] == "tool"] == [("tool", "c1", {"done": True})]
    assert [t for t in turns(call.context("openai")) if t[0] == "tool"] == [("tool", "c1", {"done": True})]
    await bot.cancel()
