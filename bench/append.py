"""Writing: the recorder under 200 concurrent sessions, against raw asyncpg COPY and `eventsourcing`.

* **Burst** (throughput, not the offered rate): every session's events are emitted round-robin as
  fast as the loop can (one ``recorder.session(...).emit`` per session, then a yield to the event loop so the
  writer overlaps), then ``flush()``; events/s = events ÷ (first emit → everything committed).
  The batch sizes the recorder formed are captured and replayed by both baselines:
  - raw COPY: ``copy_records_to_table`` of the very rows calltape stored (read back from
    ``ct_events``), one COPY per batch (each its own transaction, as the recorder's), into
    ``ct_events_raw`` = ``LIKE ct_events INCLUDING ALL`` (same columns, indexes, identity and
    defaults), without any of the session bookkeeping (lock/upsert of ``ct_sessions``, the plan,
    dedup checks, NOTIFY);
  - `eventsourcing`: the same events as domain events of one aggregate per session, saved with
    ``app.save(*aggregates)`` per batch (one transaction per batch, like the recorder).
* **Sustained**: 200 sessions each emitting ~20 events/s (their own timers, jittered) while a probe
  does durable appends (``await tape.append("tool.started")``) back to back with 10 ms pauses.
  Gives ``emit()`` cost per call, durable append latency under load and the emit → commit lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from bench import es
from bench.db import RAW_TABLE, Scratch, truncate_calltape, truncate_es, truncate_raw
from bench.workload import Step, call_timeline
from calltape.events import Event, make_event, new_event_id, now_ms
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder

RAW_COLUMNS = ["session", "seq", "id", "type", "at_ms", "agent", "epoch", "data"]


class Capture:
    """Wraps ``store.append`` on the instance (the store's code is untouched) to record the batch
    sizes the recorder forms and, optionally, when each event committed."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.batches: list[int] = []
        self.emitted: dict[str, float] = {}
        self.lag: list[float] = []
        self.track_lag = False
        self._orig = store.append
        self._orig_ahead = store.append_ahead

        def committed(events: Sequence[Event]) -> None:
            self.batches.append(len(events))
            if self.track_lag:
                now = time.perf_counter()
                emitted = self.emitted
                for e in events:
                    t = emitted.pop(e.id, None)
                    if t is not None:
                        self.lag.append(now - t)

        async def append(events: Sequence[Event], **kw: Any) -> list[Event]:
            result = await self._orig(events, **kw)
            committed(events)
            return result

        async def append_ahead(events: Sequence[Event]) -> list[Event]:
            # (a batch the store could not write ahead is appended again: counted once, when it commits)
            result = await self._orig_ahead(events)
            committed(events)
            return result

        store.append = append  # type: ignore[method-assign]
        store.append_ahead = append_ahead  # type: ignore[method-assign]

    def close(self) -> None:
        del self.store.append  # back to the class methods
        del self.store.append_ahead


def burst_timelines(sessions: int, per_session: int, seed: int) -> list[tuple[str, list[Step]]]:
    return [(f"burst-{seed}-{i:03d}", call_timeline(seed * 1000 + i, per_session)) for i in range(sessions)]


# -- calltape --------------------------------------------------------------------------------


@dataclass(slots=True)
class BurstResult:
    events: int
    seconds: float
    batches: list[int] = field(default_factory=list)
    emit_seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.events / self.seconds


async def calltape_burst(store: EventStore, timelines: list[tuple[str, list[Step]]]) -> BurstResult:
    capture = Capture(store)
    recorder = Recorder(store)
    await recorder.start()
    tapes = [(recorder.session(sid), steps) for sid, steps in timelines]
    rounds = max(len(steps) for _, steps in timelines)
    n = sum(len(steps) for _, steps in timelines)
    try:
        t0 = time.perf_counter()
        for i in range(rounds):
            for tape, steps in tapes:
                if i < len(steps):
                    kind, data = steps[i]
                    tape.emit(kind, data)
            await asyncio.sleep(0)
        t_emit = time.perf_counter()
        await recorder.flush()
        t1 = time.perf_counter()
    finally:
        await recorder.close()
        capture.close()
    assert recorder.stats.committed == n, (recorder.stats.committed, n)
    return BurstResult(n, t1 - t0, capture.batches, t_emit - t0)


async def stored_rows(scratch: Scratch) -> list[tuple[Any, ...]]:
    conn = await scratch.connect()
    try:
        rows = await conn.fetch(
            "SELECT session, seq, id, type, at_ms, agent, epoch, data::text FROM ct_events ORDER BY pos"
        )
    finally:
        await conn.close()
    return [tuple(r) for r in rows]


# -- raw asyncpg COPY ------------------------------------------------------------------------


async def raw_copy(scratch: Scratch, rows: list[tuple[Any, ...]], batches: list[int]) -> BurstResult:
    conn = await scratch.connect()
    try:
        t0 = time.perf_counter()
        i = 0
        for size in batches:
            await conn.copy_records_to_table(RAW_TABLE, records=rows[i : i + size], columns=RAW_COLUMNS)
            i += size
        if i < len(rows):
            await conn.copy_records_to_table(RAW_TABLE, records=rows[i:], columns=RAW_COLUMNS)
        t1 = time.perf_counter()
    finally:
        await conn.close()
    return BurstResult(len(rows), t1 - t0, batches)


async def raw_unnest(scratch: Scratch, rows: list[tuple[Any, ...]], batches: list[int]) -> BurstResult:
    """The same rows through one ``INSERT … SELECT FROM unnest(…)`` per batch (calltape's own shape)."""
    sql = (
        f"INSERT INTO {RAW_TABLE} (session, seq, id, type, at_ms, agent, epoch, data) "
        "SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::bigint[], $6::text[], "
        "$7::int[], $8::jsonb[])"
    )
    conn = await scratch.connect()
    try:
        t0 = time.perf_counter()
        i = 0
        for size in batches:
            chunk = rows[i : i + size]
            await conn.execute(sql, *[list(col) for col in zip(*chunk, strict=True)])
            i += size
        t1 = time.perf_counter()
    finally:
        await conn.close()
    return BurstResult(len(rows), t1 - t0, batches)


# -- eventsourcing ---------------------------------------------------------------------------


def es_burst(app: es.CallTapeApp, timelines: list[tuple[str, list[Step]]], batches: list[int]) -> BurstResult:
    """The same events, in the same round-robin order, saved in batches of the same sizes."""
    order: list[tuple[int, Step]] = []
    rounds = max(len(steps) for _, steps in timelines)
    for i in range(rounds):
        for k, (_, steps) in enumerate(timelines):
            if i < len(steps):
                order.append((k, steps[i]))
    calls: dict[int, es.Call] = {}
    sizes = list(batches)
    if sum(sizes) < len(order):
        sizes.append(len(order) - sum(sizes))
    t0 = time.perf_counter()
    i = 0
    for size in sizes:
        touched: dict[int, es.Call] = {}
        for k, step in order[i : i + size]:
            call = calls.get(k)
            if call is None:
                call = calls[k] = es.start_call(timelines[k][0], step)
            else:
                es.record(call, step, new_event_id(), now_ms())
            touched[k] = call
        es.save(app, list(touched.values()))
        i += size
    t1 = time.perf_counter()
    return BurstResult(len(order), t1 - t0, sizes)


def es_per_event(app: es.CallTapeApp, timelines: list[tuple[str, list[Step]]], limit: int) -> BurstResult:
    """Extra: `eventsourcing` with one ``app.save`` per event (no group commit), as a live agent
    without a recorder would write."""
    calls: dict[int, es.Call] = {}
    n = 0
    t0 = time.perf_counter()
    rounds = max(len(steps) for _, steps in timelines)
    for i in range(rounds):
        for k, (session, steps) in enumerate(timelines):
            if i >= len(steps) or n >= limit:
                continue
            call = calls.get(k)
            if call is None:
                call = calls[k] = es.start_call(session, steps[i])
            else:
                es.record(call, steps[i], new_event_id(), now_ms())
            es.save(app, [call])
            n += 1
    return BurstResult(n, time.perf_counter() - t0)


# -- the whole throughput comparison ---------------------------------------------------------


@dataclass(slots=True)
class ThroughputRun:
    calltape: BurstResult
    raw_copy: BurstResult
    raw_unnest: BurstResult | None
    eventsourcing: BurstResult | None


async def throughput(
    store: EventStore,
    scratch: Scratch,
    app: es.CallTapeApp | None,
    *,
    sessions: int,
    per_session: int,
    repeats: int,
    log: Callable[[str], None],
) -> list[ThroughputRun]:
    """One warm-up then ``repeats`` paired runs; the order of calltape and raw alternates, each
    system writes into empty tables every time."""
    runs: list[ThroughputRun] = []
    rows: list[tuple[Any, ...]] | None = None
    batches: list[int] = []
    for rep in range(repeats + 1):
        timelines = burst_timelines(sessions, per_session, seed=rep + 1)
        ct = raw = None

        async def run_calltape(timelines: list[tuple[str, list[Step]]] = timelines) -> BurstResult:
            nonlocal rows, batches
            await truncate_calltape(scratch)
            gc.collect()
            result = await calltape_burst(store, timelines)
            rows = await stored_rows(scratch)
            batches = result.batches
            return result

        async def run_raw() -> BurstResult:
            assert rows is not None
            await truncate_raw(scratch)
            gc.collect()
            return await raw_copy(scratch, rows, batches)

        if rep % 2 == 0 or rows is None:
            ct = await run_calltape()
            raw = await run_raw()
        else:
            raw = await run_raw()  # the previous repeat's rows and batches: same shape and sizes
            ct = await run_calltape()
        await truncate_raw(scratch)
        assert rows is not None
        unnest = await raw_unnest(scratch, rows, batches)
        es_result = None
        if app is not None:
            await truncate_es(scratch)
            gc.collect()
            es_result = await asyncio.to_thread(es_burst, app, timelines, batches)
        tag = "warm-up" if rep == 0 else f"repeat {rep}/{repeats}"
        log(
            f"  throughput {tag}: calltape {ct.rate:,.0f} ev/s (mean batch {ct.events / len(ct.batches):.0f}), "
            f"raw COPY {raw.rate:,.0f} ev/s, unnest {unnest.rate:,.0f} ev/s"
            + (f", eventsourcing {es_result.rate:,.0f} ev/s" if es_result else "")
        )
        if rep > 0:
            runs.append(ThroughputRun(ct, raw, unnest, es_result))
    return runs


# -- sustained load: emit cost, durable appends, commit lag ----------------------------------


@dataclass(slots=True)
class SustainedResult:
    offered: int
    committed: int
    seconds: float
    flush_tail_ms: float
    emit_us: list[float]
    durable_ms: list[float]
    raw_commit_ms: list[float]
    """A raw asyncpg one-row ``INSERT`` + ``COMMIT``, timed by the same probe right after each durable append
    (empty without a raw connection): the floor under the durable append, under the same load."""
    commit_lag_ms: list[float]
    batches: list[int]


async def sustained(
    store: EventStore,
    *,
    sessions: int,
    rate: float,
    seconds: float,
    seed: int,
    probe_pause: float = 0.01,
    raw: asyncpg.Connection | None = None,
) -> SustainedResult:
    capture = Capture(store)
    capture.track_lag = True
    emitted = capture.emitted
    recorder = Recorder(store)
    await recorder.start()
    loop = asyncio.get_running_loop()
    per_session = int(rate * seconds) + 10
    timelines = burst_timelines(sessions, per_session, seed=1000 + seed)
    emit_ns: list[int] = []
    durable: list[float] = []
    raw_commit: list[float] = []
    raw_sql = f"INSERT INTO {RAW_TABLE} (session, seq, id, type, at_ms, data) VALUES ($1, $2, $3, $4, $5, $6)"
    raw_session = f"raw-{new_event_id()}"
    offered = 0
    start = loop.time() + 0.05
    end = start + seconds
    perf = time.perf_counter_ns
    perf_s = time.perf_counter

    async def session_loop(sid: str, steps: list[Step], rng: random.Random) -> None:
        nonlocal offered
        tape = recorder.session(sid)
        period = 1.0 / rate
        t = start + rng.random() * period
        for kind, data in steps:
            delay = t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if loop.time() >= end:
                return
            t0 = perf()
            ev = tape.emit(kind, data)
            emit_ns.append(perf() - t0)
            emitted[ev.id] = perf_s()
            offered += 1
            t += period * (0.5 + rng.random())  # jittered, ~rate on average

    async def probe() -> None:
        tape = recorder.session(f"probe-{seed}")
        await tape.append("session.started", {"agent": "probe", "modality": "text"})
        await asyncio.sleep(max(0.0, start - loop.time()))
        k = 0
        while loop.time() < end:
            k += 1
            tape.emit("tool.call", {"call": f"p{k}", "name": "book_slot", "arguments": {"slot": k}})
            t0 = perf_s()
            await tape.append("tool.started", {"call": f"p{k}"})
            durable.append((perf_s() - t0) * 1000)
            tape.emit("tool.result", {"call": f"p{k}", "output": {"ok": True}})
            if raw is not None:
                # the floor, alternating with the durable append under the same load: one row, one commit
                t0 = perf_s()
                async with raw.transaction():
                    await raw.execute(raw_sql, raw_session, k, new_event_id(), "tool.started", 0, "{}")
                raw_commit.append((perf_s() - t0) * 1000)
            await asyncio.sleep(probe_pause)

    rngs = [random.Random(seed * 7919 + i) for i in range(sessions)]
    tasks = [asyncio.create_task(session_loop(sid, steps, rngs[i])) for i, (sid, steps) in enumerate(timelines)]
    tasks.append(asyncio.create_task(probe()))
    try:
        await asyncio.gather(*tasks)
        t_end = perf_s()
        await recorder.flush()
        tail = (perf_s() - t_end) * 1000
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        await recorder.close()
        capture.close()
    return SustainedResult(
        offered=offered,
        committed=recorder.stats.committed,
        seconds=seconds,
        flush_tail_ms=tail,
        emit_us=[ns / 1000 for ns in emit_ns],
        durable_ms=durable,
        raw_commit_ms=raw_commit,
        commit_lag_ms=[s * 1000 for s in capture.lag],
        batches=capture.batches,
    )


async def durable_idle(store: EventStore, *, count: int, seed: int) -> list[float]:
    """Durable append latency with nothing else going on (extra figure)."""
    recorder = Recorder(store)
    await recorder.start()
    out: list[float] = []
    try:
        tape = recorder.session(f"idle-probe-{seed}")
        await tape.append("session.started", {"agent": "probe", "modality": "text"})
        for k in range(count):
            t0 = time.perf_counter()
            await tape.append("tool.started", {"call": f"i{k}"})
            out.append((time.perf_counter() - t0) * 1000)
    finally:
        await recorder.close()
    return out


async def floor_single_commit(store: EventStore, scratch: Scratch, *, count: int, seed: int) -> dict[str, list[float]]:
    """The floor under a durable append, ms: ``store.append`` of one event without the recorder, and a
    raw asyncpg single-row INSERT + COMMIT (same table shape) — both idle, interleaved."""
    session = f"floor-{seed}"
    await store.append([make_event(session, "session.started", {"agent": "probe", "modality": "text"})])
    conn = await scratch.connect()
    out: dict[str, list[float]] = {"store_append": [], "raw_insert_commit": []}
    sql = f"INSERT INTO {RAW_TABLE} (session, seq, id, type, at_ms, data) VALUES ($1, $2, $3, $4, $5, $6)"
    try:
        for k in range(count):
            ev = make_event(session, "tool.started", {"call": f"f{k}"})
            t0 = time.perf_counter()
            await store.append([ev])
            out["store_append"].append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            async with conn.transaction():
                await conn.execute(sql, session, 10_000_000 + k, ev.id, ev.type, ev.at_ms, '{"call": "x"}')
            out["raw_insert_commit"].append((time.perf_counter() - t0) * 1000)
    finally:
        await conn.close()
    return out


def emit_tight(count: int, seed: int) -> list[float]:
    """``recorder.session(...).emit`` in a tight loop into a recorder whose writer is not running (pure CPU
    cost of validation + enqueue), us per call."""

    class _NullStore:
        write_groups = 1

    recorder = Recorder(_NullStore(), max_pending=count + 10)  # type: ignore[arg-type]
    tape = recorder.session(f"tight-{seed}")
    steps = call_timeline(seed, count)
    perf = time.perf_counter_ns
    out: list[float] = []
    for kind, data in steps:
        t0 = perf()
        tape.emit(kind, data)
        out.append((perf() - t0) / 1000)
    return out


def make_events(session: str, steps: list[Step], *, start_ms: int, step_ms: int) -> list[Event]:
    return [make_event(session, k, d, at_ms=start_ms + i * step_ms) for i, (k, d) in enumerate(steps)]
