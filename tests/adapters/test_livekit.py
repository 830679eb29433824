"""The LiveKit adapter on a real ``AgentSession`` and a real ``CallSession`` (SQLite, and PostgreSQL
when ``$CALLTAPE_TEST_PG_URL`` or Docker is there). Each test first shows what livekit-agents 1.8
does on its own, then what calltape keeps.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession, RunContext, function_tool, llm
from livekit.agents.voice import speech_handle as lk_speech_handle

from calltape.adapters.livekit import attach, guarded, rehydrate, wait_for_playout
from calltape.eventstore import EventStore
from calltape.projections import build_context
from calltape.runtime import CallSession, Interrupted, ToolSpec, resume
from tests.adapters.livekit_support import ScriptedLLM, Step, items, start_call

pytestmark = pytest.mark.livekit


def _kinds(native: dict[str, Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for item in native["items"]:
        if item["type"] == "message":
            out.append((item["role"], item["content"].strip()))
        elif item["type"] == "function_call":
            out.append(("function_call", item["call_id"]))
        elif item["type"] == "function_call_output":
            out.append(("function_call_output", (item["call_id"], item["status"], item["output"])))
        else:
            out.append((item["type"], (item["from"], item["to"])))
    return out


async def _durable_context(store: EventStore, call: CallSession) -> dict[str, Any]:
    """The context rebuilt from what the store committed (not the live fold)."""
    await call.recorder.flush()
    fold = await build_context(store, call.session_id)
    return fold.native()


# -------------------------------------------------------------------------------------------------
# livekit/agents#3702: a tool result that lands after session.interrupt()


async def test_tool_result_after_interrupt_lands_in_its_turn(store: EventStore, session_id: str) -> None:
    runs: list[str] = []
    booking = asyncio.Event()

    class Booker(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You book tables.")

        @function_tool
        @guarded
        async def book(self, ctx: RunContext[Any], when: str) -> str:
            """Books a table."""
            runs.append(when)
            booking.set()
            await asyncio.sleep(1.0)
            return f"booked {when}"

    llm_ = ScriptedLLM(
        [Step("Let me book that.", [("call_1", "book", {"when": "7pm"})]), Step("Sure, parking is free.")]
    )
    recorder, call = await start_call(store, session_id, agent="booker", instructions="You book tables.")
    session: AgentSession[Any] = AgentSession(llm=llm_)
    tap = attach(session, call)
    await session.start(Booker())

    session.generate_reply(user_input="book a table at 7")
    await booking.wait()
    session.interrupt()  # barge-in while the booking runs
    await session.generate_reply(user_input="is there parking?")
    # the follow-up was answered while the booking still ran: its result lands after that turn
    assert ("function_call_output", "call_1=booked 7pm") not in items(llm_.seen[-1])
    await asyncio.sleep(1.2)

    # upstream 1.8.9 keeps the result (#6349) but commits it as a late item after the user's next
    # turn; for a guarded call calltape reconciles LiveKit's live context: the output sits right
    # after its call, as in calltape's context
    history = items(session.history)
    at = history.index(("function_call", "call_1"))
    assert history[at + 1] == ("function_call_output", "call_1=booked 7pm")
    assert len(llm_.seen) == 2  # nothing ever answered the result

    native = await _durable_context(store, call)
    assert _kinds(native) == [
        ("system", "You book tables."),
        ("user", "book a table at 7"),
        ("assistant", "Let me book that."),
        ("function_call", "call_1"),
        ("function_call_output", ("call_1", "completed", "booked 7pm")),
        ("user", "is there parking?"),
        ("assistant", "Sure, parking is free."),
    ]
    assert runs == ["7pm"]
    openai = call.context("openai")
    assert [m["role"] for m in openai] == ["system", "user", "assistant", "tool", "user", "assistant"]

    await session.aclose()
    await tap.drain()
    await recorder.close()


# -------------------------------------------------------------------------------------------------
# livekit/agents#5359: wait_for_playout after an interruption


async def test_speech_playout_wait_released_in_ms(store: EventStore, session_id: str) -> None:
    release = asyncio.Event()
    tool_running = asyncio.Event()

    class Booker(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You book tables.")

        @function_tool
        async def book(self, ctx: RunContext[Any], when: str) -> str:
            """Books a table."""
            tool_running.set()
            await release.wait()
            return f"booked {when}"

    llm_ = ScriptedLLM([Step("Let me book that.", [("call_1", "book", {"when": "7pm"})])])
    recorder, call = await start_call(store, session_id, agent="booker")
    session: AgentSession[Any] = AgentSession(llm=llm_)
    tap = attach(session, call)
    await session.start(Booker())

    handle = session.generate_reply(user_input="book at 7")
    await tool_running.wait()

    released: dict[str, float] = {}

    async def upstream() -> None:
        await handle.wait_for_playout()
        released["upstream"] = time.perf_counter()

    async def calltape() -> None:
        with pytest.raises(Interrupted):
            await wait_for_playout(handle)
        released["calltape"] = time.perf_counter()

    waiters = [asyncio.create_task(upstream()), asyncio.create_task(calltape())]
    await asyncio.sleep(0.05)
    interrupted_at = time.perf_counter()
    session.interrupt()
    await asyncio.gather(*waiters)
    upstream_s = released["upstream"] - interrupted_at
    calltape_s = released["calltape"] - interrupted_at
    print(f"\nplayout wait after interrupt: upstream {upstream_s * 1000:.0f} ms, calltape {calltape_s * 1000:.1f} ms")

    assert calltape_s < 0.05
    # upstream waits for the speech to be done: its tool is still running, so LiveKit's
    # INTERRUPTION_TIMEOUT (5 s) force-ends the speech
    assert upstream_s >= lk_speech_handle.INTERRUPTION_TIMEOUT - 0.1
    interruptions = [e for e in await store.read(session_id) if e.type == "interruption"]
    assert len(interruptions) == 1 and interruptions[0].data["cause"] == "api"

    release.set()
    await session.aclose()
    await tap.drain()
    await recorder.close()


async def test_run_context_playout_wait_raises_on_interrupt(store: EventStore, session_id: str) -> None:
    outcome: dict[str, Any] = {}
    started, measured = asyncio.Event(), asyncio.Event()

    class Booker(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You book tables.")

        @function_tool
        async def book(self, ctx: RunContext[Any], when: str) -> str:
            """Books a table once the preamble was heard."""

            async def measure(name: str, aw: Any) -> None:
                try:
                    await aw
                    outcome[name] = ("returned", time.perf_counter())
                except Interrupted:
                    outcome[name] = ("raised", time.perf_counter())

            started.set()
            await asyncio.gather(
                measure("upstream", ctx.wait_for_playout()), measure("calltape", wait_for_playout(ctx))
            )
            measured.set()
            return "not booked" if ctx.speech_handle.interrupted else f"booked {when}"

    # the call comes first, then a slow preamble: the tool waits for the preamble's playout
    preamble = "Sure, let me check the availability for seven pm tonight for you."
    llm_ = ScriptedLLM([Step(preamble, [("call_1", "book", {"when": "7pm"})], calls_first=True, word_delay=0.2)])
    recorder, call = await start_call(store, session_id, agent="booker")
    session: AgentSession[Any] = AgentSession(llm=llm_)
    tap = attach(session, call)
    await session.start(Booker())
    session.generate_reply(user_input="book at 7")
    await started.wait()
    await asyncio.sleep(0.3)
    interrupted_at = time.perf_counter()
    session.interrupt()
    await measured.wait()
    up_kind, up_at = outcome["upstream"]
    ct_kind, ct_at = outcome["calltape"]
    up_ms, ct_ms = (up_at - interrupted_at) * 1000, (ct_at - interrupted_at) * 1000
    print(f"\nRunContext.wait_for_playout: upstream {up_kind} in {up_ms:.1f} ms, calltape {ct_kind} in {ct_ms:.1f} ms")
    assert up_kind == "returned"  # upstream returns as if the preamble had played: the tool cannot tell
    assert ct_kind == "raised" and ct_at - interrupted_at < 0.05
    await session.aclose()
    await tap.drain()
    await recorder.close()


# -------------------------------------------------------------------------------------------------
# Handoff: the second agent keeps the first agent's tool items


@pytest.mark.parametrize("seed", ["upstream", "calltape"])
async def test_handoff_keeps_first_agents_tool_items(store: EventStore, session_id: str, seed: str) -> None:
    recorder, call = await start_call(store, session_id, agent="triage", instructions="You triage.")
    session: AgentSession[Any] = AgentSession()

    class Billing(Agent):
        def __init__(self, chat_ctx: llm.ChatContext | None = None) -> None:
            super().__init__(instructions="You handle billing.", llm=billing_llm, chat_ctx=chat_ctx)

        async def on_enter(self) -> None:
            self.session.generate_reply()

    class Triage(Agent):
        def __init__(self) -> None:
            super().__init__(instructions="You triage.", llm=triage_llm)

        @function_tool
        @guarded
        async def lookup_order(self, ctx: RunContext[Any], order: str) -> str:
            """Looks an order up."""
            return f"order {order}: charged twice"

        @function_tool
        async def transfer_to_billing(self, ctx: RunContext[Any]) -> Agent:
            """Hands the caller to billing."""
            if seed == "upstream":
                # LiveKit's way: pass the chat context along (the Agent filters it by its own tools)
                return Billing(chat_ctx=self.chat_ctx)
            return await rehydrate(Billing(), call.context())

    triage_llm = ScriptedLLM(
        [
            Step("Let me look.", [("call_1", "lookup_order", {"order": "42"})]),
            Step("", [("call_2", "transfer_to_billing", {})]),
        ]
    )
    billing_llm = ScriptedLLM([Step("I see the double charge, refunding now.")])
    tap = attach(session, call)
    await session.start(Triage())
    await session.run(user_input="order 42 was charged twice")
    for _ in range(200):
        if billing_llm.seen:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)

    seen = items(billing_llm.seen[0])
    if seed == "upstream":
        assert ("function_call", "call_1") not in seen
        assert not any(kind == "function_call_output" for kind, _ in seen)
    else:
        assert ("function_call", "call_1") in seen
        assert ("function_call_output", "call_1=order 42: charged twice") in seen

    native = await _durable_context(store, call)
    assert ("handoff", ("triage", "billing")) in _kinds(native)
    assert native["agent"] == "billing"
    assert native["items"][0]["content"] == "You handle billing."
    assert ("function_call_output", ("call_1", "completed", "order 42: charged twice")) in _kinds(native)
    await session.aclose()
    await tap.drain()
    await recorder.close()


# -------------------------------------------------------------------------------------------------
# A session closed mid-tool, resumed into a new AgentSession


async def test_closed_mid_tool_resumes_into_new_session(store: EventStore, session_id: str) -> None:
    runs: list[str] = []
    in_tool = asyncio.Event()

    class Booker(Agent):
        def __init__(self, llm_: ScriptedLLM) -> None:
            super().__init__(instructions="You book tables.", llm=llm_)

        @function_tool
        @guarded
        async def book(self, ctx: RunContext[Any], when: str) -> str:
            """Books a table (charges a deposit)."""
            runs.append(when)
            in_tool.set()
            await asyncio.sleep(3600)  # the payment provider hangs
            return f"booked {when}"

    tools = {"book": ToolSpec(timeout=60)}
    first_llm = ScriptedLLM([Step("Booking now.", [("call_1", "book", {"when": "7pm"})])])
    recorder, call = await start_call(store, session_id, agent="booker", instructions="You book tables.", tools=tools)
    first: AgentSession[Any] = AgentSession()
    tap = attach(first, call)
    await first.start(Booker(first_llm))
    first.generate_reply(user_input="book at 7")
    await in_tool.wait()
    # the crash comes after the agent said so: LiveKit runs the tool while the reply's text is still
    # streaming (on a loaded machine the tool may start first)
    said = asyncio.Event()

    def hear(_: Any) -> None:
        if ("assistant", "Booking now.") in _kinds(call.context()):
            said.set()

    call.add_listener(hear)
    hear(None)
    await asyncio.wait_for(said.wait(), 10)
    call.remove_listener(hear)

    # upstream: what the session knows mid-tool (what a crash leaves to recover from)
    assert ("function_call", "call_1") not in items(first.history)

    # the agent process is lost mid-tool: nothing more reaches the log, the tool never returns
    # (LiveKit names the task running a tool body `tool_exec_<name>`)
    tap.detach()
    await recorder.close()
    for task in [t for t in asyncio.all_tasks() if t.get_name() == "tool_exec_book"]:
        task.cancel()
    await first.aclose()

    plan = await resume(store, session_id, "booker", tools=tools)
    assert [(t.call_id, t.decision) for t in plan.tools] == [("call_1", "unknown")]

    second_llm = ScriptedLLM([Step("The booking may have gone through; let me check before retrying.")])
    recorder2 = await _recorder(store)
    call2 = await CallSession.attach(recorder2, session_id, tools=tools)
    second: AgentSession[Any] = AgentSession()
    tap2 = attach(second, call2)
    await second.start(await rehydrate(Booker(second_llm), plan))
    await second.run(user_input="did it go through?")

    seen = items(second_llm.seen[0])
    assert seen[1:] == [
        ("user", "book at 7"),
        ("assistant", "Booking now. "),
        ("function_call", "call_1"),
        ("function_call_output", 'call_1={"status": "unknown"}'),
        ("user", "did it go through?"),
    ]
    assert runs == ["7pm"]  # never run twice
    native = await _durable_context(store, call2)
    assert native["epoch"] == 2
    assert ("function_call_output", ("call_1", "unknown", {"status": "unknown"})) in _kinds(native)
    assert _kinds(native)[-2:] == [
        ("user", "did it go through?"),
        ("assistant", "The booking may have gone through; let me check before retrying."),
    ]
    await second.aclose()
    await tap2.drain()
    await recorder2.close()


async def _recorder(store: EventStore) -> Any:
    from calltape.eventstore.recorder import Recorder

    recorder = Recorder(store)
    await recorder.start()
    return recorder
