"""The effect API (SPEC section 8) in the runtime: at most once across call ids, resumes and handoffs,
heard first, failures, timeouts, reconcile; on both backends, with the check rules run on every log."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from runtime.runtime_support import live_call, reply

import calltape
from calltape.checks import check_events
from calltape.eventstore import EventStore
from calltape.projections import build_context
from calltape.runtime import CallSession, Reconciled, ToolOutcome, resume


class Bank:
    """The real system behind the effect: counts charges, can fail, hang, or be unsure."""

    def __init__(self) -> None:
        self.charges: list[str] = []
        self.fail_next = False
        self.hang = False
        self.entered = asyncio.Event()

    async def charge(self, order: str) -> dict[str, Any]:
        self.entered.set()
        if self.hang:
            await asyncio.sleep(3600)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("card declined")
        self.charges.append(order)
        return {"charge": f"ch_{len(self.charges)}", "order": order}


def charge_tool(bank: Bank, order: str = "order-7", **options: Any) -> Any:
    async def body() -> Any:
        return await calltape.effect("charge", order, lambda: bank.charge(order), **options)

    return body


async def ask(call: CallSession, cid: str, rid: str, body: Any, text: str | None = "Charging now.") -> ToolOutcome:
    reply(call, rid, text, (cid, "charge_card", {"order": 7}))
    return await call.run_tool(cid, "charge_card", {"order": 7}, body)


async def announcing(call: CallSession, cid: str, rid: str, bank: Bank) -> asyncio.Future[ToolOutcome]:
    """A heard-first charge asked in reply ``rid``, waiting for the announcement (nothing charged yet)."""
    running = asyncio.ensure_future(ask(call, cid, rid, charge_tool(bank, heard=True)))
    await asyncio.sleep(0.05)
    assert not running.done() and bank.charges == []
    return running


def played(call: CallSession, rid: str) -> None:
    call.emit("agent.speech.started", {"reply": rid})
    call.emit("agent.speech.ended", {"reply": rid, "interrupted": False})


async def checked(store: EventStore, session_id: str) -> list[tuple[str, int]]:
    return [(v.rule, v.seq) for v in check_events(await store.read(session_id))]


def effect_phases(events: list[Any]) -> list[tuple[str, str]]:
    return [(e.data["call"], e.data["phase"]) for e in events if e.type == "tool.effect"]


async def test_once_per_key_whatever_the_call_id(store: EventStore, session_id: str) -> None:
    bank = Bank()
    async with live_call(store, session_id) as live:
        first = await ask(live.call, "c1", "r1", charge_tool(bank))
        # a barge-in and the LLM asks again under a new call id: the recorded output answers
        second = await ask(live.call, "c2", "r2", charge_tool(bank))
        other = await ask(live.call, "c3", "r3", charge_tool(bank, "order-8"))
        await live.call.end()
    assert bank.charges == ["order-7", "order-8"]
    assert first.status == second.status == "completed" and first.output == second.output
    assert other.output["order"] == "order-8"
    log = await store.read(session_id)
    assert effect_phases(log) == [("c1", "started"), ("c1", "done"), ("c3", "started"), ("c3", "done")]
    assert await checked(store, session_id) == []
    assert "effect_reused" in live.kinds()


async def test_outside_a_guarded_tool_it_says_so() -> None:
    async def act() -> int:
        return 1

    with pytest.raises(RuntimeError, match="inside a guarded tool"):
        await calltape.effect("charge", "k", act)


async def test_heard_first_waits_for_the_announcement(store: EventStore, session_id: str) -> None:
    bank = Bank()
    async with live_call(store, session_id) as live:
        call = live.call
        running = await announcing(call, "c1", "r1", bank)
        played(call, "r1")
        outcome = await asyncio.wait_for(running, 5)
        await call.end()
    assert outcome.status == "completed" and bank.charges == ["order-7"]
    assert await checked(store, session_id) == []


async def test_an_announcement_heard_before_the_tool_asked_runs_at_once(store: EventStore, session_id: str) -> None:
    """LiveKit marks a step's reply done only after its tools ran: a tool that asks once the
    announcement has played must not wait for that (it would wait for itself)."""
    bank = Bank()
    async with live_call(store, session_id) as live:
        call = live.call
        reply(call, "r1", "Charging now.", ("c1", "charge_card", {"order": 7}), done=False)
        played(call, "r1")
        asked = call.run_tool("c1", "charge_card", {"order": 7}, charge_tool(bank, heard=True))
        outcome = await asyncio.wait_for(asked, 5)
        call.emit("agent.reply.done", {"reply": "r1"})
        await call.end()
    assert outcome.status == "completed" and bank.charges == ["order-7"]
    assert await checked(store, session_id) == []


async def test_a_barge_in_before_the_end_of_the_announcement_means_not_run(store: EventStore, session_id: str) -> None:
    bank = Bank()
    async with live_call(store, session_id) as live:
        call = live.call
        running = await announcing(call, "c1", "r1", bank)
        call.emit("agent.speech.started", {"reply": "r1"})
        call.interrupt("r1", heard="Charging")  # the caller says stop
        outcome = await asyncio.wait_for(running, 5)
        # the LLM asks again in its next reply, which plays out: now it runs, once
        again = await announcing(call, "c2", "r2", bank)
        played(call, "r2")
        assert (await asyncio.wait_for(again, 5)).status == "completed"
        await call.end()
    assert outcome.status == "cancelled" and outcome.output == {"status": "cancelled", "reason": "interrupted"}
    assert bank.charges == ["order-7"]
    log = await store.read(session_id)
    (cancel,) = [e for e in log if e.type == "tool.cancelled"]
    assert cancel.data == {"call": "c1", "reason": "interrupted", "outcome": "not_run"}
    assert effect_phases(log) == [("c2", "started"), ("c2", "done")]
    assert await checked(store, session_id) == []


async def test_failed_runs_again_timeout_is_unknown_and_reconcile_settles(store: EventStore, session_id: str) -> None:
    bank = Bank()
    bank.fail_next = True
    async with live_call(store, session_id) as live:
        call = live.call
        failed = await ask(call, "c1", "r1", charge_tool(bank))
        retried = await ask(call, "c2", "r2", charge_tool(bank))  # failed: it may run again
        assert failed.status == "error" and retried.status == "completed" and bank.charges == ["order-7"]
        bank.hang = True
        timed_out = await ask(call, "c3", "r3", charge_tool(bank, "order-9", timeout=0.1))
        bank.hang = False
        refused = await ask(call, "c4", "r4", charge_tool(bank, "order-9"))
        assert timed_out.status == refused.status == "unknown" and bank.charges == ["order-7"]

        async def said_no(name: str, key: str) -> Reconciled:
            return Reconciled(happened=False)

        after_check = await ask(call, "c5", "r5", charge_tool(bank, "order-9", reconcile=said_no))
        await call.end()
    assert after_check.status == "completed" and bank.charges == ["order-7", "order-9"]
    log = await store.read(session_id)
    assert effect_phases(log) == [
        ("c1", "started"),
        ("c1", "failed"),
        ("c2", "started"),
        ("c2", "done"),
        ("c3", "started"),
        ("c3", "unknown"),
        ("c5", "failed"),  # the reconcile hook's verdict
        ("c5", "started"),
        ("c5", "done"),
    ]
    cancels = [e.data for e in log if e.type == "tool.cancelled"]
    assert {"call": "c4", "reason": "effect_unknown", "outcome": "unknown"} in cancels
    assert await checked(store, session_id) == []


async def test_resume_settles_a_started_effect_to_unknown_and_never_reruns_it(
    store: EventStore, session_id: str
) -> None:
    bank = Bank()
    bank.hang = True
    async with live_call(store, session_id) as live:
        running = asyncio.ensure_future(ask(live.call, "c1", "r1", charge_tool(bank, timeout=60)))
        await asyncio.wait_for(bank.entered.wait(), 5)  # the charge is under way
        await live.recorder.flush()
        await live.call.drop("worker lost")
        plan = await resume(store, session_id, "billing-2")
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    log = await store.read(session_id)
    resumed_at = next(e.seq for e in log if e.type == "session.resumed")
    unknown = next(e for e in log if e.type == "tool.effect" and e.data["phase"] == "unknown")
    assert unknown.seq is not None and unknown.seq < resumed_at  # settled before session.resumed
    assert plan.tools[0].decision == "unknown"
    bank.hang = False
    async with live_call(store, session_id, attach=True) as live:
        again = await ask(live.call, "c2", "r2", charge_tool(bank))  # the resumed LLM asks again
        await live.call.end()
    assert again.status == "unknown" and bank.charges == []
    assert await checked(store, session_id) == []


async def test_resume_asks_the_reconcile_hook(store: EventStore, session_id: str) -> None:
    bank = Bank()
    bank.hang = True
    async with live_call(store, session_id) as live:
        running = asyncio.ensure_future(ask(live.call, "c1", "r1", charge_tool(bank, timeout=60)))
        await asyncio.wait_for(bank.entered.wait(), 5)
        await live.recorder.flush()
        await live.call.drop()

        async def it_happened(name: str, key: str) -> Reconciled:
            return Reconciled(happened=True, output={"charge": "ch_real", "order": key})

        await resume(store, session_id, "billing-2", effects={"charge": it_happened})
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    async with live_call(store, session_id, attach=True) as live:
        again = await ask(live.call, "c2", "r2", charge_tool(bank))
        await live.call.end()
    assert again.output == {"charge": "ch_real", "order": "order-7"} and bank.charges == []
    assert await checked(store, session_id) == []


async def test_a_handoff_does_not_run_it_again(store: EventStore, session_id: str) -> None:
    bank = Bank()
    async with live_call(store, session_id) as live:
        await ask(live.call, "c1", "r1", charge_tool(bank))
        await live.call.handoff("billing-2")
        again = await ask(live.call, "c2", "r2", charge_tool(bank))
        await live.call.end()
    assert again.status == "completed" and bank.charges == ["order-7"]
    fold = await build_context(store, session_id)
    assert fold.agent == "billing-2"
    assert await checked(store, session_id) == []


async def test_the_effect_reads_only_the_sessions_effect_events(store: EventStore, session_id: str) -> None:
    """The tool's read of the log is on the voice loop's path: a long call's other events are filtered by
    the database, not fetched and dropped (issue 32: a 1-hour call was ~50k events read per tool call)."""
    bank = Bank()
    async with live_call(store, session_id) as live:
        for i in range(300):
            live.call.emit("user.text", {"text": f"words {i}"})
        first = await ask(live.call, "c1", "r1", charge_tool(bank))
        read = store.read
        fetched: list[list[str]] = []

        async def counting(session: str, **options: Any) -> list[Any]:
            events = await read(session, **options)
            fetched.append([e.type for e in events])
            return events

        store.read = counting  # type: ignore[method-assign]
        try:
            again = await ask(live.call, "c2", "r2", charge_tool(bank))
        finally:
            del store.read
        await live.call.end()
    assert first.output == again.output and bank.charges == ["order-7"]
    assert fetched and all(types == ["tool.effect", "tool.effect"] for types in fetched)
