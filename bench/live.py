"""The runtime: resume of a 1-hour call, and interruption → playout waiter released.

Skipped (figures ``None``) when ``calltape.runtime`` is not importable yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from bench.append import make_events
from bench.workload import clean_timeline
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder


@contextlib.asynccontextmanager
async def background_load(recorder: Recorder, *, sessions: int, rate: float, seed: int) -> AsyncIterator[None]:
    """``sessions`` calls emitting ~``rate`` events/s each until the block exits."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    async def one(i: int) -> None:
        from bench.workload import call_steps

        rng = random.Random(seed * 31 + i)
        tape = recorder.session(f"bg-{seed}-{i:03d}")
        period = 1.0 / rate
        t = loop.time() + rng.random() * period
        for kind, data in call_steps(seed * 1000 + i):
            delay = t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if stop.is_set():
                return
            tape.emit(kind, data)
            t += period * (0.5 + rng.random())

    tasks = [asyncio.create_task(one(i)) for i in range(sessions)]
    try:
        yield
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- interruption → waiter released -------------------------------------------------------------


async def interrupt_release(
    store: EventStore, *, samples: int, load_sessions: int, rate: float, seed: int
) -> list[float]:
    """ms from ``call.interrupt(reply)`` to the ``wait_for_playout`` waiter running its
    ``except Interrupted`` handler, while ``load_sessions`` other calls emit in the background."""
    from calltape.errors import Interrupted
    from calltape.runtime import CallSession

    recorder = Recorder(store)
    await recorder.start()
    out: list[float] = []
    rng = random.Random(seed)
    try:
        call = await CallSession.start(recorder, f"barge-{seed}", agent="support", instructions="Be brief.")
        async with background_load(recorder, sessions=load_sessions, rate=rate, seed=seed):
            await asyncio.sleep(0.2)
            for k in range(samples):
                rid = f"r{k}"
                call.emit("user.transcript", {"text": "book me a table", "final": True})
                call.emit("agent.reply.started", {"reply": rid})
                call.emit("agent.text", {"reply": rid, "text": "Sure, for how many"})
                call.emit("agent.speech.started", {"reply": rid})
                released: list[float] = []

                async def waiter(reply: str = rid, box: list[float] = released) -> None:
                    try:
                        await call.wait_for_playout(reply)
                    except Interrupted:
                        box.append(time.perf_counter())

                task = asyncio.create_task(waiter())
                await asyncio.sleep(0.002 + rng.random() * 0.008)  # the waiter is parked on its future
                t0 = time.perf_counter()
                call.interrupt(rid, heard="Sure,")
                await task
                if released:
                    out.append((released[0] - t0) * 1000)
                call.emit("agent.speech.ended", {"reply": rid, "interrupted": True, "heard": "Sure,"})
                call.emit("user.speech.stopped", {})
    finally:
        await recorder.close()
    return out


# -- resume of a 1-hour call --------------------------------------------------------------------


@dataclass(slots=True)
class ResumeResults:
    events: int
    real_ms: list[float] = field(default_factory=list)
    dry_run_ms: list[float] = field(default_factory=list)
    settled: int = 0
    tools: int = 0
    snapshot_seq: int = 0
    rebuild_ms: list[float] = field(default_factory=list)
    """``build_context`` from the snapshot plus the dropped tail, before the first resume."""
    rebuild_cold_ms: list[float] = field(default_factory=list)
    """The same with the process's segment cache emptied first (a process that never read the call)."""
    snapshot_bytes: int = 0
    """The stored snapshot: its header and every segment it names."""


def _open_tail(k: int, epoch: int, agent: str) -> list[tuple[str, dict[str, Any]]]:
    """What a drop leaves open: a reply mid-playout with a started tool call, then the drop."""
    rid = f"dropped-{k}"
    return [
        ("user.transcript", {"text": "can you also book the thursday slot", "final": True}),
        ("agent.reply.started", {"reply": rid}),
        ("agent.text", {"reply": rid, "text": "Booking that now,"}),
        ("tool.call", {"call": f"drop-call-{k}", "name": "book_slot", "arguments": {"day": "thu"}, "reply": rid}),
        ("tool.started", {"call": f"drop-call-{k}"}),
        ("tool.progress", {"call": f"drop-call-{k}", "state": {"hold": f"H{k}"}}),
        ("agent.speech.started", {"reply": rid}),
        ("agent.speech.progress", {"reply": rid, "heard": "Booking"}),
        ("session.dropped", {"reason": "transport lost"}),
    ]


async def resume_benchmark(
    store: EventStore, *, events: int, repeats: int, log: Callable[[str], None]
) -> ResumeResults:
    from calltape.events import make_event
    from calltape.projections import FOLD_VERSION, build_context, segments, snapshot_now
    from calltape.runtime import ToolSpec, resume

    session = f"hour-{events}"
    steps = clean_timeline(11, events)
    evs = make_events(session, steps, start_ms=1_700_000_000_000, step_ms=max(1, 3_600_000 // max(events, 1)))
    for i in range(0, len(evs), 1000):
        await store.append(evs[i : i + 1000])
    # The live system snapshots at clean points as it goes; the last one is at the end of the clean part.
    snap = await snapshot_now(store, session)
    res = ResumeResults(events=len(evs), snapshot_seq=snap)
    tools = {"book_slot": ToolSpec(idempotent=False), "lookup_order": ToolSpec(idempotent=True)}
    agent = "support"

    async def drop(k: int) -> None:
        info = await store.session_info(session)
        assert info is not None
        tail = [make_event(session, t, d, agent=agent, epoch=info.epoch) for t, d in _open_tail(k, info.epoch, agent)]
        await store.append(tail)

    await drop(0)
    loaded = await store.load_snapshot(session, FOLD_VERSION)
    res.snapshot_bytes = len(loaded[1]) if loaded is not None else 0
    load_segments = getattr(store, "load_snapshot_segments", None)
    if load_segments is not None:
        res.snapshot_bytes += sum(len(body) for _, body in await load_segments(session, FOLD_VERSION))
    for i in range(12):
        gc.collect()
        t0 = time.perf_counter()
        await build_context(store, session)
        if i >= 2:
            res.rebuild_ms.append((time.perf_counter() - t0) * 1000)
    for _ in range(5):
        segments.CACHE.clear()
        gc.collect()
        t0 = time.perf_counter()
        await build_context(store, session)
        res.rebuild_cold_ms.append((time.perf_counter() - t0) * 1000)
    # dry runs: the same plan again and again, nothing appended
    for i in range(repeats + 3):
        gc.collect()
        t0 = time.perf_counter()
        plan = await resume(store, session, "rescue", dry_run=True, tools=tools)
        dt = (time.perf_counter() - t0) * 1000
        if i >= 3:
            res.dry_run_ms.append(dt)
    res.settled = len(plan.events) - 1
    res.tools = len(plan.tools)
    # real resumes: each one settles a fresh drop, raises the epoch and appends
    for i in range(repeats + 3):
        gc.collect()
        t0 = time.perf_counter()
        plan = await resume(store, session, f"rescue-{i}", tools=tools)
        dt = (time.perf_counter() - t0) * 1000
        if i >= 3:
            res.real_ms.append(dt)
        agent = f"rescue-{i}"
        await drop(i + 1)
    log(f"  resume: {res.events:,}-event call, snapshot at seq {snap:,}, {res.settled} settling events per plan")
    return res
