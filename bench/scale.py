"""How the recorder's cost grows with load: many sessions at 20 events/s each on one recorder.

One driver task ticks every few milliseconds and emits the events whose jittered times have come
(a task per session would measure asyncio's timer heap, not calltape). Per point: the offered and
committed rates, the emit → commit lag (p50/p99), ``emit()``'s own cost, and the resident memory
the sessions added, per session. A point is *sustained* when the driver offered at least 95% of the
target rate, everything committed, and the lag p99 stayed within ``LAG_GOAL_MS``;
``max_sessions_sustained`` is the largest sustained count, narrowed by bisection between the last
sustained point of the curve and the first that was not.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.append import Capture, burst_timelines
from bench.stats import percentile
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder

LAG_GOAL_MS = 50.0
TICK_S = 0.005
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return 0


@dataclass(slots=True)
class ScalePoint:
    sessions: int
    target_per_s: float
    offered_per_s: float
    committed_per_s: float
    lag_p50_ms: float
    lag_p99_ms: float
    emit_p99_us: float
    rss_kb_per_session: float
    kept_up: bool

    @property
    def sustained(self) -> bool:
        return self.kept_up and self.offered_per_s >= 0.95 * self.target_per_s and self.lag_p99_ms <= LAG_GOAL_MS

    def json(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions,
            "target_events_per_s": round(self.target_per_s),
            "offered_events_per_s": round(self.offered_per_s),
            "committed_events_per_s": round(self.committed_per_s),
            "lag_p50_ms": round(self.lag_p50_ms, 2),
            "lag_p99_ms": round(self.lag_p99_ms, 2),
            "emit_p99_us": round(self.emit_p99_us, 2),
            "rss_kb_per_session": round(self.rss_kb_per_session, 1),
            "sustained": self.sustained,
        }


async def scale_point(store: EventStore, *, sessions: int, rate: float, seconds: float, seed: int) -> ScalePoint:
    """One point of the curve: ``sessions`` sessions emitting ``rate`` events/s each for ``seconds``."""
    timelines = burst_timelines(sessions, int(rate * seconds) + 10, seed=5000 + seed)
    steps = [s for _, s in timelines]
    rng = random.Random(seed)
    period = 1.0 / rate
    gc.collect()
    rss_before = rss_bytes()
    capture = Capture(store)
    capture.track_lag = True
    emitted = capture.emitted
    recorder = Recorder(store, max_pending=max(100_000, sessions * 200))
    await recorder.start()
    tapes = [recorder.session(sid) for sid, _ in timelines]
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    end = start + seconds
    due = [(start + rng.random() * period, i) for i in range(sessions)]
    heapq.heapify(due)
    position = [0] * sessions
    emit_ns: list[int] = []
    offered = 0
    rss_peak = rss_before
    perf, perf_s = time.perf_counter_ns, time.perf_counter
    try:
        await asyncio.sleep(max(0.0, start - loop.time()))
        next_rss = loop.time()
        while (now := loop.time()) < end:
            while due and due[0][0] <= now:
                t, i = heapq.heappop(due)
                k = position[i]
                if k < len(steps[i]):
                    kind, data = steps[i][k]
                    position[i] = k + 1
                    t0 = perf()
                    event = tapes[i].emit(kind, data)
                    emit_ns.append(perf() - t0)
                    emitted[event.id] = perf_s()
                    offered += 1
                    heapq.heappush(due, (t + period * (0.5 + rng.random()), i))
            if now >= next_rss:
                rss_peak, next_rss = max(rss_peak, rss_bytes()), now + 0.1
            await asyncio.sleep(TICK_S)
        await recorder.flush()
        rss_peak = max(rss_peak, rss_bytes())
    finally:
        await recorder.close()
        capture.close()
    lag = [x * 1000 for x in capture.lag]
    return ScalePoint(
        sessions=sessions,
        target_per_s=sessions * rate,
        offered_per_s=offered / seconds,
        committed_per_s=recorder.stats.committed / seconds,
        lag_p50_ms=percentile(lag, 50) if lag else float("nan"),
        lag_p99_ms=percentile(lag, 99) if lag else float("nan"),
        emit_p99_us=percentile([ns / 1000 for ns in emit_ns], 99) if emit_ns else float("nan"),
        rss_kb_per_session=max(0, rss_peak - rss_before) / 1024 / sessions,
        kept_up=recorder.stats.committed >= offered,
    )


async def scale_curve(
    store: EventStore,
    *,
    points: Sequence[int],
    rate: float,
    seconds: float,
    bisect_steps: int,
    reset: Callable[[], Any],
    log: Callable[[str], None],
) -> tuple[list[ScalePoint], int]:
    """The curve at ``points`` and the most sessions sustained (bisected ``bisect_steps`` times)."""
    curve: list[ScalePoint] = []

    async def measure(n: int) -> ScalePoint:
        await reset()
        p = await scale_point(store, sessions=n, rate=rate, seconds=seconds, seed=len(curve))
        curve.append(p)
        log(
            f"  {n:,} sessions: offered {p.offered_per_s:,.0f}/{p.target_per_s:,.0f} ev/s, committed "
            f"{p.committed_per_s:,.0f} ev/s, lag p99 {p.lag_p99_ms:.1f} ms, emit p99 {p.emit_p99_us:.1f} us, "
            f"{p.rss_kb_per_session:.1f} KB/session -> {'sustained' if p.sustained else 'not sustained'}"
        )
        return p

    best, worst = 0, None
    for n in points:
        p = await measure(n)
        if p.sustained:
            best = n
        else:
            worst = n
            break
    if worst is not None:
        low, high = best, worst
        for _ in range(bisect_steps):
            mid = (low + high) // 2
            if mid <= low or high - low < max(50, low // 20):
                break
            if (await measure(mid)).sustained:
                low = mid
            else:
                high = mid
        best = low
    return sorted(curve, key=lambda p: p.sessions), best
