"""``python -m bench``: the whole suite in one run on one PostgreSQL, figures as ratios measured side by
side. See bench/README.md."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.stats import Spread, latency_summary, percentile

HEADLINE_KEYS = (
    "append_ratio_vs_raw_copy",
    "append_ratio_vs_eventsourcing",
    "emit_p99_us",
    "durable_append_p99_ms",
    "durable_ratio_vs_raw_commit",
    "rebuild_ratio_vs_raw_read",
    "rebuild_snapshot_ms",
    "resume_p99_ms",
    "resume_growth_200k_vs_10k",
    "interrupt_release_p99_ms",
    "read_ratio_vs_eventsourcing",
    "read_ratio_vs_raw",
    "max_sessions_sustained",
    "sqlite_append_ratio_vs_raw",
    "turn_checkpoint_ratio_vs_session_continuity",
    "resume_ratio_vs_session_continuity",
    "import_peak_rss_mb",
)

# (key, comparison, goal, unit, what)
GOALS: dict[str, tuple[str, float, str, str]] = {
    "append_ratio_vs_raw_copy": (">=", 0.8, "x", "recorder burst, 200 sessions ÷ raw asyncpg COPY of the same rows"),
    "append_ratio_vs_eventsourcing": (">=", 5.0, "x", "recorder burst ÷ eventsourcing app.save, same batches"),
    "emit_p99_us": ("<=", 20.0, "us", "emit p99, 200 sessions x 20 ev/s"),
    "durable_append_p99_ms": ("<=", 2.0, "ms", "durable append p99 under that load"),
    "durable_ratio_vs_raw_commit": (
        "<=",
        1.5,
        "x",
        "durable append p99 under that load ÷ raw asyncpg one-row INSERT + COMMIT p99, same load, same run",
    ),
    "rebuild_ratio_vs_raw_read": (">=", 0.8, "x", "cold rebuild ÷ raw asyncpg read + orjson decode"),
    "rebuild_snapshot_ms": ("<=", 5.0, "ms", "rebuild from the newest snapshot + tail"),
    "resume_p99_ms": ("<=", 10.0, "ms", "resume (plan + settle + append) of a 1-hour call"),
    "resume_growth_200k_vs_10k": ("<=", 1.3, "x", "resume p99 at 200k events ÷ at 10k (--quick: 10k ÷ 2k)"),
    "interrupt_release_p99_ms": ("<=", 1.0, "ms", "interrupt() → wait_for_playout waiter released"),
    "read_ratio_vs_eventsourcing": (">=", 3.0, "x", "store.read of one long session ÷ eventsourcing"),
    "read_ratio_vs_raw": (">=", 0.9, "x", "store.read ÷ raw asyncpg read + orjson decode"),
    "max_sessions_sustained": (">=", 1500, "sessions", "most sessions at 20 ev/s with emit→commit lag p99 ≤ 50 ms"),
    "sqlite_append_ratio_vs_raw": (">=", 0.6, "x", "embedded recorder burst ÷ raw sqlite3 executemany, WAL"),
    "turn_checkpoint_ratio_vs_session_continuity": (
        ">=",
        10.0,
        "x",
        "pipecat-session-continuity's per-turn checkpoint p99 ÷ calltape's per-turn durable cost p99, "
        "SQLite, 1,000 turns (--quick: 50)",
    ),
    "resume_ratio_vs_session_continuity": (
        ">=",
        1.0,
        "x",
        "pipecat-session-continuity's load + restore p50 ÷ calltape's resume p50, SQLite, 1,000 turns (--quick: 50)",
    ),
    "import_peak_rss_mb": (
        "<=",
        200.0,
        "MB",
        "peak RSS of `calltape import` of 1M events without ids into SQLite (--quick: 20k)",
    ),
}


@dataclass(frozen=True, slots=True)
class Sizes:
    burst_sessions: int
    burst_per_session: int
    burst_repeats: int
    sustained_sessions: int
    sustained_rate: float
    sustained_seconds: float
    sustained_repeats: int
    durable_idle: int
    emit_tight: int
    long_session: int
    read_repeats: int
    snapshot_tail: int
    resume_events: int
    resume_repeats: int
    resume_by_events: tuple[int, ...]
    resume_by_repeats: int
    interrupt_samples: int
    interrupt_load_sessions: int
    es_per_event: int
    scale_points: tuple[int, ...]
    scale_seconds: float
    scale_bisect: int
    sqlite_sessions: int
    sqlite_per_session: int
    sqlite_repeats: int
    peer_turns: tuple[int, ...]
    peer_repeats: int
    peer_resumes: int
    import_events: int


QUICK = Sizes(
    burst_sessions=200,
    burst_per_session=25,
    burst_repeats=2,
    sustained_sessions=200,
    sustained_rate=20,
    sustained_seconds=2.0,
    sustained_repeats=2,
    durable_idle=100,
    emit_tight=5_000,
    long_session=10_000,
    read_repeats=3,
    snapshot_tail=500,
    resume_events=5_000,
    resume_repeats=20,
    resume_by_events=(2_000, 5_000, 10_000),
    resume_by_repeats=10,
    interrupt_samples=100,
    interrupt_load_sessions=50,
    es_per_event=300,
    scale_points=(200, 1_000),
    scale_seconds=1.0,
    scale_bisect=0,
    sqlite_sessions=100,
    sqlite_per_session=20,
    sqlite_repeats=1,
    peer_turns=(10, 50),
    peer_repeats=1,
    peer_resumes=5,
    import_events=20_000,
)

FULL = Sizes(
    burst_sessions=200,
    burst_per_session=400,
    burst_repeats=3,
    sustained_sessions=200,
    sustained_rate=20,
    sustained_seconds=10.0,
    sustained_repeats=3,
    durable_idle=500,
    emit_tight=50_000,
    long_session=100_000,
    read_repeats=5,
    snapshot_tail=500,
    resume_events=50_000,
    resume_repeats=100,
    resume_by_events=(10_000, 50_000, 200_000),
    resume_by_repeats=30,
    interrupt_samples=500,
    interrupt_load_sessions=200,
    es_per_event=2_000,
    scale_points=(200, 1_000, 2_000, 5_000),
    scale_seconds=5.0,
    scale_bisect=3,
    sqlite_sessions=200,
    sqlite_per_session=200,
    sqlite_repeats=3,
    peer_turns=(10, 100, 1_000),
    peer_repeats=3,
    peer_resumes=20,
    import_events=1_000_000,
)


def _r(value: float | None, digits: int = 3) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return round(value, digits)


def _paired(num: Sequence[float], den: Sequence[float]) -> Spread:
    return Spread.of([a / b for a, b in zip(num, den, strict=False) if b])


class Suite:
    def __init__(self, admin_url: str, sizes: Sizes, quick: bool, console: Console, only: set[str] | None) -> None:
        self.admin_url = admin_url
        self.sizes = sizes
        self.quick = quick
        self.console = console
        self.only = only
        self.result: dict[str, Any] = {key: None for key in HEADLINE_KEYS}
        self.details: dict[str, Any] = {}
        self.spread: dict[str, Spread] = {}
        self.notes: list[str] = []

    def log(self, text: str) -> None:
        self.console.log(text, highlight=False)

    def wants(self, name: str) -> bool:
        return self.only is None or name in self.only

    async def run(self) -> dict[str, Any]:
        from bench import es
        from bench.db import scratch_database, server_facts
        from calltape.eventstore import open_store

        started = time.perf_counter()
        self.details["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
        async with scratch_database(self.admin_url) as scratch:
            self.log(f"scratch database {scratch.name}")
            self.details["server"] = await server_facts(scratch)
            store = await open_store(scratch.url)
            app = es.open_app(scratch.es_env("CallTapeApp"))
            try:
                for name, step in (
                    ("append", self.append),
                    ("latency", self.latency),
                    ("read", self.read),
                    ("resume", self.resume),
                    ("interrupt", self.interrupt),
                    ("scale", self.scale),
                    ("sqlite", self.sqlite),
                    ("peer", self.peer),
                    ("import", self.import_memory),
                ):
                    if not self.wants(name):
                        continue
                    self.log(f"[bold]{name}[/bold]")
                    t0 = time.perf_counter()
                    try:
                        await step(store, scratch, app)
                    except Exception as exc:  # one failing benchmark must not hide the others
                        self.notes.append(f"{name}: failed: {type(exc).__name__}: {exc}")
                        self.console.print(traceback.format_exc())
                    self.details.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
            finally:
                app.close()
                await store.close()
        self.details.setdefault("seconds", {})["total"] = round(time.perf_counter() - started, 1)
        return self.report()

    # -- 1 + 3: throughput ---------------------------------------------------------------------

    async def append(self, store: Any, scratch: Any, app: Any) -> None:
        from bench import append

        s = self.sizes
        runs = await append.throughput(
            store,
            scratch,
            app,
            sessions=s.burst_sessions,
            per_session=s.burst_per_session,
            repeats=s.burst_repeats,
            log=self.log,
        )
        ct = [r.calltape.rate for r in runs]
        raw = [r.raw_copy.rate for r in runs]
        unnest = [r.raw_unnest.rate for r in runs if r.raw_unnest]
        esr = [r.eventsourcing.rate for r in runs if r.eventsourcing]
        vs_raw = _paired(ct, raw)
        vs_es = _paired(ct, esr)
        self.result["append_ratio_vs_raw_copy"] = _r(vs_raw.median)
        self.result["append_ratio_vs_eventsourcing"] = _r(vs_es.median)
        self.spread["append_ratio_vs_raw_copy"] = vs_raw
        self.spread["append_ratio_vs_eventsourcing"] = vs_es
        batches = [b for r in runs for b in r.calltape.batches]
        self.details["append"] = {
            "events_per_run": runs[0].calltape.events,
            "sessions": s.burst_sessions,
            "calltape_events_per_s": Spread.of(ct).json(0),
            "raw_copy_events_per_s": Spread.of(raw).json(0),
            "raw_unnest_events_per_s": Spread.of(unnest).json(0),
            "eventsourcing_events_per_s": Spread.of(esr).json(0),
            "ratio_vs_raw_copy": vs_raw.json(),
            "ratio_vs_raw_unnest": _paired(ct, unnest).json(),
            "ratio_vs_eventsourcing": vs_es.json(),
            "calltape_emit_phase_s": Spread.of([r.calltape.emit_seconds for r in runs]).json(),
            "batch_size_mean": _r(statistics.mean(batches), 1) if batches else None,
            "batches_per_run": _r(len(batches) / len(runs), 1),
        }
        # eventsourcing as a live agent would use it without a recorder: one save per event
        await _truncate_es(scratch)
        tl = append.burst_timelines(s.burst_sessions, max(1, s.es_per_event // s.burst_sessions + 1), seed=99)
        per_event = await asyncio.to_thread(append.es_per_event, app, tl, s.es_per_event)
        self.details["append"]["eventsourcing_save_per_event_events_per_s"] = _r(per_event.rate, 0)
        self.log(f"  eventsourcing, one app.save per event: {per_event.rate:,.0f} ev/s")

    # -- 2: emit and durable append under load ---------------------------------------------------

    async def latency(self, store: Any, scratch: Any, app: Any) -> None:
        from bench import append
        from bench.db import truncate_calltape

        s = self.sizes
        emit_p99: list[float] = []
        durable_p99: list[float] = []
        lag_p99: list[float] = []
        raw_p99: list[float] = []
        ratios: list[float] = []
        runs = []
        raw = await scratch.connect()
        for rep in range(s.sustained_repeats + 1):
            await truncate_calltape(scratch)
            gc.collect()
            seconds = s.sustained_seconds if rep else min(1.0, s.sustained_seconds)
            r = await append.sustained(
                store, sessions=s.sustained_sessions, rate=s.sustained_rate, seconds=seconds, seed=rep, raw=raw
            )
            tag = "warm-up" if rep == 0 else f"repeat {rep}/{s.sustained_repeats}"
            self.log(
                f"  sustained {tag}: {r.offered / r.seconds:,.0f} ev/s offered, emit p99 "
                f"{percentile(r.emit_us, 99):.1f} us, durable p99 {percentile(r.durable_ms, 99):.2f} ms "
                f"(n={len(r.durable_ms)}; raw INSERT + COMMIT p99 {percentile(r.raw_commit_ms, 99):.2f} ms), "
                f"commit lag p99 {percentile(r.commit_lag_ms, 99):.1f} ms, "
                f"mean batch {statistics.mean(r.batches):.1f}"
            )
            if rep == 0:
                continue
            runs.append(r)
            emit_p99.append(percentile(r.emit_us, 99))
            durable_p99.append(percentile(r.durable_ms, 99))
            lag_p99.append(percentile(r.commit_lag_ms, 99))
            raw_p99.append(percentile(r.raw_commit_ms, 99))
            ratios.append(durable_p99[-1] / raw_p99[-1])
        await raw.close()
        e, d, q = Spread.of(emit_p99), Spread.of(durable_p99), Spread.of(ratios)
        self.result["durable_ratio_vs_raw_commit"] = _r(q.median, 2)
        self.spread["durable_ratio_vs_raw_commit"] = q
        self.result["emit_p99_us"] = _r(e.median, 2)
        self.result["durable_append_p99_ms"] = _r(d.median, 3)
        self.spread["emit_p99_us"] = e
        self.spread["durable_append_p99_ms"] = d
        idle = await append.durable_idle(store, count=s.durable_idle, seed=1)
        tight = append.emit_tight(s.emit_tight, seed=3)
        floor = await append.floor_single_commit(store, scratch, count=s.durable_idle, seed=2)
        last = runs[-1]
        self.details["latency"] = {
            "sessions": s.sustained_sessions,
            "offered_events_per_s": _r(statistics.mean(r.offered / r.seconds for r in runs), 0),
            "seconds_per_repeat": s.sustained_seconds,
            "emit_us_p99_per_repeat": [_r(x, 2) for x in emit_p99],
            "emit_us_last_repeat": latency_summary(last.emit_us, 2),
            "durable_ms_p99_per_repeat": [_r(x, 3) for x in durable_p99],
            "durable_ms_last_repeat": latency_summary(last.durable_ms),
            "raw_insert_commit_ms_p99_per_repeat": [_r(x, 3) for x in raw_p99],
            "raw_insert_commit_ms_last_repeat": latency_summary(last.raw_commit_ms),
            "durable_ratio_vs_raw_commit_per_repeat": [_r(x, 2) for x in ratios],
            "commit_lag_ms_p99_per_repeat": [_r(x, 2) for x in lag_p99],
            "commit_lag_ms_last_repeat": latency_summary(last.commit_lag_ms),
            "flush_tail_ms": [_r(r.flush_tail_ms, 2) for r in runs],
            "mean_batch_under_load": _r(statistics.mean(b for r in runs for b in r.batches), 1),
            "kept_up": all(r.committed >= r.offered for r in runs),
            "durable_ms_idle": latency_summary(idle),
            "store_append_one_event_ms_idle": latency_summary(floor["store_append"]),
            "raw_asyncpg_insert_commit_ms_idle": latency_summary(floor["raw_insert_commit"]),
            "emit_us_tight_loop": latency_summary(tight, 2),
        }

    # -- 4 + 5: read and rebuild -----------------------------------------------------------------

    async def read(self, store: Any, scratch: Any, app: Any) -> None:
        from bench import read

        s = self.sizes
        r = await read.read_benchmarks(
            store,
            scratch,
            app,
            events=s.long_session,
            repeats=s.read_repeats,
            snapshot_tail=s.snapshot_tail,
            log=self.log,
        )
        vs_es = _paired(r.es_read, r.calltape_read)
        rebuild = _paired(r.raw_read, r.rebuild_cold)
        snap = Spread.of([x * 1000 for x in r.rebuild_snapshot])
        self.result["read_ratio_vs_eventsourcing"] = _r(vs_es.median)
        self.result["rebuild_ratio_vs_raw_read"] = _r(rebuild.median)
        self.result["rebuild_snapshot_ms"] = _r(snap.median, 2)
        vs_raw = _paired(r.raw_read, r.calltape_read)
        self.result["read_ratio_vs_raw"] = _r(vs_raw.median)
        self.spread["read_ratio_vs_raw"] = vs_raw
        self.spread["read_ratio_vs_eventsourcing"] = vs_es
        self.spread["rebuild_ratio_vs_raw_read"] = rebuild
        self.spread["rebuild_snapshot_ms"] = snap

        def ms(xs: list[float]) -> dict[str, Any]:
            return Spread.of([x * 1000 for x in xs]).json(2)

        fold_rate = Spread.of([r.events / x for x in r.fold_only])
        self.details["read"] = {
            "events": r.events,
            "raw_read_decode_ms": ms(r.raw_read),
            "calltape_read_ms": ms(r.calltape_read),
            "eventsourcing_read_ms": ms(r.es_read),
            "eventsourcing_select_events_undecoded_ms": ms(r.es_select_raw),
            "calltape_rebuild_cold_ms": ms(r.rebuild_cold),
            "eventsourcing_repository_get_ms": ms(r.es_rebuild),
            "fold_only_ms": ms(r.fold_only),
            "fold_events_per_s": fold_rate.json(0),
            "read_ratio_vs_raw": vs_raw.json(),
            "rebuild_ratio_vs_eventsourcing_repository_get": _paired(r.es_rebuild, r.rebuild_cold).json(),
            "rebuild_snapshot_ms_p99": _r(percentile([x * 1000 for x in r.rebuild_snapshot], 99), 2),
            "rebuild_snapshot_cold_process_ms": ms(r.rebuild_snapshot_cold),
            "snapshot_tail_events": r.snapshot_tail,
            "snapshot_bytes": r.snapshot_bytes,
            "context_items": r.context_items,
        }
        self.log(
            f"  read {r.events:,}: raw {statistics.median(r.raw_read) * 1000:.0f} ms, calltape "
            f"{statistics.median(r.calltape_read) * 1000:.0f} ms, eventsourcing "
            f"{statistics.median(r.es_read) * 1000 if r.es_read else math.nan:.0f} ms; cold rebuild "
            f"{statistics.median(r.rebuild_cold) * 1000:.0f} ms; snapshot rebuild {snap.median:.1f} ms "
            f"(tail {r.snapshot_tail})"
        )

    # -- 6: runtime ----------------------------------------------------------------------------

    async def resume(self, store: Any, scratch: Any, app: Any) -> None:
        from bench import live

        s = self.sizes
        r = await live.resume_benchmark(store, events=s.resume_events, repeats=s.resume_repeats, log=self.log)
        # How resume and the snapshot rebuild grow with the call (goal: flat).
        by_events = []
        for n in s.resume_by_events:
            rn = (
                r
                if n == s.resume_events
                else await live.resume_benchmark(store, events=n, repeats=s.resume_by_repeats, log=self.log)
            )
            by_events.append(
                {
                    "events": rn.events,
                    "resume_p50_ms": _r(percentile(rn.real_ms, 50), 2),
                    "resume_p99_ms": _r(percentile(rn.real_ms, 99), 2),
                    "dry_run_p99_ms": _r(percentile(rn.dry_run_ms, 99), 2),
                    "rebuild_snapshot_ms": _r(statistics.median(rn.rebuild_ms), 2),
                    "rebuild_snapshot_cold_ms": _r(statistics.median(rn.rebuild_cold_ms), 2),
                    "snapshot_bytes": rn.snapshot_bytes,
                    "repeats": len(rn.real_ms),
                }
            )
        self.result["resume_p99_ms"] = _r(percentile(r.real_ms, 99), 2)
        # growth: p99 at the largest size over p99 at the smallest (200k and 10k in a full run)
        smallest, largest = by_events[0]["resume_p99_ms"], by_events[-1]["resume_p99_ms"]
        if smallest and largest is not None:
            self.result["resume_growth_200k_vs_10k"] = _r(largest / smallest, 2)
        self.spread["resume_p99_ms"] = Spread(percentile(r.real_ms, 99), min(r.real_ms), max(r.real_ms), len(r.real_ms))
        self.details["resume"] = {
            "events": r.events,
            "snapshot_seq": r.snapshot_seq,
            "settling_events": r.settled,
            "tool_decisions": r.tools,
            "resume_ms": latency_summary(r.real_ms, 2),
            "dry_run_ms": latency_summary(r.dry_run_ms, 2),
            "by_events": by_events,
        }
        self.log(
            f"  resume p50 {percentile(r.real_ms, 50):.1f} ms p99 {percentile(r.real_ms, 99):.1f} ms; "
            f"dry run p99 {percentile(r.dry_run_ms, 99):.1f} ms"
        )

    async def interrupt(self, store: Any, scratch: Any, app: Any) -> None:
        from bench import live

        s = self.sizes
        samples = await live.interrupt_release(
            store, samples=s.interrupt_samples, load_sessions=s.interrupt_load_sessions, rate=20, seed=1
        )
        self.result["interrupt_release_p99_ms"] = _r(percentile(samples, 99), 3)
        self.spread["interrupt_release_p99_ms"] = Spread(
            percentile(samples, 99), min(samples), max(samples), len(samples)
        )
        self.details["interrupt"] = {
            "load_sessions": s.interrupt_load_sessions,
            "release_ms": latency_summary(samples, 3),
        }
        self.log(f"  interrupt → released p50 {percentile(samples, 50):.3f} ms p99 {percentile(samples, 99):.3f} ms")

    # -- 7: how cost grows with load, and the embedded store ----------------------------------------

    async def scale(self, store: Any, scratch: Any, app: Any) -> None:
        from bench import scale
        from bench.db import truncate_calltape

        s = self.sizes
        curve, best = await scale.scale_curve(
            store,
            points=s.scale_points,
            rate=20,
            seconds=s.scale_seconds,
            bisect_steps=s.scale_bisect,
            reset=lambda: truncate_calltape(scratch),
            log=self.log,
        )
        self.result["max_sessions_sustained"] = best
        self.details["scale"] = {
            "rate_per_session": 20,
            "seconds_per_point": s.scale_seconds,
            "lag_goal_ms": scale.LAG_GOAL_MS,
            "points": [p.json() for p in curve],
        }

    async def sqlite(self, store: Any, scratch: Any, app: Any) -> None:
        from bench import sqlite_append

        s = self.sizes
        runs = await sqlite_append.sqlite_append(
            sessions=s.sqlite_sessions, per_session=s.sqlite_per_session, repeats=s.sqlite_repeats, log=self.log
        )
        ratio = _paired([r.calltape_per_s for r in runs], [r.raw_per_s for r in runs])
        self.result["sqlite_append_ratio_vs_raw"] = _r(ratio.median)
        self.spread["sqlite_append_ratio_vs_raw"] = ratio
        self.details["sqlite_append"] = {
            "events_per_run": runs[0].events,
            "calltape_events_per_s": Spread.of([r.calltape_per_s for r in runs]).json(0),
            "raw_sqlite3_events_per_s": Spread.of([r.raw_per_s for r in runs]).json(0),
            "batches_per_run": [r.batches for r in runs],
            "ratio_vs_raw": ratio.json(),
        }

    async def peer(self, store: Any, scratch: Any, app: Any) -> None:
        from bench import peer

        if not peer.available():
            self.notes.append(f"peer: {peer.PEER} is not installed (pip install -e '.[bench]'): its keys are null")
            return
        s = self.sizes
        results = await peer.peer_benchmark(
            sizes=s.peer_turns, repeats=s.peer_repeats, resumes=s.peer_resumes, log=self.log
        )
        largest = results.largest()
        checkpoint = Spread.of([peer.ratio(r.peer_checkpoint.wall_ms, r.calltape_turn.wall_ms, 99) for r in largest])
        restore = Spread.of([peer.ratio(r.peer_restore.wall_ms, r.calltape_resume.wall_ms, 50) for r in largest])
        self.result["turn_checkpoint_ratio_vs_session_continuity"] = _r(checkpoint.median)
        self.result["resume_ratio_vs_session_continuity"] = _r(restore.median)
        self.spread["turn_checkpoint_ratio_vs_session_continuity"] = checkpoint
        self.spread["resume_ratio_vs_session_continuity"] = restore
        self.details["peer"] = peer.details(results)

    async def import_memory(self, store: Any, scratch: Any, app: Any) -> None:
        from bench import importing

        figures: dict[str, Any] = {}
        with tempfile.TemporaryDirectory() as tmp:
            # a subprocess of its own (the kernel's peak of that process): run off this loop
            await asyncio.to_thread(importing.peak_memory, self.sizes.import_events, Path(tmp), figures)
        self.result["import_peak_rss_mb"] = figures["import_peak_rss_mb"]
        self.details["import"] = figures

    # -- output --------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        goals = {}
        for key, (cmp, goal, unit, what) in GOALS.items():
            value = self.result.get(key)
            met = None if value is None else (value >= goal if cmp == ">=" else value <= goal)
            goals[key] = {"goal": f"{cmp} {goal}", "unit": unit, "met": met, "what": what}
            if key in self.spread:
                goals[key]["spread"] = self.spread[key].json()
        out: dict[str, Any] = dict(self.result)
        out["goals"] = goals
        out["notes"] = self.notes
        out["details"] = self.details
        out["machine"] = machine_facts()
        out["mode"] = "quick" if self.quick else "full"
        out["sizes"] = {k: getattr(self.sizes, k) for k in self.sizes.__dataclass_fields__}
        return out


async def _truncate_es(scratch: Any) -> None:
    from bench.db import truncate_es

    await truncate_es(scratch)


def machine_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    facts["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            facts["memory_gb"] = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    from importlib.metadata import PackageNotFoundError, version

    for package in (
        "asyncpg",
        "sqlalchemy",
        "psycopg",
        "eventsourcing",
        "pydantic",
        "orjson",
        "pipecat-session-continuity",
    ):
        try:
            facts[package] = version(package)
        except PackageNotFoundError:  # pragma: no cover - informational only
            facts[package] = None
    return facts


def print_table(console: Console, out: dict[str, Any]) -> None:
    table = Table(title=f"calltape bench ({out['mode']})", show_lines=False)
    table.add_column("figure")
    table.add_column("median [min-max]", justify="right")
    table.add_column("goal", justify="right")
    table.add_column("", justify="center")
    table.add_column("what")
    for key in HEADLINE_KEYS:
        g = out["goals"][key]
        value = out[key]
        spread = g.get("spread")
        if value is None:
            text = "n/a"
        elif spread and spread["n"] > 1 and spread["min"] is not None:
            text = f"{value:g} [{spread['min']:g}-{spread['max']:g}]"
        else:
            text = f"{value:g}"
        mark = {True: "[green]✓[/green]", False: "[red]✗[/red]", None: "[yellow]-[/yellow]"}[g["met"]]
        table.add_row(f"{key} ({g['unit']})", text, g["goal"], mark, g["what"])
    console.print(table)
    d = out["details"]
    if "append" in d:
        a = d["append"]
        console.print(
            f"throughput ev/s (median): calltape {a['calltape_events_per_s']['median']:,.0f} · raw COPY "
            f"{a['raw_copy_events_per_s']['median']:,.0f} · raw unnest {a['raw_unnest_events_per_s']['median']:,.0f} · "
            f"eventsourcing {a['eventsourcing_events_per_s']['median'] or 0:,.0f} (same batches, mean "
            f"{a['batch_size_mean']}) · eventsourcing one save per event "
            f"{a['eventsourcing_save_per_event_events_per_s'] or 0:,.0f}",
            highlight=False,
        )
    if "latency" in d:
        lat = d["latency"]
        console.print(
            f"under load ({lat['offered_events_per_s']:,.0f} ev/s offered): commit lag p99 per repeat "
            f"{lat['commit_lag_ms_p99_per_repeat']} ms · durable idle p99 {lat['durable_ms_idle']['p99']} ms · "
            f"emit tight-loop p50/p99 {lat['emit_us_tight_loop']['p50']}/{lat['emit_us_tight_loop']['p99']} us",
            highlight=False,
        )
    if "read" in d:
        r = d["read"]
        console.print(
            f"{r['events']:,}-event session, ms (median): raw read+decode {r['raw_read_decode_ms']['median']} · "
            f"calltape read {r['calltape_read_ms']['median']} · "
            f"eventsourcing read {r['eventsourcing_read_ms']['median']} · "
            f"cold rebuild {r['calltape_rebuild_cold_ms']['median']} · fold only {r['fold_only_ms']['median']} "
            f"({r['fold_events_per_s']['median']:,.0f} ev/s) · eventsourcing repository.get "
            f"{r['eventsourcing_repository_get_ms']['median']}",
            highlight=False,
        )
    if "peer" in d:
        for point in d["peer"]["curve"]:
            pc, ct = point["peer_checkpoint"], point["calltape_turn_durable"]
            pr, cr = point["peer_restore"], point["calltape_resume"]
            console.print(
                f"{point['turns']:,} turns vs {d['peer']['peer']}, p50/p99 ms: checkpoint {pc['p50_ms']}/{pc['p99_ms']}"
                f" · calltape turn {ct['p50_ms']}/{ct['p99_ms']} · restore {pr['p50_ms']}/{pr['p99_ms']} · "
                f"calltape resume {cr['p50_ms']}/{cr['p99_ms']} (CPU p50 {pr['cpu_p50_ms']} vs {cr['cpu_p50_ms']})",
                highlight=False,
            )
    for note in out["notes"]:
        console.print(f"[yellow]note[/yellow]: {note}", highlight=False)


def main(argv: Sequence[str] | None = None) -> int:
    from bench.db import DEFAULT_ADMIN_URL

    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--db",
        default=os.environ.get("CALLTAPE_BENCH_DB", DEFAULT_ADMIN_URL),
        help="an admin URL of the PostgreSQL server; a scratch database is created and dropped "
        f"(default: $CALLTAPE_BENCH_DB or {DEFAULT_ADMIN_URL})",
    )
    parser.add_argument("--quick", action="store_true", help="CI-sized run (under 2 minutes)")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON to PATH")
    parser.add_argument(
        "--only",
        metavar="NAMES",
        help="comma-separated subset: append,latency,read,resume,interrupt,scale,sqlite,peer,import "
        "(every key is still written)",
    )
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    only = set(args.only.split(",")) if args.only else None
    suite = Suite(args.db, QUICK if args.quick else FULL, args.quick, console, only)
    out = asyncio.run(suite.run())
    print_table(Console(width=150), out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
        console.log(f"wrote {args.json}")
    return 0
