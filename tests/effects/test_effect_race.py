"""Two real OS processes race one effect key (SPEC section 8): the action runs once, on SQLite and on
PostgreSQL, through the store's own concurrency control (one event per id in a session), not a lock in
memory. Both processes get the same output; the log passes the effect rules."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import orjson

from calltape.checks import check_events
from calltape.events import Event, make_event
from calltape.eventstore import open_store

WORKER = Path(__file__).with_name("race_worker.py")
ROUNDS = 5


async def _started(store_url: str, session_id: str) -> None:
    store = await open_store(store_url)
    try:
        await store.append([make_event(session_id, "session.started", {"agent": "billing"}, epoch=1)])
    finally:
        await store.close()


async def _log(store_url: str, session_id: str) -> list[Event]:
    store = await open_store(store_url)
    try:
        return await store.read(session_id)
    finally:
        await store.close()


def test_two_processes_racing_one_key_run_the_action_once(store_url: str, session_id: str, tmp_path: Path) -> None:
    asyncio.run(_started(store_url, session_id))
    ledger = tmp_path / "charges.txt"
    ledger.touch()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), store_url, session_id, str(ledger), str(ROUNDS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    try:
        for proc in procs:  # both attached, then both let go at once
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        results = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err.decode()
    first, second = (orjson.loads(out.splitlines()[-1]) for out, _ in results)
    charges = ledger.read_text().splitlines()
    assert sorted(line.split()[0] for line in charges) == [f"order-{n}" for n in range(ROUNDS)], charges
    assert first == second  # the loser is answered with the winner's recorded output
    assert all(r["status"] == "completed" for r in first)
    log = asyncio.run(_log(store_url, session_id))
    started = [e for e in log if e.type == "tool.effect" and e.data["phase"] == "started"]
    assert len(started) == ROUNDS
    assert [v.rule for v in check_events(log) if v.rule.endswith("-effect")] == []
