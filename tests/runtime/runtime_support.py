"""Helpers for the runtime tests: a live call on a real Recorder, tool bodies that count their runs,
recovery collectors and the resume invariants every resume test checks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from calltape.errors import CalltapeError, FencedWrite
from calltape.events import Event, make_event
from calltape.eventstore import EventStore, open_store
from calltape.eventstore.recorder import Recorder
from calltape.projections import build_context, render
from calltape.runtime import CallSession, Recovery, RecoveryBus, ResumePlan, ToolSpec

PLAN_KEYS = {"session", "agent", "epoch", "checkpoint_seq", "resumed_at_seq", "context", "tools"}
TOOL_KEYS = {"call_id", "name", "status", "decision"}


@dataclass
class Live:
    """One process's view of a call: its recorder, its CallSession, what its recorder rejected and what
    its recovery bus reported."""

    recorder: Recorder
    call: CallSession
    bus: RecoveryBus
    recoveries: list[Recovery] = field(default_factory=list)
    rejected: list[tuple[list[Event], CalltapeError]] = field(default_factory=list)

    def kinds(self) -> list[str]:
        return [r.kind for r in self.recoveries]

    def of(self, kind: str) -> list[Recovery]:
        return [r for r in self.recoveries if r.kind == kind]


def collecting_bus() -> tuple[RecoveryBus, list[Recovery]]:
    got: list[Recovery] = []
    return RecoveryBus(sinks=[got.append]), got


@contextlib.asynccontextmanager
async def live_call(
    store: EventStore,
    session_id: str,
    *,
    attach: bool = False,
    agent: str = "triage",
    instructions: str = "You book tables.",
    modality: str = "voice",
    tools: dict[str, ToolSpec] | None = None,
) -> AsyncIterator[Live]:
    """A started (or attached) CallSession on its own Recorder; the recorder is flushed and closed after."""
    bus, got = collecting_bus()
    rejected: list[tuple[list[Event], CalltapeError]] = []
    recorder = await Recorder(store, on_rejected=lambda evs, err: rejected.append((list(evs), err))).start()
    try:
        if attach:
            call = await CallSession.attach(recorder, session_id, tools=tools, bus=bus)
        else:
            call = await CallSession.start(
                recorder, session_id, agent=agent, instructions=instructions, modality=modality, tools=tools, bus=bus
            )
        yield Live(recorder, call, bus, got, rejected)
    finally:
        await recorder.close()


class Body:
    """A tool body that counts its runs and, when gated, waits for ``release()`` (or forever)."""

    def __init__(self, output: Any = None, *, gated: bool = False, error: Exception | None = None) -> None:
        self.output = {"booked": True} if output is None else output
        self.runs = 0
        self.cancelled = 0
        self.started = asyncio.Event()
        self.finished = asyncio.Event()
        self._gate = asyncio.Event()
        if not gated:
            self._gate.set()
        self.error = error

    def release(self) -> None:
        self._gate.set()

    async def __call__(self) -> Any:
        self.runs += 1
        self.started.set()
        try:
            await self._gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.finished.set()
        if self.error is not None:
            raise self.error
        return self.output


def reply(call: CallSession, rid: str, text: str | None, *calls: tuple[str, str, Any], done: bool = True) -> None:
    """An LLM generation: started, its text, its tool calls (call id, name, arguments), done."""
    call.emit("agent.reply.started", {"reply": rid})
    if text:
        call.emit("agent.text", {"reply": rid, "text": text})
    for cid, name, arguments in calls:
        call.emit("tool.call", {"reply": rid, "call": cid, "name": name, "arguments": arguments})
    if done:
        call.emit("agent.reply.done", {"reply": rid})


def items(native: dict[str, Any]) -> list[dict[str, Any]]:
    return list(native["items"])


def output_of(native: dict[str, Any], call_id: str) -> dict[str, Any]:
    (out,) = [i for i in native["items"] if i["type"] == "function_call_output" and i["call_id"] == call_id]
    return out


def assistant_then_outputs(native: dict[str, Any], call_ids: Sequence[str]) -> None:
    """Rule 5: the outputs sit right after their assistant message's function calls."""
    kinds = [(i["type"], i.get("call_id")) for i in native["items"]]
    first = kinds.index(("function_call", call_ids[0]))
    expected = [("function_call", c) for c in call_ids] + [("function_call_output", c) for c in call_ids]
    assert kinds[first : first + len(expected)] == expected, kinds


async def log_of(store: EventStore, session_id: str) -> list[Event]:
    return await store.read(session_id)


def types_of(events: Sequence[Event]) -> list[str]:
    return [e.type for e in events]


async def assert_live_matches_log(live: Live, store: EventStore, session_id: str) -> dict[str, Any]:
    """The live fold and a replay of the log agree (after everything emitted has committed)."""
    await live.recorder.flush()
    replayed = (await build_context(store, session_id, snapshots=None)).native()
    live_native = live.call.fold.native()
    assert live_native == replayed, (live_native, replayed)
    return replayed


async def assert_resumed(
    store: EventStore,
    store_url: str,
    session_id: str,
    plan: ResumePlan,
    *,
    old_epoch: int,
    zombie: Live | None,
    format: str = "native",
) -> dict[str, Any]:
    """Everything SPEC section 4 promises after a resume; returns the context replayed from the log."""
    after = (await build_context(store, session_id, snapshots=None)).native()
    if format == "native":
        assert plan.context == after
    else:
        assert plan.context == render(after, format)
    # A fresh store instance (another process) replays the same thing.
    other = await open_store(store_url)
    try:
        assert (await build_context(other, session_id, snapshots=None)).native() == after
    finally:
        await other.close()

    body = plan.to_json()
    assert set(body) == PLAN_KEYS
    for tool in body["tools"]:
        assert TOOL_KEYS <= set(tool) <= TOOL_KEYS | {"progress"}
    assert plan.epoch == old_epoch + 1 == after["epoch"]
    info = await store.session_info(session_id)
    assert info is not None and info.epoch == old_epoch + 1 and info.agent == plan.agent
    assert after["agent"] == plan.agent

    events = await store.read(session_id)
    resumed = [e for e in events if e.type == "session.resumed"]
    assert len(resumed) == old_epoch  # one per resume so far (epoch 1 = no resume)
    last = resumed[-1]
    assert last.seq == plan.resumed_at_seq
    assert last.data == {"agent": plan.agent, "epoch": old_epoch + 1, "from_seq": plan.checkpoint_seq}
    assert all(e.epoch == old_epoch + 1 for e in plan.events)
    assert [e.seq for e in plan.events] == list(range(plan.events[0].seq or 0, events[-1].seq + 1))

    # A zombie writer at the old epoch: rejected by the store ...
    with pytest.raises(FencedWrite):
        await store.append([make_event(session_id, "user.text", {"text": "zombie"}, epoch=old_epoch)])
    # ... and through its own Recorder: reported to on_rejected, never in the log.
    if zombie is not None:
        ghost = zombie.call.emit("agent.text", {"reply": "zombie-reply", "text": "I am a zombie"})
        await zombie.recorder.flush()
        assert any(ghost.id in {e.id for e in evs} and isinstance(err, FencedWrite) for evs, err in zombie.rejected)
        assert ghost.id not in {e.id for e in await store.read(session_id)}
        assert zombie.of("fenced_write")[-1].figures == {
            "type": "agent.text",
            "epoch": old_epoch,
            "current_epoch": old_epoch + 1,
        }
        # The fact is in the log (an epoch-less x.recovery, ignored by the projections).
        noted = [e for e in await store.read(session_id) if e.type == "x.recovery"][-1]
        assert noted.epoch is None and noted.data["kind"] == "fenced_write"
    # Nothing the zombie tried changed the context.
    final = (await build_context(store, session_id, snapshots=None)).native()
    assert {k: v for k, v in final.items() if k not in ("seq", "last_clean_seq")} == {
        k: v for k, v in after.items() if k not in ("seq", "last_clean_seq")
    }
    return after
