"""The ``calltape check`` sweep: a day of calls (1,000,000 stored events in about 1,400 sessions)
checked by the real CLI in a subprocess, timed end to end, with its peak memory.

Memory is bounded by one session: the same sweep over a tenth of the sessions must peak at about the
same resident size, which this benchmark measures too.

    python -m bench.check_sweep                      # PostgreSQL scratch database, full size
    python -m bench.check_sweep --sqlite             # the embedded SQLite backend instead
    python -m bench.check_sweep --events 100000      # smaller
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.workload import call_timeline
from calltape.events import Event
from calltape.eventstore import EventStore, open_store

T0_MS = 1_764_000_000_000


async def fill(store: EventStore, sessions: int, events: int, log: Any) -> list[str]:
    """Writes ``sessions`` realistic calls of ``events // sessions`` events each (120 ms apart)."""
    per = events // sessions
    names: list[str] = []
    batch: list[Event] = []
    written = 0
    t0 = time.perf_counter()
    for i in range(sessions):
        name = f"sweep-{i:05d}"
        names.append(name)
        start = T0_MS + i * 60_000
        for j, (kind, data) in enumerate(call_timeline(1000 + i, per)):
            batch.append(Event(type=kind, data=data, session=name, at_ms=start + j * 120))
        if len(batch) >= 20_000:
            await store.append(batch)
            written += len(batch)
            batch = []
            log(f"  wrote {written:,} events ({time.perf_counter() - t0:.0f} s)")
    if batch:
        await store.append(batch)
    return names


def peak_rss_mib(args: Sequence[str], url: str) -> tuple[dict[str, Any], float]:
    """Runs the check and reads the child's peak RSS from ``wait4`` (Linux reports KiB)."""
    exe = shutil.which("calltape", path=str(Path(sys.executable).parent)) or "calltape"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [exe, "--db", url, "check", *args, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise RuntimeError(f"calltape check exited {code}: {err.decode().strip()}")
    violations = json.loads(out)
    result = {
        "seconds": round(seconds, 2),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
        "exit": code,
        "violations": len(violations),
        "by_rule": dict(Counter(v["rule"] for v in violations)),
    }
    return result, round(usage.ru_maxrss / 1024, 1)


async def sweep(url: str, sessions: int, events: int, log: Any) -> dict[str, Any]:
    store = await open_store(url)
    try:
        t0 = time.perf_counter()
        names = await fill(store, sessions, events, log)
        info = await store.sessions()
        stored = sum(i.last_seq for i in info)
        log(f"stored {stored:,} events in {len(info):,} sessions ({time.perf_counter() - t0:.0f} s)")
    finally:
        await store.close()
    full, full_rss = peak_rss_mib(["--all"], url)
    log(
        f"check --all: {full['seconds']} s ({full['cpu_seconds']} s of CPU), peak RSS {full_rss} MiB, "
        f"{full['violations']} violations"
    )
    tenth, tenth_rss = peak_rss_mib(names[: max(1, len(names) // 10)], url)
    log(f"check of a tenth of the sessions: {tenth['seconds']} s, peak RSS {tenth_rss} MiB")
    return {
        "backend": url.split(":", 1)[0],
        "events": stored,
        "sessions": len(info),
        "check_all_seconds": full["seconds"],
        "check_all_cpu_seconds": full["cpu_seconds"],
        "events_per_second": round(stored / full["seconds"]),
        "peak_rss_mib": full_rss,
        "peak_rss_mib_tenth_of_the_sessions": tenth_rss,
        "violations": full["violations"],
        "violations_by_rule": full["by_rule"],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    if args.sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            return await sweep(f"sqlite:///{tmp}/sweep.db", args.sessions, args.events, log)
    from bench.db import scratch_database

    async with scratch_database(args.db) as scratch:
        return await sweep(scratch.url, args.sessions, args.events, log)


def main(argv: Sequence[str] | None = None) -> int:
    from bench.db import DEFAULT_ADMIN_URL

    parser = argparse.ArgumentParser(prog="python -m bench.check_sweep", description=__doc__)
    parser.add_argument("--db", default=os.environ.get("CALLTAPE_BENCH_DB", DEFAULT_ADMIN_URL), help="admin URL")
    parser.add_argument("--sqlite", action="store_true", help="sweep an embedded SQLite file instead")
    parser.add_argument("--sessions", type=int, default=1400)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON to PATH")
    args = parser.parse_args(argv)
    out = asyncio.run(main_async(args))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
