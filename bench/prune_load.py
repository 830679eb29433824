"""``python -m bench.prune_load``: a live recorder's latency while ``calltape prune`` erases 1,000,000 events.

Seeds ``--sessions`` x ``--events`` old events (60 days ago, realistic calls from ``workload.py``) into a
scratch PostgreSQL database (and, with ``--sqlite``, an SQLite file), then runs the sustained recorder load
of ``bench/append.py`` (``--load-sessions`` calls at ``--rate`` events/s each, plus a probe doing durable
appends) in windows of ``--window`` seconds: first without prune, then while the real CLI,
``calltape prune --older-than 30d``, runs in a subprocess, then without prune again. Per phase it reports
the emit latency (p50/p99, µs), the durable append latency (p50/p99, ms) and the emit-to-commit lag
(p50/p99, ms) pooled over its windows, the ratio of the prune phase's p99s to the baseline's (the same
load in the same process, minutes apart), and the prune's own duration and rate. Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson

from bench.append import sustained
from bench.db import plain_dsn, scratch_database
from bench.stats import latency_summary, percentile
from bench.workload import call_timeline
from calltape.eventstore import EventStore, SessionInfo, open_store

DAY_MS = 86_400_000
PRUNE_AGE = "30d"


def _old_rows(sessions: int, per: int) -> Iterator[tuple[list[tuple[Any, ...]], tuple[Any, ...]]]:
    """Per old session: its event rows and its summary row (last event 60 days ago)."""
    t0 = int(time.time() * 1000) - 60 * DAY_MS - sessions * per * 40
    at = t0
    for s in range(sessions):
        sid = f"old-{s:05d}"
        rows = []
        for seq, (kind, data) in enumerate(call_timeline(s, per), start=1):
            at += 40
            rows.append((sid, seq, f"{sid}-{seq}", kind, at, "support", 1, orjson.dumps(data).decode()))
        first = rows[0][4]
        yield rows, (sid, "support", None, "voice", None, "ended", len(rows), 1, first, at, True)


async def seed_postgres(url: str, sessions: int, per: int) -> int:
    """COPY the old calls straight into the tables (seeding is not what is measured)."""
    import asyncpg

    conn = await asyncpg.connect(plain_dsn(url))
    n = 0
    try:
        events: list[tuple[Any, ...]] = []
        summaries: list[tuple[Any, ...]] = []

        async def flush() -> None:
            await conn.copy_records_to_table(
                "ct_events", records=events, columns=["session", "seq", "id", "type", "at_ms", "agent", "epoch", "data"]
            )
            await conn.copy_records_to_table("ct_sessions", records=summaries, columns=_SESSION_COLUMNS)
            events.clear()
            summaries.clear()

        for rows, summary in _old_rows(sessions, per):
            events.extend(rows)
            summaries.append(summary)
            n += len(rows)
            if len(events) >= 100_000:
                await flush()
        if events:
            await flush()
        await conn.execute("VACUUM ANALYZE ct_events")
        await conn.execute("VACUUM ANALYZE ct_sessions")
    finally:
        await conn.close()
    return n


_SESSION_COLUMNS = [f.name for f in dataclasses.fields(SessionInfo)]


def seed_sqlite(path: Path, sessions: int, per: int) -> int:
    """The same old calls into an SQLite file already migrated by opening a store on it."""
    n = 0
    with contextlib.closing(sqlite3.connect(path)) as db:
        for rows, summary in _old_rows(sessions, per):
            db.executemany(
                "INSERT INTO ct_events (session, seq, id, type, at_ms, agent, epoch, data) VALUES (?,?,?,?,?,?,?,?)",
                rows,
            )
            db.execute(
                f"INSERT INTO ct_sessions ({', '.join(_SESSION_COLUMNS)}) VALUES ({','.join('?' * 11)})",
                summary,
            )
            n += len(rows)
            if n % 100_000 < per:
                db.commit()
        db.commit()
    return n


@contextlib.asynccontextmanager
async def running_prune(url: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """The real CLI in a subprocess: ``calltape --db URL prune --older-than 30d --json``."""
    code = "import sys; from calltape.cli.app import main; sys.exit(main(sys.argv[1:]))"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        "--db",
        url,
        "prune",
        "--older-than",
        PRUNE_AGE,
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "CALLTAPE_NO_PROGRESS": "1"},
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _windows(
    store: EventStore, *, count: int | None, until: asyncio.Task[Any] | None, args: Any, seed: int
) -> dict[str, Any]:
    """Runs load windows (``count`` of them, or until ``until`` is done) and pools their samples."""
    emit: list[float] = []
    durable: list[float] = []
    lag: list[float] = []
    offered = committed = windows = 0
    while (count is not None and windows < count) or (until is not None and not until.done()):
        r = await sustained(
            store,
            sessions=args.load_sessions,
            rate=args.rate,
            seconds=args.window,
            seed=seed + windows,
            probe_pause=0.05,
        )
        emit += r.emit_us
        durable += r.durable_ms
        lag += r.commit_lag_ms
        offered += r.offered
        committed += r.committed
        windows += 1
    return {
        "windows": windows,
        "seconds": windows * args.window,
        "offered": offered,
        "committed": committed,
        "emit_us": latency_summary(emit),
        "durable_ms": latency_summary(durable),
        "commit_lag_ms": latency_summary(lag),
        "_p99": (percentile(emit, 99), percentile(durable, 99), percentile(lag, 99)),
    }


async def measure(url: str, args: Any, log: Any) -> dict[str, Any]:
    """Baseline, prune phase, baseline again on one store; the ratios of the prune phase to the baselines."""
    store = await open_store(url)
    try:
        log("  baseline (no prune)")
        before = await _windows(store, count=args.baseline_windows, until=None, args=args, seed=100)
        log("  prune running")
        async with running_prune(url) as proc:
            started = time.perf_counter()
            done = asyncio.create_task(proc.communicate())
            during = await _windows(store, count=None, until=done, args=args, seed=200)
            out, err = await done
            prune_s = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"calltape prune failed: {err.decode().strip()}")
        report = json.loads(out)
        log("  baseline again")
        after = await _windows(store, count=args.baseline_windows, until=None, args=args, seed=300)
    finally:
        await store.close()
    base = [max(b, a) for b, a in zip(before.pop("_p99"), after.pop("_p99"), strict=True)]
    p99 = during.pop("_p99")
    return {
        "prune": {"sessions": report["sessions"], "events": report["events"], "seconds": round(prune_s, 1)},
        "prune_events_per_s": round(report["events"] / prune_s),
        "without_prune_before": before,
        "with_prune": during,
        "without_prune_after": after,
        # the prune phase's p99 over the worse of the two baselines: 1.0 = prune costs nothing
        "ratio_emit_p99": round(p99[0] / base[0], 2),
        "ratio_durable_p99": round(p99[1] / base[1], 2),
        "ratio_commit_lag_p99": round(p99[2] / base[2], 2),
    }


def _loadavg() -> list[float]:
    return [round(x, 1) for x in os.getloadavg()]


async def run(args: Any) -> dict[str, Any]:
    """Seeds and measures on PostgreSQL, then (``--sqlite``) on SQLite."""

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    figures: dict[str, Any] = {
        "sessions": args.sessions,
        "events_per_session": args.events,
        "load": f"{args.load_sessions} sessions x {args.rate:g} events/s + a durable-append probe",
        "window_s": args.window,
        "loadavg_start": _loadavg(),
    }
    if not args.no_postgres:
        async with scratch_database(args.db) as scratch:
            log(f"postgresql: seeding {args.sessions * args.events:,} old events")
            t0 = time.perf_counter()
            figures["postgres_seeded"] = await seed_postgres(scratch.url, args.sessions, args.events)
            log(f"  seeded in {time.perf_counter() - t0:.0f}s")
            figures["postgres"] = await measure(scratch.url, args, log)
            figures["loadavg_after_postgres"] = _loadavg()
    if args.sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/prune.db"
            await (await open_store(url)).close()  # migrates the file
            log(f"sqlite: seeding {args.sessions * args.events:,} old events")
            figures["sqlite_seeded"] = seed_sqlite(Path(tmp) / "prune.db", args.sessions, args.events)
            figures["sqlite"] = await measure(url, args, log)
            figures["loadavg_after_sqlite"] = _loadavg()
    return figures


def main() -> None:
    """Runs the prune-under-load benchmark and prints its figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", default=os.environ.get("CALLTAPE_BENCH_DB", "postgresql://postgres@127.0.0.1/test"))
    parser.add_argument("--sessions", type=int, default=1000, help="old sessions to prune")
    parser.add_argument("--events", type=int, default=1000, help="events per old session")
    parser.add_argument("--load-sessions", type=int, default=50)
    parser.add_argument("--rate", type=float, default=20.0, help="events/s per live session")
    parser.add_argument("--window", type=float, default=5.0, help="seconds per load window")
    parser.add_argument("--baseline-windows", type=int, default=3)
    parser.add_argument("--sqlite", action="store_true", help="also on an SQLite file")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
