"""Resume (SPEC section 4) of sessions dropped at every kind of point, on SQLite and PostgreSQL.

Every resume is checked by :func:`runtime_support.assert_resumed`: the plan's context equals the
context replayed from the log after the resume (native, or the provider format the plan was asked
in), the plan JSON has exactly the SPEC keys, the epoch rose by one, and a zombie writer at the old
epoch is rejected both by the store and through its own Recorder.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from runtime_support import (
    Body,
    Live,
    assert_resumed,
    assistant_then_outputs,
    collecting_bus,
    live_call,
    log_of,
    output_of,
    reply,
    types_of,
)

from calltape.errors import ConcurrencyConflict, FencedWrite, SessionNotFound
from calltape.events import Event
from calltape.eventstore import EventStore, open_store
from calltape.projections import ToolCallState, build_context, snapshot_now
from calltape.runtime import ResumePlan, ToolSpec, resume


async def last_seq(live: Live, store: EventStore) -> int:
    await live.recorder.flush()
    info = await store.session_info(live.call.session_id)
    assert info is not None
    return info.last_seq


async def stop(task: asyncio.Task[Any]) -> None:
    """The old process's tool task is gone: cancel it and let it finish (whatever it raises)."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def assistant_texts(native: dict[str, Any]) -> list[tuple[str, bool]]:
    return [
        (i["content"], bool(i.get("interrupted")))
        for i in native["items"]
        if i["type"] == "message" and i["role"] == "assistant"
    ]


def user_texts(native: dict[str, Any]) -> list[str]:
    return [i["content"] for i in native["items"] if i["type"] == "message" and i["role"] == "user"]


def settling(plan: ResumePlan) -> list[tuple[str, dict[str, Any]]]:
    """The events resume appended, but the trailing ``session.resumed`` and its ``x.recovery``."""
    events = [(e.type, e.data) for e in plan.events]
    assert [t for t, _ in events[-2:]] == ["session.resumed", "x.recovery"]
    return events[:-2]


@dataclass
class Point:
    """A drop point: what the dropped process did, and what resume must make of it."""

    checkpoint: int = 0
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    body: Body | None = None
    task: asyncio.Task[Any] | None = None
    check: Callable[[ResumePlan, dict[str, Any]], None] = lambda plan, after: None
    then: Callable[[Live], Awaitable[None]] | None = None


# -- the drop points ---------------------------------------------------------------------------


async def mid_user_utterance(live: Live, store: EventStore) -> Point:
    call = live.call
    call.emit("user.transcript", {"text": "Hi, I'd like a table.", "final": True})
    reply(call, "r1", "Sure, for how many?")
    call.emit("agent.speech.started", {"reply": "r1"})
    call.emit("agent.speech.ended", {"reply": "r1", "interrupted": False})
    point = Point(checkpoint=await last_seq(live, store))
    call.emit("user.speech.started", {"source": "vad"})
    call.emit("user.transcript", {"text": "for four at", "final": False})
    await call.drop("transport lost")
    dropped = (await build_context(store, call.session_id)).native()
    assert dropped["pending"]["user_text"] == "for four at" and not dropped["clean"]

    def check(plan: ResumePlan, after: dict[str, Any]) -> None:
        assert settling(plan) == []  # nothing of the agent's was open; resume clears the STT state
        assert plan.tools == []
        assert after["pending"] == {"user_text": None, "tools": []}
        assert user_texts(after) == ["Hi, I'd like a table."]
        assert assistant_texts(after) == [("Sure, for how many?", False)]
        assert after["clean"] is True

    point.check = check
    return point


async def mid_generation(live: Live, store: EventStore) -> Point:
    call = live.call
    call.emit("user.text", {"text": "What's on the menu?"})
    point = Point(checkpoint=await last_seq(live, store))
    reply(call, "r1", "Tonight we have", done=False)
    await call.drop()

    def check(plan: ResumePlan, after: dict[str, Any]) -> None:
        assert settling(plan) == [("interruption", {"reply": "r1", "cause": "system"})]
        assert assistant_texts(after) == []  # never spoken: nothing was heard (rules 3 and 6)
        assert user_texts(after) == ["What's on the menu?"]
        assert after["clean"] is True

    point.check = check
    return point


async def mid_playout(live: Live, store: EventStore) -> Point:
    call = live.call
    call.emit("user.text", {"text": "Book two at eight."})
    point = Point(checkpoint=await last_seq(live, store))
    reply(call, "r1", "Your table for two is booked for eight tonight.")
    call.emit("agent.speech.started", {"reply": "r1"})
    call.emit("agent.speech.progress", {"reply": "r1", "heard": "Your table for two"})
    await call.drop()

    def check(plan: ResumePlan, after: dict[str, Any]) -> None:
        assert settling(plan) == [
            ("agent.speech.ended", {"reply": "r1", "interrupted": True, "heard": "Your table for two"})
        ]
        assert assistant_texts(after) == [("Your table for two", True)]
        assert after["clean"] is True

    point.check = check
    return point


async def _tool_in_flight(live: Live, store: EventStore, name: str) -> Point:
    call = live.call
    call.emit("user.text", {"text": "Charge my card."})
    point = Point(checkpoint=await last_seq(live, store))
    reply(call, "r1", None, ("t1", name, {"amount": 42}))
    point.body = body = Body({"charged": 42}, gated=True)

    async def with_progress(progress: Any) -> Any:
        progress({"step": "authorized"}, "card authorized")
        return await body()

    point.task = asyncio.create_task(call.run_tool("t1", name, {"amount": 42}, with_progress))
    await body.started.wait()
    await call.drop()
    return point


async def mid_tool_unknown(live: Live, store: EventStore) -> Point:
    point = await _tool_in_flight(live, store, "charge")

    def check(plan: ResumePlan, after: dict[str, Any]) -> None:
        assert settling(plan) == [("tool.cancelled", {"call": "t1", "reason": "dropped", "outcome": "unknown"})]
        assert plan.to_json()["tools"] == [
            {
                "call_id": "t1",
                "name": "charge",
                "status": "unknown",
                "decision": "unknown",
                "progress": {"step": "authorized"},
            }
        ]
        assert output_of(after, "t1")["output"] == {"status": "unknown"}
        assert after["clean"] is True

    async def then(fresh: Live) -> None:
        # The zombie's body finishes after the resume: its result is fenced, not delivered.
        assert point.body is not None and point.task is not None
        point.body.release()
        with pytest.raises(FencedWrite):
            await point.task
        # The new agent, asked for the same call, never runs it again (outcome unknown).
        again = Body()
        outcome = await fresh.call.run_tool("t1", "charge", {"amount": 42}, again)
        assert (again.runs, outcome.ran, outcome.status) == (0, False, "unknown")
        assert "tool.result" not in types_of(await log_of(fresh.recorder.store, fresh.call.session_id))

    point.check, point.then = check, then
    return point


async def mid_tool_idempotent(live: Live, store: EventStore) -> Point:
    point = await _tool_in_flight(live, store, "lookup")
    point.tools = {"lookup": ToolSpec(idempotent=True)}

    def check(plan: ResumePlan, after: dict[str, Any]) -> None:
        assert settling(plan) == []  # nothing cancelled: the new agent runs it again
        assert plan.to_json()["tools"] == [
            {
                "call_id": "t1",
                "name": "lookup",
                "status": "in_progress",
                "decision": "retry",
                "progress": {"step": "authorized"},
            }
        ]
        assert output_of(after, "t1")["status"] == "in_progress"
        assert after["pending"]["tools"] == [{"call_id": "t1", "name": "lookup", "status": "in_progress"}]

    async def then(fresh: Live) -> None:
        assert point.task is not None
        await stop(point.task)  # the old process is gone
        retry = Body({"menu": ["soup"]})
        outcome = await fresh.call.run_tool("t1", "lookup", {"amount": 42}, retry)
        assert (retry.runs, outcome.ran, outcome.status) == (1, True, "completed")
        await fresh.recorder.flush()
        native = (await build_context(fresh.recorder.store, fresh.call.session_id)).native()
        assert output_of(native, "t1")["output"] == {"menu": ["soup"]} and native["clean"]

    point.check, point.then = check, then
    return point


async def mid_tool_never_started(live: Live, store: EventStore) -> Point:
    call = live.call
    call.emit("user.text", {"text": "Book two at eight."})
    point = Point(checkpoint=await last_seq(live, store))
    reply(call, "r1", None, ("t1", "book", {"people": 2}))  # asked, never started
    await call.drop()

    def check(plan: ResumePlan, after: dict[str, Any]) -> None:
        assert settling(plan) == []
        assert plan.to_json()["tools"] == [
            {"call_id": "t1", "name": "book", "status": "in_progress", "decision": "retry"}
        ]
        assert output_of(after, "t1")["output"] == {"status": "in_progress"}

    async def then(fresh: Live) -> None:
        body = Body({"booking": "B-5"})
        outcome = await fresh.call.run_tool("t1", "book", {"people": 2}, body)
        assert (body.runs, outcome.ran, outcome.status) == (1, True, "completed")

    point.check, point.then = check, then
    return point


async def after_late_result(live: Live, store: EventStore) -> Point:
    call = live.call
    call.emit("user.text", {"text": "Book two at eight."})
    point = Point(checkpoint=await last_seq(live, store))
    reply(call, "r1", "Let me check that.", ("t1", "book", {"people": 2}))
    call.emit("agent.speech.started", {"reply": "r1"})
    body = point.body = Body({"booking": "B-8"}, gated=True)
    task = asyncio.create_task(call.run_tool("t1", "book", {"people": 2}, body))
    await body.started.wait()
    call.interrupt(heard="Let me")
    call.emit("user.speech.started", {})
    call.emit("user.transcript", {"text": "no wait", "final": False})
    body.release()
    assert (await task).status == "completed"  # the late result lands while the user talks
    await call.drop()

    def check(plan: ResumePlan, after: dict[str, Any]) -> None:
        assert settling(plan) == []
        assert plan.to_json()["tools"] == [
            {"call_id": "t1", "name": "book", "status": "completed", "decision": "reuse"}
        ]
        assistant_then_outputs(after, ["t1"])
        assert output_of(after, "t1")["output"] == {"booking": "B-8"}
        assert assistant_texts(after) == [("Let me", True)]
        assert after["pending"]["user_text"] is None and after["clean"] is True

    async def then(fresh: Live) -> None:
        outcome = await fresh.call.run_tool("t1", "book", {"people": 2}, body)
        assert (body.runs, outcome.ran, outcome.output) == (1, False, {"booking": "B-8"})

    point.check, point.then = check, then
    return point


POINTS = {
    "mid_user_utterance": mid_user_utterance,
    "mid_generation": mid_generation,
    "mid_playout": mid_playout,
    "mid_tool_unknown": mid_tool_unknown,
    "mid_tool_idempotent_retry": mid_tool_idempotent,
    "mid_tool_never_started_retry": mid_tool_never_started,
    "after_late_result": after_late_result,
}


@pytest.mark.parametrize("fmt", ["native", "openai"])
@pytest.mark.parametrize("where", list(POINTS))
async def test_resume_after_a_drop(store: EventStore, store_url: str, session_id: str, where: str, fmt: str) -> None:
    bus, reported = collecting_bus()
    async with live_call(store, session_id) as zombie:
        point = await POINTS[where](zombie, store)
        await zombie.recorder.flush()
        before = await log_of(store, session_id)

        plan = await resume(store, session_id, "backup", tools=point.tools, format=fmt, bus=bus)

        assert plan.checkpoint_seq == point.checkpoint
        assert plan.agent == "backup" and not plan.dry_run
        assert plan.events[0].seq == before[-1].seq + 1  # appended right after the old tail
        await assert_resumed(store, store_url, session_id, plan, old_epoch=1, zombie=zombie, format=fmt)
        assert plan.fold is not None
        point.check(plan, plan.fold.native())

        (rec,) = reported
        assert rec.kind == "resume" and rec.figures["checkpoint_seq"] == point.checkpoint
        assert rec.figures["epoch"] == 2 and rec.figures["duration_ms"] >= 0
        decisions = [t.decision for t in plan.tools]
        assert [rec.figures[k] for k in ("retry", "unknown", "reuse")] == [
            decisions.count(k) for k in ("retry", "unknown", "reuse")
        ]

        # The new agent continues the call at the new epoch.
        async with live_call(store, session_id, attach=True, tools=point.tools) as fresh:
            assert fresh.call.epoch == 2 and fresh.call.agent == "backup"
            if point.then is not None:
                await point.then(fresh)
            fresh.call.emit("user.text", {"text": "Are you still there?"})
            await fresh.recorder.flush()
            assert fresh.rejected == []
        if point.task is not None and not point.task.done():
            await stop(point.task)
    # The zombie's recorder never got an event in after the resume.
    events = await log_of(store, session_id)
    resumed_at = plan.resumed_at_seq
    assert all(e.epoch != 1 for e in events if (e.seq or 0) > resumed_at)


# -- reconcile ---------------------------------------------------------------------------------


@pytest.mark.parametrize("found", [True, False])
async def test_reconcile_turns_unknown_into_a_result(
    store: EventStore, store_url: str, session_id: str, found: bool
) -> None:
    asked: list[ToolCallState] = []

    async def reconcile(state: ToolCallState) -> Any:
        asked.append(state)
        return {"booking": "B-77", "found_by": "idempotency key"} if found else None

    async with live_call(store, session_id) as zombie:
        point = await _tool_in_flight(zombie, store, "book")
        await zombie.recorder.flush()
        plan = await resume(store, session_id, "backup", tools={"book": ToolSpec(reconcile=reconcile)})
        after = await assert_resumed(store, store_url, session_id, plan, old_epoch=1, zombie=zombie)
        assert point.task is not None
        await stop(point.task)

    (state,) = asked
    assert (state.call_id, state.name, state.started, state.progress) == ("t1", "book", True, {"step": "authorized"})
    (decision,) = plan.to_json()["tools"]
    if found:
        assert settling(plan) == [
            (
                "tool.result",
                {"call": "t1", "output": {"booking": "B-77", "found_by": "idempotency key"}, "reconciled": True},
            )
        ]
        assert (decision["decision"], decision["status"]) == ("reuse", "completed")
        assert output_of(after, "t1")["output"] == {"booking": "B-77", "found_by": "idempotency key"}
    else:
        assert (decision["decision"], decision["status"]) == ("unknown", "unknown")
        assert output_of(after, "t1")["output"] == {"status": "unknown"}


# -- dry run, live sessions, races -------------------------------------------------------------


@pytest.mark.parametrize("snapshot", [False, True], ids=["no_snapshot", "snapshot"])
@pytest.mark.parametrize("where", ["mid_tool_unknown", "after_late_result", "mid_playout"])
async def test_a_resume_reads_the_call_once(
    store: EventStore, store_url: str, session_id: str, where: str, snapshot: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plan's tail (after the checkpoint) is the end of what the fold was built from: it is not read again.
    async with live_call(store, session_id) as zombie:
        point = await POINTS[where](zombie, store)
        await zombie.recorder.flush()
        if snapshot:  # the fold then starts at the snapshot, at or before the checkpoint
            assert 0 < await snapshot_now(store, session_id) <= point.checkpoint
        reads: list[tuple[int, int | None]] = []
        read = store.read

        async def counted(session: str, **kw: Any) -> list[Event]:
            reads.append((kw.get("after_seq", 0), kw.get("to_seq")))
            return await read(session, **kw)

        monkeypatch.setattr(store, "read", counted)
        plan = await resume(store, session_id, "backup", tools=point.tools)
        monkeypatch.undo()

        assert len(reads) == 1 and reads[0][0] <= point.checkpoint, reads
        assert plan.checkpoint_seq == point.checkpoint
        await assert_resumed(store, store_url, session_id, plan, old_epoch=1, zombie=zombie)
        assert plan.fold is not None
        point.check(plan, plan.fold.native())
        if point.task is not None and not point.task.done():
            await stop(point.task)


async def test_dry_run_appends_nothing(store: EventStore, store_url: str, session_id: str) -> None:
    bus, reported = collecting_bus()
    async with live_call(store, session_id) as zombie:
        point = await mid_tool_unknown(zombie, store)
        await zombie.recorder.flush()
        before = await log_of(store, session_id)
        info = await store.session_info(session_id)

        dry = await resume(store, session_id, "backup", dry_run=True, bus=bus)
        assert dry.dry_run and reported == []
        assert await log_of(store, session_id) == before
        assert await store.session_info(session_id) == info
        assert dry.epoch == 2 and [t.decision for t in dry.tools] == ["unknown"]
        # A dry run fences nobody: the old writer still writes.
        await zombie.call.emit_durable("user.text", {"text": "Hello?"})
        assert zombie.rejected == []

        dry = await resume(store, session_id, "backup", dry_run=True)
        real = await resume(store, session_id, "backup")
        # The real resume makes exactly the plan the dry run showed.
        assert real.context == dry.context
        assert (real.checkpoint_seq, real.resumed_at_seq, real.epoch) == (
            dry.checkpoint_seq,
            dry.resumed_at_seq,
            dry.epoch,
        )
        assert [t.to_json() for t in real.tools] == [t.to_json() for t in dry.tools]
        assert [(e.type, e.data, e.seq) for e in real.events] == [(e.type, e.data, e.seq) for e in dry.events]
        await assert_resumed(store, store_url, session_id, real, old_epoch=1, zombie=zombie)
        assert point.task is not None
        await stop(point.task)


async def test_resume_of_a_live_session_fences_the_old_writer(
    store: EventStore, store_url: str, session_id: str
) -> None:
    """An operator moves a call that is not dropped: the old agent is fenced all the same."""
    async with live_call(store, session_id) as old:
        call = old.call
        call.emit("user.text", {"text": "Book two at eight."})
        reply(call, "r1", "Booked for eight.")
        call.emit("agent.speech.started", {"reply": "r1"})
        call.emit("agent.speech.progress", {"reply": "r1", "heard": "Booked"})
        await old.recorder.flush()
        info = await store.session_info(session_id)
        assert info is not None and info.status == "active"

        plan = await resume(store, session_id, "supervisor", instructions="You are the supervisor.")
        after = await assert_resumed(store, store_url, session_id, plan, old_epoch=1, zombie=old)
        assert after["items"][0] == {"type": "message", "role": "system", "content": "You are the supervisor."}
        assert assistant_texts(after) == [("Booked", True)]
        # A durable write of the old agent fails loudly too.
        with pytest.raises(FencedWrite):
            await call.emit_durable("agent.text", {"reply": "r1", "text": " Anything else?"})


async def test_resume_twice_raises_the_epoch_each_time(store: EventStore, store_url: str, session_id: str) -> None:
    async with live_call(store, session_id) as first:
        await mid_playout(first, store)
        await first.recorder.flush()
        await resume(store, session_id, "second")
    async with live_call(store, session_id, attach=True) as second:
        assert second.call.epoch == 2
        reply(second.call, "r2", "Where were we?")
        second.call.emit("agent.speech.started", {"reply": "r2"})
        await second.call.drop()
        plan = await resume(store, session_id, "third")
        assert plan.epoch == 3
        await assert_resumed(store, store_url, session_id, plan, old_epoch=2, zombie=second)


def _plan_both_before_either_appends(*stores: EventStore) -> None:
    """Holds each store's first append until every racer has made its plan.

    Without it a loaded machine can run one resume to the end before the other reads the log; the
    second then sees a finished resume and takes the call over (``take_over=True``, as an operator
    moving a call would), which is not the race this test is about."""
    barrier = asyncio.Barrier(len(stores))
    for store in stores:
        first_append = store.append

        async def gated(events: Any, *, _append: Any = first_append, _store: Any = store, **kwargs: Any) -> Any:
            _store.append = _append  # only the first append waits: a re-plan goes straight through
            await barrier.wait()
            return await _append(events, **kwargs)

        store.append = gated  # type: ignore[method-assign]


async def test_two_agents_racing_to_resume_exactly_one_wins(store_url: str, session_id: str) -> None:
    stores = [await open_store(store_url) for _ in range(3)]
    try:
        for round_ in range(3):
            sid = f"{session_id}-{round_}"
            async with live_call(stores[0], sid) as zombie:
                point = await mid_tool_unknown(zombie, stores[0])
                await zombie.recorder.flush()
                _plan_both_before_either_appends(stores[1], stores[2])
                results = await asyncio.gather(
                    resume(stores[1], sid, "agent-a"), resume(stores[2], sid, "agent-b"), return_exceptions=True
                )
                plans = [r for r in results if isinstance(r, ResumePlan)]
                errors = [r for r in results if isinstance(r, BaseException)]
                assert len(plans) == 1 and len(errors) == 1, results
                assert isinstance(errors[0], ConcurrencyConflict), repr(errors[0])
                events = await log_of(stores[0], sid)
                (resumed,) = [e for e in events if e.type == "session.resumed"]
                assert resumed.data["agent"] == plans[0].agent and resumed.seq == plans[0].resumed_at_seq
                assert types_of(events).count("tool.cancelled") == 1  # the loser settled nothing
                await assert_resumed(stores[0], store_url, sid, plans[0], old_epoch=1, zombie=zombie)
                assert point.task is not None
                await stop(point.task)
    finally:
        for s in stores:
            await s.close()


async def test_resume_of_an_unknown_session(store: EventStore) -> None:
    with pytest.raises(SessionNotFound):
        await resume(store, "no-such-call", "backup")


async def test_a_resume_past_a_long_tail_leaves_a_snapshot_for_the_next(store: EventStore, session_id: str) -> None:
    # A call resumed again and again reads only what came after the last resume's snapshot.
    from calltape.events import make_event
    from calltape.projections import FOLD_VERSION

    first = [make_event(session_id, "session.started", {"agent": "triage"})]
    turns = [make_event(session_id, "user.text", {"text": f"turn {i}"}) for i in range(300)]
    await store.append([*first, *turns, make_event(session_id, "session.dropped", {"reason": "transport lost"})])
    assert await store.load_snapshot(session_id, FOLD_VERSION) is None
    await resume(store, session_id, "backup")
    saved = await store.load_snapshot(session_id, FOLD_VERSION)
    assert saved is not None and 200 <= saved[0] <= 302
