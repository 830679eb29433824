"""Fault runs: SIGKILLed writers and database outages, then an audit of the log.

    python -m bench.faults --kills 30 --outages 6          # about 2 minutes
    python -m bench.faults --db postgresql://postgres@127.0.0.1/test

Two experiments against a scratch PostgreSQL database (created and dropped here):

* **kills**: a writer process records 10 sessions (each writer its own), flushing every ~20 ms and
  printing the ids each flush acknowledged. It is SIGKILLed at a random moment and another takes its
  place. Audit: every acknowledged event is stored exactly once, and every session's seq is gapless.
* **outages**: one recorder, 50 sessions emitting 20 events/s each, talking to PostgreSQL through a TCP
  proxy that is cut for a few seconds, several times. Audit: every emitted event is stored exactly
  once, in emit order, with gapless seqs, and ``emit()`` never blocked. With ``--stop`` and ``--start``
  (shell commands) each outage stops the PostgreSQL server itself and starts it again instead, e.g.
  ``--stop 'pg_ctlcluster 15 faults stop -m immediate' --start 'pg_ctlcluster 15 faults start'``: give
  it a server of its own, never one that other work uses.

Prints one JSON object with the counts (``lost`` and ``duplicated`` must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from bench.db import DEFAULT_ADMIN_URL, scratch_database

_TEST_SUPPORT = Path(__file__).resolve().parent.parent / "tests" / "eventstore"

WRITER = r"""
import asyncio, sys
from calltape.events import make_event
from calltape.eventstore import open_store
from calltape.eventstore.recorder import Recorder

async def main(url, tag):
    store = await open_store(url)
    rec = await Recorder(store).start()
    sessions = [f"{tag}-{k}" for k in range(10)]
    for s in sessions:
        rec.emit(make_event(s, "session.started", {"agent": "a"}))
    i = 0
    while True:
        batch = []
        for s in sessions:
            e = make_event(s, "user.text", {"text": f"t{i}"})
            rec.emit(e)
            batch.append(e.id)
        i += 1
        if i % 10 == 0:
            await rec.flush()
            if acked:
                sys.stdout.write("\n".join(acked) + "\n")
                sys.stdout.flush()
            acked.clear()
        acked.extend(f"{s}\t{e}" for s, e in zip(sessions, batch))
        await asyncio.sleep(0.002)

acked = []
asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def _audit(url: str, expected: dict[str, list[str]] | None, acked: set[tuple[str, str]]) -> dict[str, Any]:
    from calltape.eventstore import open_store

    store = await open_store(url)
    stored = duplicated = gaps = out_of_order = 0
    present: set[tuple[str, str]] = set()
    try:
        for info in await store.sessions(limit=100_000):
            log = await store.read(info.session)
            stored += len(log)
            ids = [e.id for e in log]
            duplicated += len(ids) - len(set(ids))
            gaps += sum(1 for i, e in enumerate(log, 1) if e.seq != i)
            present |= {(info.session, i) for i in ids}
            if expected is not None and info.session in expected:
                if ids != expected[info.session]:
                    out_of_order += 1
    finally:
        await store.close()
    lost = len(acked - present)
    return {"stored": stored, "lost": lost, "duplicated": duplicated, "seq_gaps": gaps, "out_of_order": out_of_order}


def run_kills(url: str, kills: int) -> dict[str, Any]:
    acked: set[tuple[str, str]] = set()
    rng = random.Random(7)
    for n in range(kills):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, url, f"w{n}-{os.getpid()}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        lines: list[bytes] = []
        reader = threading.Thread(target=lines.extend, args=(proc.stdout,), daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while not lines and time.monotonic() < deadline:  # started writing (imports are slow under load)
            time.sleep(0.01)
        time.sleep(rng.uniform(0.2, 2.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        reader.join()
        for line in lines:
            session, _, event_id = line.decode().rstrip("\n").partition("\t")
            if event_id:
                acked.add((session, event_id))
    result = asyncio.run(_audit(url, None, acked))
    return {"kills": kills, "acknowledged": len(acked), **result}


async def _shell(command: str) -> None:
    proc = await asyncio.create_subprocess_shell(command)
    if await proc.wait() != 0:
        raise RuntimeError(f"{command!r} failed")


async def run_outages(url: str, outages: int, stop: str | None = None, start: str | None = None) -> dict[str, Any]:
    from sqlalchemy.engine import make_url

    from calltape.events import make_event
    from calltape.eventstore import open_store
    from calltape.eventstore.recorder import Recorder

    sys.path.insert(0, str(_TEST_SUPPORT))
    from eventstore_support import TcpProxy  # the same cuttable proxy the tests use

    u = make_url(url)
    proxy = TcpProxy(u.host or "127.0.0.1", u.port or 5432)
    await proxy.start()
    proxied = await open_store(u.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False))
    rec = await Recorder(proxied, retry_initial=0.02, retry_max=0.5, close_timeout=60).start()
    sessions = [f"out-{k}-{os.getpid()}" for k in range(50)]
    emitted: dict[str, list[str]] = {s: [] for s in sessions}
    slowest = 0.0
    producing = True

    async def session_loop(s: str) -> None:
        nonlocal slowest
        i = 0
        while producing:
            if i == 0:
                e = make_event(s, "session.started", {"agent": "a"})
            else:
                e = make_event(s, "user.text", {"text": str(i)})
            t0 = time.perf_counter()
            rec.emit(e)
            slowest = max(slowest, time.perf_counter() - t0)
            emitted[s].append(e.id)
            i += 1
            await asyncio.sleep(0.05 * random.uniform(0.8, 1.2))

    tasks = [asyncio.create_task(session_loop(s)) for s in sessions]
    try:
        for _ in range(outages):
            await asyncio.sleep(2)
            await (_shell(stop) if stop else proxy.kill())
            await asyncio.sleep(random.uniform(2, 5))
            await (_shell(start) if start else proxy.restart())
        await asyncio.sleep(2)
    finally:
        producing = False
        await asyncio.gather(*tasks)
        await rec.close()
        await proxied.close()
        await proxy.kill()
    acked = {(s, i) for s, ids in emitted.items() for i in ids}
    result = await _audit(url, emitted, acked)
    return {"outages": outages, "emitted": len(acked), "emit_max_ms": round(slowest * 1000, 2), **result}


def main(argv: list[str] | None = None) -> int:
    """Runs both experiments on a scratch database and prints the audit as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.faults")
    parser.add_argument("--db", default=os.environ.get("CALLTAPE_BENCH_DB", DEFAULT_ADMIN_URL))
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--outages", type=int, default=6)
    parser.add_argument("--stop", help="a shell command that stops the PostgreSQL server (with --start)")
    parser.add_argument("--start", help="a shell command that starts it again")
    args = parser.parse_args(argv)
    if (args.stop is None) != (args.start is None):
        parser.error("--stop and --start go together")

    report: dict[str, Any] = {}

    async def run() -> None:
        async with scratch_database(args.db) as db:
            url = db.url
            loop = asyncio.get_running_loop()
            report["kills"] = await loop.run_in_executor(None, run_kills, url, args.kills)
        async with scratch_database(args.db) as db:
            report["outages"] = await run_outages(db.url, args.outages, args.stop, args.start)

    asyncio.run(run())
    sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    ok = all(report[k]["lost"] == 0 and report[k]["duplicated"] == 0 and report[k]["seq_gaps"] == 0 for k in report)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
