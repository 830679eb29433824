"""The embedded store's write path against raw ``sqlite3``: the same rows, the same batches, WAL mode.

calltape side: the recorder's burst (``bench.append.calltape_burst``: sessions emitting round-robin as
fast as the loop allows, then ``flush()``) into a fresh SQLite file. Baseline: the rows calltape
stored, read back in commit order, written with the standard library's ``sqlite3``
``executemany`` into a table of the same shape (``ct_events``' own DDL and indexes, renamed) in a
second fresh file with the same pragmas (WAL, ``synchronous=NORMAL``), one transaction per batch of
the sizes the recorder formed, right after calltape's run of the same repeat.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.append import burst_timelines, calltape_burst
from calltape.eventstore import open_store

_COLUMNS = "session, seq, id, type, at_ms, agent, epoch, data"


@dataclass(slots=True)
class SqliteRun:
    calltape_per_s: float
    raw_per_s: float
    events: int
    batches: int


def _raw_write(source: Path, target: Path, batches: list[int]) -> tuple[int, float]:
    """Copies ``ct_events``' schema and rows from ``source`` into ``target`` the raw way; returns
    (rows, seconds spent writing)."""
    src = sqlite3.connect(source)
    try:
        ddl = [
            sql.replace("ct_events", "ct_events_raw")
            for (sql,) in src.execute(
                "SELECT sql FROM sqlite_master WHERE tbl_name = 'ct_events' AND sql IS NOT NULL "
                "AND type IN ('table', 'index') ORDER BY type DESC"
            )
        ]
        rows = src.execute(f"SELECT {_COLUMNS} FROM ct_events ORDER BY pos").fetchall()
    finally:
        src.close()
    dst = sqlite3.connect(target, isolation_level=None)
    try:
        dst.execute("PRAGMA journal_mode=WAL")
        dst.execute("PRAGMA synchronous=NORMAL")
        for sql in ddl:
            dst.execute(sql)
        insert = f"INSERT INTO ct_events_raw ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        sizes = batches or [len(rows)]
        t0 = time.perf_counter()
        at = 0
        for size in sizes:
            dst.execute("BEGIN")
            dst.executemany(insert, rows[at : at + size])
            dst.execute("COMMIT")
            at += size
        seconds = time.perf_counter() - t0
        assert at == len(rows), (at, len(rows))
    finally:
        dst.close()
    return len(rows), seconds


async def _calltape(path: Path, timelines: list[Any]) -> tuple[int, float, list[int]]:
    store = await open_store(f"sqlite:///{path}")
    try:
        result = await calltape_burst(store, timelines)
    finally:
        await store.close()
    return result.events, result.seconds, result.batches


async def sqlite_append(
    *, sessions: int, per_session: int, repeats: int, log: Callable[[str], None]
) -> list[SqliteRun]:
    """``repeats`` paired runs after one warm-up (not reported)."""
    runs: list[SqliteRun] = []
    for rep in range(repeats + 1):
        with tempfile.TemporaryDirectory() as tmp:
            timelines = burst_timelines(sessions, per_session, seed=700 + rep)
            ct_path, raw_path = Path(tmp) / "calltape.db", Path(tmp) / "raw.db"
            n, ct_seconds, batches = await _calltape(ct_path, timelines)
            rows, raw_seconds = await asyncio.to_thread(_raw_write, ct_path, raw_path, batches)
        if rep == 0:
            continue
        run = SqliteRun(n / ct_seconds, rows / raw_seconds, n, len(batches))
        runs.append(run)
        log(
            f"  sqlite repeat {rep}/{repeats}: calltape {run.calltape_per_s:,.0f} ev/s, raw sqlite3 "
            f"{run.raw_per_s:,.0f} ev/s ({run.batches} batches, ratio {run.calltape_per_s / run.raw_per_s:.3f})"
        )
    return runs


def main() -> None:
    """``python -m bench.sqlite_append``: this key alone (the full run's sizes by default); ``--profile
    PATH`` writes a cProfile of the calltape side (all threads' Python work lands in the main thread's
    profile only when the writer runs there: pair it with py-spy for the writer thread)."""
    import argparse
    import cProfile
    import statistics

    parser = argparse.ArgumentParser(prog="python -m bench.sqlite_append", description=__doc__)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--per-session", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", metavar="PATH", help="write a cProfile of the whole run to PATH")
    args = parser.parse_args()

    async def run() -> list[SqliteRun]:
        return await sqlite_append(
            sessions=args.sessions, per_session=args.per_session, repeats=args.repeats, log=print
        )

    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    runs = asyncio.run(run())
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    ratios = [r.calltape_per_s / r.raw_per_s for r in runs]
    print(
        f"sqlite_append_ratio_vs_raw: median {statistics.median(ratios):.3f} "
        f"[{min(ratios):.3f}-{max(ratios):.3f}] over {len(runs)} repeats"
    )


if __name__ == "__main__":
    main()
