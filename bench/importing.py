"""``python -m bench.importing``: events per second through ``calltape import`` (the bulk path).

Generates ``--sessions`` x ``--events`` realistic events (``workload.py``), writes them as JSONL, and
times the command-line import in-process (parse, validate, one transaction) into a fresh SQLite file
and into a scratch PostgreSQL database; then times the same file again (the quick re-import).
Prints one JSON object: ``import_events_per_s`` per backend, ``import_cpu_us_per_event`` (this process's
CPU time per event: the reader process and PostgreSQL's server work are not in it) and ``reimport_s``;
then ``import_peak_rss_mb``: the peak resident memory of ``calltape import`` (its largest process, in a
subprocess) of ``--rss-events`` events *without* ids (each gets a deterministic one, so the import keeps
a key per distinct line) into a fresh SQLite file, and ``import_peak_rss_mb_with_ids`` for the same
events with ids, when ``--rss-events N`` asks (the issue's figure: ``--rss-events 1000000 --only-rss``,
a few minutes); ``--only-rss`` measures only them.

``--baseline REV`` (say ``9bf6b83``, v0.1) also times that revision's ``calltape import`` on the same
file, in a subprocess on a checkout of it (``git worktree``), alternating with this one ``--repeat``
times, and reports both medians and their ratio: the speed-up on this machine, at this load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from sqlalchemy.engine import make_url

from bench.workload import call_timeline
from calltape.events import format_time


def _write(path: Path, sessions: int, per: int, *, ids: bool = True) -> int:
    t0 = 1_764_000_000_000
    n = 0
    with path.open("wb") as f:
        for s in range(sessions):
            sid = f"bench-{s:05d}"
            for i, (kind, data) in enumerate(call_timeline(s, per), start=1):
                row = {"session": sid, "type": kind, "at": format_time(t0 + i * 40), "data": data}
                if ids:
                    row["id"] = f"{sid}-{i}"
                f.write(orjson.dumps(row) + b"\n")
                n += 1
    return n


_PEAK = """
import os, resource, subprocess, sys
cli = "import sys; from calltape.cli.app import main; main(sys.argv[1:])"
done = subprocess.run([sys.executable, "-c", cli, "--db", sys.argv[1], "import", sys.argv[2]],
                      env=dict(os.environ, CALLTAPE_NO_PROGRESS="1"), capture_output=True, text=True)
assert done.returncode == 0, done.stderr
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak_rss_mb(url: str, path: Path) -> float:
    """The peak resident memory (MB) of ``calltape import`` of ``path``: of the largest of its processes
    (the importer, or its reader process), measured by the kernel (``ru_maxrss`` of the waited-for
    processes, through a fresh wrapper so that nothing else this run started counts)."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, url, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)),
    )
    return round(int(done.stdout.strip().splitlines()[-1]) / 1024, 1)  # ru_maxrss is in KiB on Linux


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


_TIMED = """
import os, sys, time
os.environ["CALLTAPE_NO_PROGRESS"] = "1"
from calltape.cli.app import main
if sys.argv[1].startswith("postgresql"):  # this revision's own schema, not timed
    import asyncio
    from calltape.eventstore import upgrade
    asyncio.run(upgrade(sys.argv[1]))
started = time.perf_counter()
try:
    main(["--db", sys.argv[1], "import", sys.argv[2]])
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print(time.perf_counter() - started)
"""


def _import_at(tree: Path, url: str, path: Path) -> float:
    """Seconds (wall) for the ``calltape import`` of the checkout ``tree``, in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [sys.executable, "-c", _TIMED, url, str(path)], cwd=tree, env=env, capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def _fresh_pg(admin: str, *, upgraded: bool = True) -> tuple[str, str]:
    """A new scratch database (its name and URL), with this revision's schema when ``upgraded``."""
    name = f"calltape_bench_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(admin, f'CREATE DATABASE "{name}"'))
    url = make_url(admin).set(database=name).render_as_string(hide_password=False)
    if upgraded:
        from calltape.eventstore import upgrade

        asyncio.run(upgrade(url))
    return name, url


def _compare(args: argparse.Namespace, path: Path, n: int, tmp: str, figures: dict[str, object]) -> None:
    """This revision against ``--baseline``, alternating, each on a fresh database every time."""
    tree, here = Path(tmp) / "baseline", Path(__file__).resolve().parent.parent
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), args.baseline], cwd=here, check=True)
    try:
        for backend in ("sqlite", "postgres"):
            times: dict[str, list[float]] = {"now": [], "baseline": []}
            for r in range(args.repeat):
                for side, root in (("baseline", tree), ("now", here)):
                    if backend == "sqlite":
                        url = f"sqlite:///{tmp}/{side}-{r}.db"
                        times[side].append(_import_at(root, url, path))  # (the file is created on first open)
                        continue
                    name, url = _fresh_pg(args.db, upgraded=False)  # each side upgrades with its own code
                    try:
                        times[side].append(_import_at(root, url, path))
                    finally:
                        asyncio.run(_admin(args.db, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            now, before = statistics.median(times["now"]), statistics.median(times["baseline"])
            figures[f"{backend}_import_events_per_s_median"] = round(n / now)
            figures[f"{backend}_baseline_events_per_s_median"] = round(n / before)
            figures[f"{backend}_speedup_vs_baseline"] = round(before / now, 2)
            figures[f"{backend}_runs_s"] = {k: [round(t, 2) for t in v] for k, v in times.items()}
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=here, check=False)


def peak_memory(events: int, tmp: Path, figures: dict[str, object]) -> None:
    """``import_peak_rss_mb`` (events without ids) and ``..._with_ids``, each into a fresh SQLite file."""
    per = 2000
    sessions = max(1, events // per)
    for key, ids in (("import_peak_rss_mb", False), ("import_peak_rss_mb_with_ids", True)):
        path = tmp / f"rss-{key}.jsonl"
        figures["rss_events"] = _write(path, sessions, per, ids=ids)
        figures[key] = peak_rss_mb(f"sqlite:///{tmp}/{key}.db", path)
        path.unlink()


def main() -> None:
    """Runs the import benchmark and prints its figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--db", default=os.environ.get("CALLTAPE_BENCH_DB", "postgresql://postgres@127.0.0.1/test"))
    parser.add_argument("--baseline", metavar="REV", help="Also time this git revision's import (e.g. 9bf6b83).")
    parser.add_argument("--repeat", type=int, default=3, help="Runs of each side with --baseline.")
    parser.add_argument(
        "--rss-events", type=int, default=0, metavar="N", help="Also measure the peak memory of importing N events."
    )
    parser.add_argument("--only-rss", action="store_true", help="Measure only the peak memory of an import.")
    args = parser.parse_args()
    os.environ["CALLTAPE_NO_PROGRESS"] = "1"
    figures: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "calls.jsonl"
        if args.rss_events:
            peak_memory(args.rss_events, Path(tmp), figures)
            if args.only_rss:
                print(json.dumps(figures, indent=2))
                return
        n = _write(path, args.sessions, args.events)
        figures["events"] = n
        if args.baseline:
            _compare(args, path, n, tmp, figures)
            print(json.dumps(figures, indent=2))
            return
        cpu: dict[str, float] = {}
        seconds = _import(f"sqlite:///{tmp}/bench.db", path, cpu)
        figures["sqlite_import_events_per_s"] = round(n / seconds)
        figures["sqlite_import_cpu_us_per_event"] = round(cpu["s"] / n * 1e6, 1)
        figures["sqlite_reimport_s"] = round(_import(f"sqlite:///{tmp}/bench.db", path), 2)
        name, url = _fresh_pg(args.db)
        try:
            seconds = _import(url, path, cpu)
            figures["postgres_import_events_per_s"] = round(n / seconds)
            figures["postgres_import_cpu_us_per_event"] = round(cpu["s"] / n * 1e6, 1)
            figures["postgres_reimport_s"] = round(_import(url, path), 2)
        finally:
            asyncio.run(_admin(args.db, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
