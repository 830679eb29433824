"""Reading: one long session read back (calltape vs `eventsourcing`), rebuilt cold (read + decode +
fold) vs a raw asyncpg read + orjson decode of the same rows, and rebuilt from a snapshot.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import orjson

from bench import es
from bench.db import Scratch
from bench.workload import Step, clean_timeline
from calltape.events import Event, new_event_id
from calltape.eventstore import EventStore
from calltape.projections import ContextFold, build_context, segments


def fold(events: list[Event], session: str) -> ContextFold:
    """A fresh fold of ``events`` (the same code path as a replay: ``apply_many``)."""
    f = ContextFold(session)
    f.apply_many(events)
    return f


READ_SQL = "SELECT seq, id, type, at_ms, agent, epoch, data::text FROM ct_events WHERE session = $1 ORDER BY seq"


@dataclass(slots=True)
class LongSession:
    session: str
    events: list[Event]
    snapshot_seq: int = 0
    es_id: UUID | None = None


async def write_long_session(
    store: EventStore, session: str, steps: list[Step], *, start_ms: int, step_ms: int
) -> list[Event]:
    from bench.append import make_events

    events = make_events(session, steps, start_ms=start_ms, step_ms=step_ms)
    stored: list[Event] = []
    for i in range(0, len(events), 1000):
        stored.extend(await store.append(events[i : i + 1000]))
    return stored


def es_write_long_session(app: es.CallTapeApp, session: str, events: list[Event]) -> UUID:
    first = events[0]
    call = es.start_call(session, (first.type, first.data))
    for i, e in enumerate(events[1:], 1):
        es.record(call, (e.type, e.data), e.id or new_event_id(), e.at_ms)
        if i % 1000 == 0:
            es.save(app, [call])
    es.save(app, [call])
    return call.id


async def settle() -> None:
    """Lets the event loop drop the callback that woke the last call's task: it holds the driver's
    finished future, so the rows an asyncpg ``fetch`` returned (100k records) live until the task next
    suspends, and were freed (11-30 ms) inside whichever timed call suspended next — the raw read's rows
    charged to the read after it, the cold rebuild's to the variant after ``fold_only`` (which never
    suspends). Settled here, between calls, each call's garbage is freed outside every timing."""
    await asyncio.sleep(0)


async def timed(fn: Callable[[], Awaitable[Any]], repeats: int, warmup: int = 1) -> tuple[list[float], Any]:
    """Seconds per call for ``repeats`` calls after ``warmup`` discarded ones (gc collected before
    each, so one call does not pay for the previous one's garbage)."""
    result = None
    for _ in range(warmup):
        result = await fn()
    out: list[float] = []
    for _ in range(repeats):
        result = None
        await settle()
        gc.collect()
        t0 = time.perf_counter()
        result = await fn()
        out.append(time.perf_counter() - t0)
    return out, result


@dataclass(slots=True)
class ReadResults:
    events: int
    raw_read: list[float] = field(default_factory=list)
    calltape_read: list[float] = field(default_factory=list)
    es_read: list[float] = field(default_factory=list)
    es_select_raw: list[float] = field(default_factory=list)
    rebuild_cold: list[float] = field(default_factory=list)
    fold_only: list[float] = field(default_factory=list)
    es_rebuild: list[float] = field(default_factory=list)
    rebuild_snapshot: list[float] = field(default_factory=list)
    rebuild_snapshot_cold: list[float] = field(default_factory=list)
    snapshot_tail: int = 0
    snapshot_bytes: int = 0
    context_items: int = 0


async def read_benchmarks(
    store: EventStore,
    scratch: Scratch,
    app: es.CallTapeApp | None,
    *,
    events: int,
    repeats: int,
    snapshot_tail: int,
    log: Callable[[str], None],
) -> ReadResults:
    session = f"long-{events}"
    steps = clean_timeline(7, events)
    t0 = time.perf_counter()
    stored = await write_long_session(store, session, steps, start_ms=1_700_000_000_000, step_ms=36)
    log(f"  wrote a {len(stored):,}-event session in {time.perf_counter() - t0:.1f}s")
    res = ReadResults(events=len(stored))
    es_id = None
    if app is not None:
        t0 = time.perf_counter()
        es_id = await asyncio.to_thread(es_write_long_session, app, session, stored)
        log(f"  wrote the same events to eventsourcing in {time.perf_counter() - t0:.1f}s")

    conn = await scratch.connect()
    ident = es_id

    async def raw() -> list[Any]:
        rows = await conn.fetch(READ_SQL, session)
        loads = orjson.loads
        return [loads(r[6]) for r in rows]

    async def ct_read() -> list[Event]:
        return await store.read(session)

    async def es_read() -> list[Any]:
        assert app is not None
        return await asyncio.to_thread(lambda: list(app.events.get(ident)))

    async def es_select() -> Any:
        assert app is not None
        return await asyncio.to_thread(lambda: app.recorder.select_events(ident))

    async def es_rebuild() -> Any:
        assert app is not None
        return await asyncio.to_thread(lambda: app.repository.get(ident))

    async def cold() -> Any:  # no snapshot exists yet for this session
        return await build_context(store, session, snapshots=None)

    evs: list[Event] = []

    async def fold_only() -> Any:
        return fold(evs, session)

    variants: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("raw_read", raw),
        ("calltape_read", ct_read),
        ("rebuild_cold", cold),
        ("fold_only", fold_only),
    ]
    if app is not None and ident is not None:
        variants += [("es_read", es_read), ("es_select_raw", es_select), ("es_rebuild", es_rebuild)]
    try:
        # Interleaved: every repeat runs each variant once (rotating the order), so a noisy
        # neighbour slows all of them alike and the paired ratios stay meaningful.
        evs = await ct_read()
        for _, fn in variants:  # warm-up
            await fn()
        for rep in range(repeats):
            k = rep % len(variants)
            for name, fn in variants[k:] + variants[:k]:
                await settle()
                gc.collect()
                t0 = time.perf_counter()
                result = await fn()
                getattr(res, name).append(time.perf_counter() - t0)
                if name == "rebuild_cold":
                    ctx = result
                elif name == "es_rebuild":
                    assert result.count == len(stored)
                elif name in ("raw_read", "calltape_read", "es_read"):
                    assert len(result) == len(stored), (name, len(result))
                del result
    finally:
        await conn.close()
    assert ctx.seq == len(stored)
    res.context_items = len(ctx.native()["items"])

    # A snapshot at the last clean point at least `snapshot_tail` events before the end.
    head = fold(stored[: len(stored) - snapshot_tail], session)
    snap_seq = head.last_clean_seq
    snap = fold(stored[:snap_seq], session)
    captured = snap.capture()
    await segments.save(store, session, captured)  # as build_context saves: a header beside segments
    res.snapshot_tail = len(stored) - snap_seq
    res.snapshot_bytes = len(segments.header_bytes(captured)) + sum(len(s.body()) for s in captured.segments)

    async def with_snapshot() -> Any:
        return await build_context(store, session)

    res.rebuild_snapshot, ctx2 = await timed(with_snapshot, max(repeats, 10), warmup=2)
    assert ctx2.native() == ctx.native()

    async def cold_process() -> Any:  # a process that never read this call: its segment cache is empty
        segments.CACHE.clear()
        return await build_context(store, session)

    res.rebuild_snapshot_cold, _ = await timed(cold_process, max(repeats, 10), warmup=2)
    return res
