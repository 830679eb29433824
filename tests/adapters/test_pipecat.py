"""calltape on a real Pipecat 1.14 pipeline (offline): the known failures, and what calltape keeps.

Each failure test asserts the Pipecat-side symptom in the same run (or in an unguarded twin run), so
it proves the failure happened before it shows calltape's context is right.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("pipecat")

from pipecat.frames.frames import (
    InterimTranscriptionFrame,
    LLMRunFrame,
    TranscriptionFrame,
    TTSTextFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.services.llm_service import FunctionCallParams
from pipecat.transports.base_output import BaseOutputTransport
from pipecat_support import (
    LIVE_BOTS,
    Call,
    Say,
    ScriptedLLM,
    SlowConsumer,
    VoiceBot,
    build_voice_bot,
    eventually,
)

from calltape.adapters.pipecat import (
    CalltapeObserver,
    context_messages,
    register_function,
    seed_llm_context,
)
from calltape.events import Event, make_event
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.projections import build_context
from calltape.runtime import CallSession, ToolSpec, resume

pytestmark = pytest.mark.pipecat

SYSTEM = "You are a test bot."


# ---------------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(autouse=True)
async def _stop_pipelines() -> AsyncIterator[None]:
    yield
    while LIVE_BOTS:
        await LIVE_BOTS.pop().stop()


@pytest.fixture
async def recorder(store: EventStore) -> AsyncIterator[Recorder]:
    rec = Recorder(store)
    await rec.start()
    try:
        yield rec
    finally:
        while LIVE_BOTS:  # pipelines first: their observers still write to the recorder
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


def assistant_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m.get("role") == "assistant" and m.get("content")]


def in_progress(call: CallSession) -> list[str]:
    return [t.call_id for t in call.fold.tool_calls() if t.status == "in_progress"]


class PlayedText(BaseObserver):
    """Tells the test when the output transport releases a sentence (the user has heard it)."""

    def __init__(self) -> None:
        super().__init__()
        self.played: list[str] = []
        self.event = asyncio.Event()

    async def on_push_frame(self, data: FramePushed) -> None:
        if isinstance(data.source, BaseOutputTransport) and isinstance(data.frame, TTSTextFrame):
            self.played.append(data.frame.text)
            self.event.set()


# ---------------------------------------------------------------------------------------------
# recording: the frame → event mapping


class RecordingCall:
    """A recording-only EventSink (not a LiveCall) that collects what the observer emits (mapping
    tests only): the observer records the end of the session as one more event."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.tools: dict[str, ToolSpec] = {}

    def emit(self, event_type: str, data: Any = None) -> Event:
        self.events.append((event_type, dict(data or {})))
        return make_event("mapping-test", event_type, dict(data or {}))

    def of(self, event_type: str) -> list[dict[str, Any]]:
        return [d for t, d in self.events if t == event_type]


async def test_observer_maps_a_voice_turn_once_per_frame() -> None:
    llm = ScriptedLLM(
        [
            [Say("Sure. Let me look that up."), Call("lookup", "call_1", {"order": 42})],
            [Say("It shipped. It arrives tomorrow.")],
        ]
    )

    async def lookup(params: FunctionCallParams) -> None:
        await params.result_callback({"status": "shipped"})

    llm.register_function("lookup", lookup)
    rec = RecordingCall()
    bot = build_voice_bot(llm, observers=[CalltapeObserver(rec)])  # type: ignore[arg-type]
    await bot.start()
    await bot.push(VADUserStartedSpeakingFrame(), InterimTranscriptionFrame("where is", "user", "now"))
    await user_says(bot, "where is my order")
    await eventually(lambda: len(rec.of("agent.speech.ended")) == 2)
    await bot.end()

    types = [t for t, _ in rec.events]
    # Recorded as the user aggregator takes them: the VAD edges are system frames and overtake the
    # transcripts queued behind them.
    assert types[:4] == ["user.speech.started", "user.speech.stopped", "user.transcript", "user.transcript"]
    assert [d["final"] for d in rec.of("user.transcript")] == [False, True]
    first, second = (d["reply"] for d in rec.of("agent.reply.started"))
    assert "".join(d["text"] for d in rec.of("agent.text") if d["reply"] == first) == "Sure. Let me look that up."
    # Broadcast frames (FunctionCallsStarted/InProgress/Result, BotStarted/Stopped) are recorded once.
    assert rec.of("tool.call") == [{"call": "call_1", "name": "lookup", "arguments": {"order": 42}, "reply": first}]
    assert rec.of("tool.started") == [{"call": "call_1"}]
    assert rec.of("tool.result") == [{"call": "call_1", "output": {"status": "shipped"}}]
    assert [d["reply"] for d in rec.of("agent.speech.started")] == [first, second]
    assert rec.of("agent.speech.ended") == [
        {"reply": first, "interrupted": False, "heard": "Sure. Let me look that up."},
        {"reply": second, "interrupted": False, "heard": "It shipped. It arrives tomorrow."},
    ]
    # The playout cursor only moves forward, sentence by sentence, as the transport plays them.
    assert [d["heard"] for d in rec.of("agent.speech.progress") if d["reply"] == second] == [
        "It shipped.",
        "It shipped. It arrives tomorrow.",
    ]
    assert types.index("agent.reply.done") < types.index("agent.speech.ended")
    assert rec.events[-1] == ("session.ended", {})


async def test_a_failing_recorder_never_breaks_the_pipeline() -> None:
    class Broken(RecordingCall):
        def emit(self, event_type: str, data: Any = None) -> Event:
            raise RuntimeError("database on fire")

    llm = ScriptedLLM([[Say("Hello there.")]])
    bot = build_voice_bot(llm, observers=[CalltapeObserver(Broken())])  # type: ignore[arg-type]
    await bot.start()
    await user_says(bot, "hi")
    await eventually(lambda: "Hello there." in assistant_texts(bot.messages()))
    await bot.end()


async def test_cancel_frame_drops_the_session_and_end_frame_ends_it(call: CallSession, recorder: Recorder) -> None:
    bot = build_voice_bot(ScriptedLLM([]), observers=[CalltapeObserver(call)])
    await bot.start()
    await bot.cancel()
    assert call.fold.dropped

    rec = RecordingCall()
    bot = build_voice_bot(ScriptedLLM([]), observers=[CalltapeObserver(rec, on_end="none")])  # type: ignore[arg-type]
    await bot.start()
    await bot.end()
    assert rec.of("session.ended") == []


# ---------------------------------------------------------------------------------------------
# pipecat-ai#3661 / #4165 / #5779: a cancel that overtakes FunctionCallInProgressFrame


async def test_cancel_overtaking_in_progress_leaves_pipecat_stuck_not_calltape(call: CallSession) -> None:
    llm = ScriptedLLM([[Say("Sure, let me look that up for you right now."), Call("lookup", "call_1", {"q": "42"})]])
    entered = asyncio.Event()

    async def lookup(params: FunctionCallParams) -> None:
        entered.set()
        await asyncio.sleep(3)
        await params.result_callback({"status": "shipped"})

    llm.register_function("lookup", lookup)  # plain Pipecat registration: only the observer is attached
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call)])
    await bot.start()
    await user_says(bot, "where is my order")
    await asyncio.wait_for(entered.wait(), 5)
    await asyncio.sleep(0.1)  # the bot is speaking; FunctionCallInProgressFrame waits behind its audio
    await barge_in(bot)
    await asyncio.sleep(0.8)

    # Pipecat: the cancel reached the aggregator first and was ignored; the late in-progress frame
    # then opened the call again, and nothing will ever settle it there.
    assert bot.assistant.has_function_calls_in_progress
    # calltape: the call was started, then cancelled by the barge-in; nothing is in progress.
    assert in_progress(call) == []
    outputs = tool_messages(call.context("openai"))
    assert json.loads(outputs["call_1"]) == {"status": "cancelled", "reason": "interrupted"}
    # The call is not guarded: Pipecat's live context keeps its own message (issue 26.6); guarding
    # the tool (register_function) is what reconciles it.
    assert tool_messages(bot.messages())["call_1"] != outputs["call_1"]
    await bot.cancel()


async def test_result_after_barge_in_lands_in_calltape_context(call: CallSession) -> None:
    llm = ScriptedLLM([[Say("Sure, let me look that up for you right now."), Call("lookup", "call_1", {"q": "42"})]])
    entered = asyncio.Event()
    ran: list[str] = []

    async def lookup(params: FunctionCallParams) -> None:
        entered.set()
        await asyncio.sleep(0.4)
        ran.append(params.tool_call_id)
        await params.result_callback({"status": "shipped"})

    register_function(llm, call, "lookup", lookup)  # on_interrupt="finish" (calltape's default)
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call)])
    await bot.start()
    await user_says(bot, "where is my order")
    await asyncio.wait_for(entered.wait(), 5)
    await asyncio.sleep(0.1)
    await barge_in(bot)
    await eventually(lambda: bool(ran))
    await eventually(lambda: in_progress(call) == [])

    assert json.loads(tool_messages(call.context("openai"))["call_1"]) == {"status": "shipped"}
    # Pipecat alone loses the result (its context keeps a placeholder); reconciled, the live context
    # holds the one real output.
    await eventually(lambda: tool_messages(bot.messages()) == {"call_1": '{"status": "shipped"}'})
    await bot.cancel()


# ---------------------------------------------------------------------------------------------
# pipecat-ai#4997: a queued call of an interrupted generation still runs


@pytest.mark.parametrize("guarded", [False, True], ids=["pipecat", "calltape"])
async def test_queued_call_of_interrupted_generation(guarded: bool, call: CallSession) -> None:
    llm = ScriptedLLM(
        [[Say("Thank you for that."), Call("check_balance", "c1"), Call("end_call", "c2")]],
        run_in_parallel=False,
    )
    ran: list[str] = []

    async def check_balance(params: FunctionCallParams) -> None:
        ran.append("check_balance")
        await asyncio.sleep(0.4)
        await params.result_callback({"balance": 10})

    async def end_call(params: FunctionCallParams) -> None:
        ran.append("end_call")  # in production: hang up on the caller
        await params.result_callback({"ended": True})

    if guarded:
        register_function(llm, call, "check_balance", check_balance, cancel_on_interruption=False)
        register_function(llm, call, "end_call", end_call)
    else:
        llm.register_function("check_balance", check_balance, cancel_on_interruption=False)
        llm.register_function("end_call", end_call)
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call)])
    await bot.start()
    await user_says(bot, "thank you for that")
    await eventually(lambda: "check_balance" in ran)
    await barge_in(bot, "and also")
    await eventually(lambda: tool_messages(bot.messages()).get("c2") not in (None, "IN_PROGRESS"), timeout=3)

    if not guarded:
        assert ran == ["check_balance", "end_call"]  # the bug: the hang-up ran after the barge-in
        return
    assert ran == ["check_balance"]
    state = call.call_state("c2")
    assert state is not None and not state.started
    outputs = tool_messages(call.context("openai"))
    assert json.loads(outputs["c1"]) == {"balance": 10}  # on_interrupt="finish": the result is kept
    # The call of the interrupted reply that never ran is settled as such (SPEC §2 rule 5).
    assert json.loads(outputs["c2"]) == {"status": "cancelled", "reason": "interrupted"}
    assert json.loads(tool_messages(bot.messages())["c2"]) == {"status": "cancelled", "reason": "interrupted"}
    await bot.cancel()


# ---------------------------------------------------------------------------------------------
# pipecat-ai#4996: words the user heard before a barge-in


async def test_words_heard_before_barge_in_are_kept(call: CallSession) -> None:
    llm = ScriptedLLM([[Say("Your order shipped on Monday. It is with the courier now and should arrive by Friday.")]])
    played = PlayedText()
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call), played], after_output=[SlowConsumer(0.05)])
    await bot.start()
    await user_says(bot, "where is my order")
    await asyncio.wait_for(played.event.wait(), 5)
    await barge_in(bot)
    await eventually(lambda: call.fold.user_speaking)
    await asyncio.sleep(0.3)

    assert played.played == ["Your order shipped on Monday."]  # the transport played this sentence
    assert assistant_texts(bot.messages()) == []  # Pipecat: the interruption overtook it, it is gone
    assert assistant_texts(call.context("openai")) == ["Your order shipped on Monday."]
    native = call.context("native")
    message = next(i for i in native["items"] if i.get("role") == "assistant")
    assert message.get("interrupted") is True
    await bot.cancel()


async def test_an_interrupted_reply_stops_being_spoken_when_the_bot_goes_quiet(
    call: CallSession, recorder: Recorder
) -> None:
    """Pipecat drops an interrupted reply's end frame, so only the bot falling silent says its speech
    ended; without it every barge-in over speech looked like talk-over that never stopped."""
    llm = ScriptedLLM([[Say("Your order shipped on Monday. It is with the courier now and should arrive by Friday.")]])
    played = PlayedText()
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call), played])
    await bot.start()
    await user_says(bot, "where is my order")
    await asyncio.wait_for(played.event.wait(), 5)
    await barge_in(bot)
    await eventually(lambda: call.fold.replies()[0].speech_ended)
    first = call.fold.replies()[0]
    assert first.interrupted and first.speech_started
    await recorder.flush()
    events = await recorder.store.read(call.session_id)
    ended = [e for e in events if e.type == "agent.speech.ended" and e.data["reply"] == first.reply]
    assert [e.data.get("interrupted") for e in ended] == [True]
    cut = next(e for e in events if e.type == "interruption")
    assert (ended[0].seq or 0) > (cut.seq or 0) and ended[0].at_ms - cut.at_ms < 2000  # not talking on
    await bot.cancel()


# ---------------------------------------------------------------------------------------------
# A handler that hangs (Pipecat's function_call_timeout_secs is None by default since 1.0)


@pytest.mark.parametrize("guarded", [False, True], ids=["pipecat", "calltape"])
async def test_hanging_handler(guarded: bool, call: CallSession) -> None:
    llm = ScriptedLLM([[Call("lookup", "c1", {"q": "42"})], [Say("Sorry, the lookup timed out.")]])
    cancelled = asyncio.Event()

    async def lookup(params: FunctionCallParams) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    if guarded:
        register_function(llm, call, "lookup", lookup, spec=ToolSpec(timeout=0.3))
    else:
        llm.register_function("lookup", lookup)
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call)])
    await bot.start()
    started = time.monotonic()
    await user_says(bot, "look it up")

    if not guarded:
        await asyncio.sleep(1.0)
        assert tool_messages(bot.messages()) == {"c1": "IN_PROGRESS"}
        assert in_progress(call) == ["c1"] and not cancelled.is_set()
        await bot.cancel()
        return
    await asyncio.wait_for(cancelled.wait(), 2)
    assert time.monotonic() - started < 1.5
    await eventually(lambda: len(llm.received) == 2)
    assert json.loads(tool_messages(call.context("openai"))["c1"]) == {"status": "timeout"}
    assert json.loads(tool_messages(llm.received[1])["c1"]) == {"status": "timeout"}  # the LLM is told
    await bot.cancel()


# ---------------------------------------------------------------------------------------------
# Exactly once: a re-asked call id returns the stored result


async def test_a_repeated_call_id_runs_once(call: CallSession) -> None:
    llm = ScriptedLLM(
        [
            [Call("book", "c1", {"slot": "9am"})],
            [Call("book", "c1", {"slot": "9am"})],  # the model asks again with the same id
            [Say("You are booked.")],
        ]
    )
    bookings: list[str] = []

    async def book(params: FunctionCallParams) -> None:
        bookings.append(params.arguments["slot"])
        await params.result_callback({"booking": f"B-{len(bookings)}"})

    register_function(llm, call, "book", book)
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call)])
    await bot.start()
    await user_says(bot, "book me at nine")
    await eventually(lambda: len(llm.received) == 3)
    assert bookings == ["9am"]
    assert [m["content"] for m in llm.received[2] if m.get("role") == "tool"] == ['{"booking": "B-1"}'] * 2
    await bot.end()


# ---------------------------------------------------------------------------------------------
# A pipeline dropped mid-tool, resumed into a new pipeline


async def test_drop_mid_tool_then_resume_into_a_new_pipeline(
    call: CallSession, recorder: Recorder, store: EventStore, session_id: str
) -> None:
    llm = ScriptedLLM([[Say("Booking that now."), Call("book", "c1", {"slot": "9am"})]])
    entered, release = asyncio.Event(), asyncio.Event()

    async def book(params: FunctionCallParams) -> None:
        entered.set()
        await release.wait()
        await params.result_callback({"booking": "B-1"})

    register_function(llm, call, "book", book, spec=ToolSpec(timeout=30))
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call)])
    await bot.start()
    await user_says(bot, "book me at nine")
    await asyncio.wait_for(entered.wait(), 5)
    await bot.cancel()  # the transport is gone mid-tool
    assert call.fold.dropped and in_progress(call) == ["c1"]

    plan = await resume(store, session_id, "support-2")
    assert [(t.call_id, t.decision) for t in plan.tools] == [("c1", "unknown")]
    resumed = await CallSession.attach(recorder, session_id)

    llm2 = ScriptedLLM([[Say("I could not confirm the booking. Shall I check it?")]])
    bot2 = build_voice_bot(llm2, messages=context_messages(resumed), observers=[CalltapeObserver(resumed)])
    await bot2.start()
    await bot2.push(LLMRunFrame())
    await asyncio.wait_for(llm2.inference.wait(), 5)
    seen = llm2.received[0]
    assert seen[0] == {"role": "system", "content": SYSTEM}
    assert {"role": "user", "content": "book me at nine"} in seen
    assert json.loads(tool_messages(seen)["c1"])["status"] == "unknown"
    assert "IN_PROGRESS" not in json.dumps(seen)
    await eventually(
        lambda: "I could not confirm the booking. Shall I check it?" in assistant_texts(resumed.context("openai"))
    )
    await bot2.end()

    # The old process's tool finishing late is fenced out: the resumed log keeps "unknown".
    release.set()
    await asyncio.sleep(0.2)
    await recorder.flush()
    final = await build_context(store, session_id)
    late = final.tool_call("c1")
    assert late is not None and late.status == "unknown"
    events = await store.read(session_id)
    calls = [e for e in events if not e.type.startswith("x.")]
    assert calls[-1].type == "session.ended" and calls[-1].epoch == 2
    # The zombie's rejected write is on record (without an epoch) for `calltape stats`.
    fenced = [e.data for e in events if e.type == "x.recovery" and e.data["kind"] == "fenced_write"]
    assert fenced and all(f["epoch"] == 1 and f["current_epoch"] == 2 for f in fenced)


# ---------------------------------------------------------------------------------------------
# Handoff into a new pipeline on the same live call


async def test_handoff_seeds_the_next_pipeline_with_the_first_agents_tools(call: CallSession) -> None:
    llm = ScriptedLLM([[Call("lookup", "c1", {"q": "42"})], [Say("It shipped. Let me pass you to billing.")]])

    async def lookup(params: FunctionCallParams) -> None:
        await params.result_callback({"status": "shipped"})

    register_function(llm, call, "lookup", lookup)
    bot = build_voice_bot(llm, observers=[CalltapeObserver(call, on_end="none")])
    await bot.start()
    await user_says(bot, "where is my order")
    await eventually(lambda: bool(call.fold.clean) and len(llm.received) == 2 and not call.fold.open_replies())
    await bot.end()

    await call.handoff("billing", instructions="You are billing.")
    billing = ScriptedLLM([[Say("Billing here.")]])  # registers no lookup tool
    context = seed_llm_context(call)
    bot2 = build_voice_bot(billing, messages=list(context.get_messages()), observers=[CalltapeObserver(call)])
    await bot2.start()
    await bot2.push(LLMRunFrame())
    await asyncio.wait_for(billing.inference.wait(), 5)
    seen = billing.received[0]
    assert seen[0] == {"role": "system", "content": "You are billing."}
    assert json.loads(tool_messages(seen)["c1"]) == {"status": "shipped"}
    assert any(m.get("tool_calls") for m in seen if m.get("role") == "assistant")
    await bot2.end()
