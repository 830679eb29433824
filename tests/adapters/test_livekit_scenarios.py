"""LiveKit's own scenario families (its ``tests/``: fake STT/VAD/TTS sessions) rebuilt on the
installed framework with calltape attached the README way, comparing calltape's context with
LiveKit's ``ChatContext`` turn by turn.

The caller is scripted (:class:`~tests.adapters.livekit_support.Utterance`): VAD edges and STT
results on a timeline; turn detection, interruptions, transcript sync, tools and handoffs are
LiveKit's. Documented differences: consecutive user messages count as one turn (calltape's rule),
and a call answered by a progress update keeps one output (its real result).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession, RunContext, function_tool, llm
from livekit.agents.voice import speech_handle as lk_speech_handle
from livekit.agents.voice.events import ToolCallEnded

from calltape.adapters.livekit import attach, guarded
from calltape.eventstore import EventStore
from calltape.projections import build_context
from calltape.runtime import CallSession, ToolSpec
from tests.adapters.livekit_support import (
    ScriptedLLM,
    Step,
    Utterance,
    before_1_8,
    calltape_calls,
    calltape_turns,
    livekit_calls,
    livekit_turns,
    start_call,
    voice_session,
)

pytestmark = pytest.mark.livekit


async def run_call(
    store: EventStore,
    session_id: str,
    script: list[Utterance],
    llm_: ScriptedLLM,
    agent: Agent,
    *,
    seconds: float,
    **options: Any,
) -> tuple[AgentSession[Any], CallSession, dict[str, Any]]:
    """Runs the scripted call for ``seconds`` with calltape attached; returns LiveKit's session, the
    call and calltape's durable context (rebuilt from the store)."""
    recorder, call = await start_call(store, session_id, agent=agent.id, instructions="", modality="voice")
    session, phone = voice_session(script, llm_, **options)
    tap = attach(session, call)
    await session.start(agent)
    phone.ring()
    await asyncio.sleep(seconds)
    await session.aclose()
    await tap.drain()
    await recorder.flush()
    native = (await build_context(store, session_id)).native()
    await recorder.close()
    return session, call, native


async def shaped_call(
    store: EventStore,
    session_id: str,
    script: list[Utterance],
    make: Callable[[], tuple[ScriptedLLM, Agent]],
    shaped: Callable[[AgentSession[Any], ScriptedLLM], bool],
    *,
    seconds: float,
    calls: bool = False,
    **options: Any,
) -> tuple[AgentSession[Any], ScriptedLLM, dict[str, Any], str]:
    """:func:`run_call` until LiveKit's own history takes the scenario's shape (``shaped``), at most three
    runs, a new session each (``make`` gives each its LLM and agent); returns the last run's session, LLM,
    calltape's context and session id.

    Real time: on a starved machine LiveKit's timeline can slip (a reply lands after the next utterance)
    and the call takes another shape. calltape must agree with LiveKit on every run, whatever its shape
    (checked here, turn by turn, and call by call with ``calls``); only the shape under test is waited for."""
    for attempt in range(3):
        sid = f"{session_id}-{attempt}"
        llm_, agent = make()
        session, _, native = await run_call(store, sid, script, llm_, agent, seconds=seconds, **options)
        assert calltape_turns(native) == livekit_turns(session.history)
        if calls:
            assert calltape_calls(native) == livekit_calls(session.history)
        if shaped(session, llm_):
            return session, llm_, native, sid
    pytest.fail("LiveKit's history never took the scenario's shape (three runs on a starved machine)")


# -------------------------------------------------------------------------------------------------
# Family: turn-taking (upstream test_events_and_metrics, test_generate_reply)


async def test_turn_taking(store: EventStore, session_id: str) -> None:
    script = [Utterance(0.2, 0.7, "Hello there."), Utterance(2.4, 2.9, "What time do you open?")]
    turns = [
        ("user", "Hello there."),
        ("assistant", "Hi, how can I help you today?"),
        ("user", "What time do you open?"),
        ("assistant", "We open at nine."),
    ]
    _, _, native, _ = await shaped_call(
        store,
        session_id,
        script,
        lambda: (
            ScriptedLLM([Step("Hi, how can I help you today?"), Step("We open at nine.")]),
            Agent(instructions="Shop."),
        ),
        lambda session, _: livekit_turns(session.history) == turns,
        seconds=4.2,
    )
    assert native["clean"]


# -------------------------------------------------------------------------------------------------
# Family: interruption (upstream test_interruption)


async def test_barge_in_keeps_what_was_heard(store: EventStore, session_id: str) -> None:
    long = "Our opening hours are from nine in the morning until six in the evening on every weekday of the year."
    script = [Utterance(0.2, 0.6, "When are you open?"), Utterance(1.6, 2.1, "Only Saturday please.")]

    def cut_of(session: AgentSession[Any]) -> list[llm.ChatMessage]:
        return [m for m in session.history.items if isinstance(m, llm.ChatMessage) and m.interrupted]

    session, _, native, sid = await shaped_call(
        store,
        session_id,
        script,
        lambda: (ScriptedLLM([Step(long), Step("On Saturdays we open at ten.")]), Agent(instructions="Shop.")),
        # upstream: one reply cut mid-sentence
        lambda session, _: len(cut := cut_of(session)) == 1 and 0 < len(cut[0].text_content or "") < len(long),
        seconds=4.5,
    )
    cut = cut_of(session)
    heard = [i for i in native["items"] if i["type"] == "message" and i.get("interrupted")]
    assert [h["content"].strip() for h in heard] == [(cut[0].text_content or "").strip()]
    interruptions = [e for e in await store.read(sid) if e.type == "interruption"]
    assert [e.data["cause"] for e in interruptions] == ["user_speech"]


# -------------------------------------------------------------------------------------------------
# Family: speech that cannot be interrupted (upstream test_interrupt_protected_speech); issue 11


async def test_speech_over_a_non_interruptible_reply_is_not_a_user_turn(store: EventStore, session_id: str) -> None:
    terms = "These are the terms of the service, please listen to all of them carefully before you agree."
    script = [Utterance(0.2, 0.6, "Read me the terms."), Utterance(1.4, 1.8, "Hello? Are you there?")]
    expected = [("user", "Read me the terms."), ("assistant", terms)]
    _, _, native, _ = await shaped_call(
        store,
        session_id,
        script,
        lambda: (
            ScriptedLLM([Step(terms), Step("Yes, I am here.")]),
            Agent(instructions="Terms.", allow_interruptions=False),
        ),
        # upstream: LiveKit discards the speech (no user turn, no reply to it)
        lambda session, llm_: livekit_turns(session.history) == expected and len(llm_.seen) == 1,
        seconds=4.0,
    )
    assert native["pending"]["user_text"] is None and native["clean"]


# -------------------------------------------------------------------------------------------------
# Family: a new user turn during on_user_turn_completed (upstream test_interrupt_during_on_user_turn_completed)


async def test_slow_user_turn_hook_while_the_user_keeps_talking(store: EventStore, session_id: str) -> None:
    class Librarian(Agent):
        async def on_user_turn_completed(self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage) -> None:
            await asyncio.sleep(0.8)  # a RAG lookup

    script = [Utterance(0.2, 0.7, "Tell me a story"), Utterance(1.0, 1.5, "about a firefighter.")]
    said = " ".join(u.text for u in script)
    await shaped_call(
        store,
        session_id,
        script,
        lambda: (
            ScriptedLLM([Step("Once upon a time."), Step("Once upon a time, a firefighter named Sam.")]),
            Librarian(instructions="Stories."),
        ),
        # one user turn, each word once (calltape agrees turn by turn: checked in shaped_call)
        lambda session, _: [t for r, t in livekit_turns(session.history) if r == "user"] == [said],
        seconds=4.0,
    )


# -------------------------------------------------------------------------------------------------
# Family: tools (upstream test_tool_call)


class Booker(Agent):
    def __init__(self, delay: float = 0.1) -> None:
        super().__init__(instructions="You book tables.")
        self.delay = delay

    @function_tool
    async def book(self, ctx: RunContext[Any], when: str) -> str:
        """Books a table."""
        await asyncio.sleep(self.delay)
        return f"booked {when}"


async def test_tool_turn(store: EventStore, session_id: str) -> None:
    script = [Utterance(0.2, 0.7, "A table at seven please.")]
    llm_ = ScriptedLLM([Step("Let me book that.", [("call_1", "book", {"when": "7pm"})]), Step("Booked for seven.")])
    session, _, native = await run_call(store, session_id, script, llm_, Booker(), seconds=3.0)
    assert livekit_calls(session.history) == {"call_1": ("book", "booked 7pm")}
    assert calltape_calls(native) == livekit_calls(session.history)
    assert calltape_turns(native) == livekit_turns(session.history)


# -------------------------------------------------------------------------------------------------
# Family: tool results preserved on interruption (upstream test_tool_results_preserved_on_interruption)


async def test_barge_in_while_the_tool_runs(store: EventStore, session_id: str) -> None:
    script = [Utterance(0.2, 0.7, "A table at seven please."), Utterance(1.3, 1.8, "And is there parking?")]
    steps = [Step("One moment.", [("call_1", "book", {"when": "7pm"})]), Step("Yes, parking is free."), Step("Done.")]
    # On a starved machine the barge-in can land before the LLM asked for the tool.
    session, _, _, _ = await shaped_call(
        store,
        session_id,
        script,
        lambda: (ScriptedLLM(steps), Booker(delay=1.5)),
        lambda session, _: "call_1" in livekit_calls(session.history),
        seconds=5.0,
        calls=True,
    )
    assert livekit_calls(session.history)["call_1"] == ("book", "booked 7pm")  # upstream keeps it (#3702)


# -------------------------------------------------------------------------------------------------
# Family: preemptive generation (upstream test_preemptive_generation)


async def test_preemptive_generation(store: EventStore, session_id: str) -> None:
    script = [Utterance(0.2, 0.7, "Hello there."), Utterance(2.4, 2.9, "Thanks, bye.")]
    await shaped_call(
        store,
        session_id,
        script,
        lambda: (ScriptedLLM([Step("Hi, how can I help you today?"), Step("Goodbye.")]), Agent(instructions="Shop.")),
        lambda session, _: livekit_turns(session.history)[-1:] == [("assistant", "Goodbye.")],
        seconds=4.2,
        turn_handling={"preemptive_generation": {"enabled": True}},
    )


# -------------------------------------------------------------------------------------------------
# Family: handoff (upstream test_workflows)


async def test_handoff_by_tool(store: EventStore, session_id: str) -> None:
    billing_llm = ScriptedLLM([Step("Billing here, how can I help?")])

    class Billing(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You handle billing.", llm=billing_llm)

        async def on_enter(self) -> None:
            self.session.generate_reply()

    class Triage(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You triage.")

        @function_tool
        async def transfer_to_billing(self, ctx: RunContext[Any]) -> Agent:
            """Hands the caller to billing."""
            return Billing()

    script = [Utterance(0.2, 0.7, "I have a billing question.")]
    llm_ = ScriptedLLM([Step("", [("call_1", "transfer_to_billing", {})])])
    session, call, native = await run_call(store, session_id, script, llm_, Triage(), seconds=3.0)
    assert calltape_turns(native) == livekit_turns(session.history)
    assert calltape_calls(native) == livekit_calls(session.history)
    handoffs = [(i["from"], i["to"]) for i in native["items"] if i["type"] == "handoff"]
    assert handoffs == [("triage", "billing")]
    assert native["items"][0]["content"] == "You handle billing."
    assert call.agent == native["agent"] == "billing"


# -------------------------------------------------------------------------------------------------
# Family: injected messages (upstream test_say, test_generate_reply with instructions / user_input)


async def test_injected_greeting_instructions_and_typed_input(store: EventStore, session_id: str) -> None:
    class Host(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You seat guests.")

        async def on_enter(self) -> None:
            self.session.say("Welcome to Luigi's.")  # a scripted line, no LLM
            self.session.generate_reply(instructions="Ask for the caller's name.")  # an app's nudge
            asyncio.get_running_loop().call_later(
                3.4,
                lambda: self.session.generate_reply(user_input="Table for two."),  # typed, not spoken
            )

    script = [Utterance(1.8, 2.2, "Mario.")]
    turns = [
        ("assistant", "Welcome to Luigi's."),
        ("assistant", "What is your name?"),
        ("user", "Mario."),
        ("assistant", "Nice to meet you, Mario."),
        ("user", "Table for two."),
        ("assistant", "Two it is."),
    ]
    _, _, native, _ = await shaped_call(
        store,
        session_id,
        script,
        lambda: (
            ScriptedLLM([Step("What is your name?"), Step("Nice to meet you, Mario."), Step("Two it is.")]),
            Host(),
        ),
        lambda session, _: livekit_turns(session.history) == turns,
        seconds=5.0,
    )
    # the nudge is an instruction for one generation, not a message of either context
    assert not any("Ask for the caller" in str(i.get("content")) for i in native["items"])
    assert native["clean"]


# -------------------------------------------------------------------------------------------------
# Live reconciliation (issue 11): a guarded `finish` tool landing after a barge-in


def dangling_calls(chat_ctx: llm.ChatContext) -> list[str]:
    """Calls not followed by their one output before the next message (what a provider rejects)."""
    items = [i for i in chat_ctx.items if isinstance(i, (llm.ChatMessage, llm.FunctionCall, llm.FunctionCallOutput))]
    bad: list[str] = []
    for n, item in enumerate(items):
        if not isinstance(item, llm.FunctionCall):
            continue
        outputs = 0
        for later in items[n + 1 :]:
            if isinstance(later, llm.ChatMessage):
                break
            if isinstance(later, llm.FunctionCallOutput) and later.call_id == item.call_id:
                outputs += 1
        if outputs != 1:
            bad.append(item.call_id)
    return bad


@pytest.mark.parametrize("policy", ["finish", "cancel"])
async def test_guarded_tool_landing_after_a_barge_in_is_in_the_live_context(
    policy: str, store: EventStore, session_id: str
) -> None:
    runs: list[str] = []

    class GuardedBooker(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You book tables.")

        @function_tool
        @guarded(spec=ToolSpec(on_interrupt=policy))  # type: ignore[arg-type]
        async def book(self, ctx: RunContext[Any], when: str) -> str:
            """Books a table."""
            runs.append(when)
            await asyncio.sleep(1.5)
            return f"booked {when}"

    script = [
        Utterance(0.2, 0.7, "A table at seven please."),
        Utterance(1.3, 1.8, "And is there parking?"),
        Utterance(3.6, 4.0, "Thanks a lot."),
    ]
    llm_ = ScriptedLLM(
        [
            Step(
                "One moment please, I am booking that table for you right now.", [("call_1", "book", {"when": "7pm"})]
            ),
            Step("Parking is free."),
            Step("You are welcome."),
        ]
    )
    session, _, native = await run_call(store, session_id, script, llm_, GuardedBooker(), seconds=5.5)
    assert runs == ["7pm"]
    if policy == "cancel":  # the barge-in cancelled the body mid-run: its effect is unknown
        assert calltape_calls(native)["call_1"][1] == {"status": "unknown"}
    cut = [m for m in session.history.items if isinstance(m, llm.ChatMessage) and m.interrupted]
    assert len(cut) == 1  # the barge-in cut the preamble while the tool ran
    # every inference LiveKit ran saw each call with exactly one output right after it
    assert [dangling_calls(ctx) for ctx in llm_.seen] == [[] for _ in llm_.seen]
    # the inference after the tool landed (the caller's thanks) had its real output
    last = llm_.seen[-1]
    assert ("user", "Thanks a lot.") in livekit_turns(last)
    outputs = [(o.call_id, o.output) for o in last.items if isinstance(o, llm.FunctionCallOutput)]
    assert len(outputs) == 1 and outputs[0][0] == "call_1"
    if policy == "finish":
        assert outputs == [("call_1", "booked 7pm")]
    else:  # LiveKit 1.8 keeps the ToolError it was given; 1.6/1.7 get calltape's output
        assert outputs[0][1] == json.dumps({"status": "unknown"}) or "cancelled by the interruption" in outputs[0][1]
        assert "not run again" not in outputs[0][1]  # it did run: it was cut, not answered from the log
    assert dangling_calls(session.history) == []
    assert list(calltape_calls(native)) == ["call_1"] == list(livekit_calls(session.history))
    if policy == "finish":
        assert calltape_calls(native) == {"call_1": ("book", "booked 7pm")} == livekit_calls(session.history)
    assert calltape_turns(native) == livekit_turns(session.history)


@before_1_8
async def test_guarded_tool_released_at_the_cap_has_its_real_output_in_the_live_context(
    store: EventStore, session_id: str
) -> None:
    cap = lk_speech_handle.INTERRUPTION_TIMEOUT
    ended: list[ToolCallEnded] = []
    running = asyncio.Event()

    class SlowBooker(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You book tables.")

        @function_tool
        @guarded(spec=ToolSpec(timeout=cap + 5))
        async def book(self, ctx: RunContext[Any], when: str) -> str:
            """Books a table (a slow provider)."""
            running.set()
            await asyncio.sleep(cap + 0.5)
            return f"booked {when}"

    preamble = "Booking your table now, this takes a moment, please stay on the line."
    calls = [("call_1", "book", {"when": "7pm"})]
    # the call comes first and the preamble plays slowly: the barge-in cuts the speech while the tool runs
    llm_ = ScriptedLLM([Step(preamble, calls, calls_first=True, word_delay=0.2), Step("Still booking."), Step("Done.")])
    recorder, call = await start_call(store, session_id, agent="booker", instructions="You book tables.")
    session: AgentSession[Any] = AgentSession(llm=llm_)
    session.on(
        "tool_execution_updated", lambda ev: ended.append(ev.update) if isinstance(ev.update, ToolCallEnded) else None
    )
    tap = attach(session, call)
    await session.start(SlowBooker())
    session.generate_reply(user_input="book at 7")
    await running.wait()
    session.interrupt()
    for _ in range(int((cap + 3) / 0.05)):
        if ended and len(llm_.seen) >= 2:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    assert ended and ended[0].id != "call_1"  # upstream: released at the cap, the result came later
    live = [
        o.output
        for o in session.current_agent.chat_ctx.items
        if isinstance(o, llm.FunctionCallOutput) and o.call_id == "call_1"
    ]
    assert live == ["booked 7pm"]
    last = llm_.seen[-1]
    assert [o.output for o in last.items if isinstance(o, llm.FunctionCallOutput) and o.call_id == "call_1"] == [
        "booked 7pm"
    ]
    await recorder.flush()
    assert call.call_state("call_1") is not None and call.call_state("call_1").output == "booked 7pm"  # type: ignore[union-attr]
    await session.aclose()
    await tap.drain()
    await recorder.close()
