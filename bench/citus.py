"""``python -m bench.citus --citus URL``: calltape on a Citus cluster against a single PostgreSQL, same script.

Citus cannot be installed from this machine's package registries, so this is not part of the full run
or of CI: point ``--citus`` at the coordinator of a cluster (a database with the ``citus`` extension and
its workers added; ``calltape db upgrade`` distributes the tables there) and ``--db`` at a single
PostgreSQL admin URL (a scratch database is created and dropped). Both sides run the same workloads in
one process, alternating, ``--repeat`` times; medians, and the ratio single ÷ Citus (the cost of Citus):

* ``burst``: the recorder's group commit, ``--sessions`` sessions x ``--events`` events emitted
  round-robin, then ``flush()`` (events/s, first emit → all committed).
* ``appends``: one-event durable appends from 20 concurrent writers of their own sessions (appends/s).
* ``read``: ``store.read`` of a 5,000-event session (events/s).
* ``feed``: the global feed in pages of 1,000 over what the burst wrote (events/s).

On one machine the cluster's nodes share its cores and disk, so this measures Citus's overhead, not
its scale. Compare like with like: ``CREATE EXTENSION citus`` turns TLS on (a self-signed certificate,
``citus.node_conninfo = 'sslmode=require'`` between the nodes), so against a single PostgreSQL without
TLS pass ``?ssl=disable`` on the ``--citus`` URL and set ``citus.node_conninfo = 'sslmode=disable'``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid

from bench.append import burst_timelines, calltape_burst
from bench.db import plain_dsn
from calltape.events import make_event
from calltape.eventstore import START, EventStore, open_store, upgrade


async def _burst(store: EventStore, tag: str, sessions: int, per: int, seed: int) -> float:
    timelines = [(f"{tag}-{sid}", steps) for sid, steps in burst_timelines(sessions, per, seed)]
    return (await calltape_burst(store, timelines)).rate


async def _appends(store: EventStore, tag: str, writers: int = 20, each: int = 25) -> float:
    async def writer(w: int) -> None:
        session = f"{tag}-w{w}"
        await store.append([make_event(session, "session.started", {"agent": "bench"})])
        for i in range(each):
            await store.append([make_event(session, "user.transcript", {"text": f"line {i}", "final": True})])

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    return writers * (each + 1) / (time.perf_counter() - t0)


async def _read(store: EventStore, tag: str, n: int = 5000) -> float:
    session = f"{tag}-long"
    events = [make_event(session, "session.started", {"agent": "bench"})]
    events += [make_event(session, "user.transcript", {"text": f"line {i}", "final": True}) for i in range(n - 1)]
    for i in range(0, n, 1000):
        await store.append(events[i : i + 1000])
    best = []
    for _ in range(3):
        t0 = time.perf_counter()
        got = await store.read(session)
        best.append(time.perf_counter() - t0)
        assert len(got) == n
    return n / min(best)


async def _feed(store: EventStore) -> float:
    position, count = START, 0
    t0 = time.perf_counter()
    while True:
        rows = await store.feed(position, limit=1000)
        if not rows:
            break
        count += len(rows)
        position = rows[-1][0]
    return count / (time.perf_counter() - t0)


async def _round(url: str, args: argparse.Namespace, seed: int) -> dict[str, float]:
    store = await open_store(url)
    tag = f"b{uuid.uuid4().hex[:6]}"
    try:
        return {
            "burst": await _burst(store, tag, args.sessions, args.events, seed),
            "appends": await _appends(store, tag),
            "read": await _read(store, tag),
            "feed": await _feed(store),
        }
    finally:
        await store.close()


async def _run(args: argparse.Namespace) -> dict[str, object]:
    import asyncpg
    from sqlalchemy.engine import make_url

    name = f"calltape_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(plain_dsn(args.db))
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    single = make_url(plain_dsn(args.db)).set(database=name).render_as_string(hide_password=False)
    try:
        await upgrade(single)
        await upgrade(args.citus, citus=True)
        runs: dict[str, dict[str, list[float]]] = {"single": {}, "citus": {}}
        for r in range(args.repeat):
            for side, url in (("single", single), ("citus", args.citus)):
                for key, value in (await _round(url, args, seed=r * 10 + (side == "citus"))).items():
                    runs[side].setdefault(key, []).append(value)
    finally:
        admin = await asyncpg.connect(plain_dsn(args.db))
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    figures: dict[str, object] = {"sessions": args.sessions, "events_per_session": args.events}
    for key in runs["single"]:
        one, many = statistics.median(runs["single"][key]), statistics.median(runs["citus"][key])
        figures[f"{key}_single_per_s"] = round(one)
        figures[f"{key}_citus_per_s"] = round(many)
        figures[f"{key}_cost"] = round(one / many, 2)
    figures["runs"] = {side: {k: [round(v) for v in vs] for k, vs in r.items()} for side, r in runs.items()}
    return figures


def main() -> None:
    """Runs the comparison and prints its figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--citus", required=True, help="The Citus coordinator's database URL.")
    parser.add_argument("--db", default=os.environ.get("CALLTAPE_BENCH_DB", "postgresql://postgres@127.0.0.1/test"))
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    print(json.dumps(asyncio.run(_run(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
