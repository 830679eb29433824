"""``python -m bench.importing``: events per second through ``calltape import`` (the bulk path).

Generates ``--sessions`` x ``--events`` realistic events (``workload.py``), writes them as JSONL, and
times the command-line import in-process (parse, validate, one transaction) into a fresh SQLite file
and into a scratch PostgreSQL database; then times the same file again (the quick re-import).
Prints one JSON object: ``import_events_per_s`` per backend, ``import_cpu_us_per_event`` (this process's
CPU time per event: less sensitive to a busy machine than the wall clock; PostgreSQL's server work is
not in it) and ``reimport_s``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from sqlalchemy.engine import make_url

from bench.workload import call_timeline
from calltape.events import format_time


def _write(path: Path, sessions: int, per: int) -> int:
    t0 = 1_764_000_000_000
    n = 0
    with path.open("wb") as f:
        for s in range(sessions):
            sid = f"bench-{s:05d}"
            for i, (kind, data) in enumerate(call_timeline(s, per), start=1):
                row = {"id": f"{sid}-{i}", "session": sid, "type": kind, "at": format_time(t0 + i * 40), "data": data}
                f.write(orjson.dumps(row) + b"\n")
                n += 1
    return n


def _import(url: str, path: Path, cpu: dict[str, float] | None = None) -> float:
    """Seconds (wall) to import ``path``; ``cpu`` gets this process's CPU seconds under ``"s"`` (the
    database server's own work on PostgreSQL is not in it)."""
    from calltape.cli.app import main

    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        main(["--db", url, "import", str(path)])
    except SystemExit as exc:
        assert exc.code in (0, None), exc.code
    if cpu is not None:
        cpu["s"] = time.process_time() - cpu_started
    return time.perf_counter() - started


async def _admin(url: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def main() -> None:
    """Runs the import benchmark and prints its figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--db", default=os.environ.get("CALLTAPE_BENCH_DB", "postgresql://postgres@127.0.0.1/test"))
    args = parser.parse_args()
    os.environ["CALLTAPE_NO_PROGRESS"] = "1"
    figures: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "calls.jsonl"
        n = _write(path, args.sessions, args.events)
        figures["events"] = n
        cpu: dict[str, float] = {}
        seconds = _import(f"sqlite:///{tmp}/bench.db", path, cpu)
        figures["sqlite_import_events_per_s"] = round(n / seconds)
        figures["sqlite_import_cpu_us_per_event"] = round(cpu["s"] / n * 1e6, 1)
        figures["sqlite_reimport_s"] = round(_import(f"sqlite:///{tmp}/bench.db", path), 2)
        name = f"calltape_bench_{uuid.uuid4().hex[:10]}"
        asyncio.run(_admin(args.db, f'CREATE DATABASE "{name}"'))
        try:
            url = make_url(args.db).set(database=name).render_as_string(hide_password=False)
            from calltape.eventstore import upgrade

            asyncio.run(upgrade(url))
            seconds = _import(url, path, cpu)
            figures["postgres_import_events_per_s"] = round(n / seconds)
            figures["postgres_import_cpu_us_per_event"] = round(cpu["s"] / n * 1e6, 1)
            figures["postgres_reimport_s"] = round(_import(url, path), 2)
        finally:
            asyncio.run(_admin(args.db, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
