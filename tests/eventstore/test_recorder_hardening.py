"""The recorder under load, outages, concurrent processes and a poison event (issue 17, items 1, 2, 7).

Each test reproduces a failure found under faults: a flush that never returned under sustained load,
spill files of two processes sharing a name, one refused event stalling every session for seconds,
and close or a durable append waiting forever during an outage.
"""

from __future__ import annotations

import asyncio
import math
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from eventstore_support import TRIGGERS_ON_CITUS, TcpProxy, on_citus, started, text
from sqlalchemy import text as sql
from sqlalchemy.engine import make_url

from calltape.events import Event, make_event, parse_event
from calltape.eventstore import EventStore, open_store
from calltape.eventstore.recorder import DurableAppendTimeout, Recorder, RecorderSpilled


def through(pg_url: str, proxy: TcpProxy) -> str:
    return make_url(pg_url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)


async def test_flush_returns_under_sustained_load(store: EventStore, session_id: str) -> None:
    """flush() waits for what was accepted before it, not for an empty queue that never comes."""
    sessions = [f"{session_id}-{k}" for k in range(5)]
    rec = await Recorder(store).start()
    producing = True
    emitted: list[Event] = []

    async def produce() -> None:
        i = 0
        while producing:
            for s in sessions:  # 5 sessions, an event each per millisecond: the queue is never empty
                event = text(s, f"t{i}")
                rec.emit(event)
                emitted.append(event)
            i += 1
            await asyncio.sleep(0.001)

    try:
        for s in sessions:
            rec.emit(started(s))
        producer = asyncio.create_task(produce())
        await asyncio.sleep(0.2)
        first = len(emitted)
        for _ in range(3):
            before = list(emitted)
            t0 = time.perf_counter()
            await asyncio.wait_for(rec.flush(), 30)  # before the fix: never, while the load goes on
            assert time.perf_counter() - t0 < 20
            stored = {e.id for s in sessions for e in await store.read(s)}
            assert {e.id for e in before} <= stored
        # the load went on around the flushes (not necessarily during one: a SQLite flush can be over
        # in less than the producer's millisecond)
        assert len(emitted) > first
    finally:
        producing = False
        await producer
        await asyncio.wait_for(rec.close(), 30)


async def test_a_flush_waits_for_what_a_rejection_handler_records(store: EventStore, session_id: str) -> None:
    """Events a rejection handler writes (the runtime records a recovery) are part of the flush."""
    extra: list[Event] = []
    rec: Recorder

    def on_rejected(events: object, error: object) -> None:
        event = text(session_id, "noted")
        extra.append(event)
        rec.emit(event)

    rec = await Recorder(store, on_rejected=on_rejected).start()
    try:
        rec.emit(started(session_id))
        rec.emit(make_event(session_id, "session.started", {"agent": "again"}))  # refused: already started
        await asyncio.wait_for(rec.flush(), 10)
        assert [e.id for e in await store.read(session_id)][-1] == extra[0].id
    finally:
        await rec.close()


async def test_close_has_a_default_timeout_and_spills(pg_url, proxy, session_id, tmp_path) -> None:
    """`async with Recorder(...)` during an outage ends: after close_timeout the rest is spilled."""
    proxied = await open_store(through(pg_url, proxy))
    try:
        rec = await Recorder(proxied, retry_initial=0.02, retry_max=0.1, close_timeout=0.5).start()
        await rec.append(started(session_id))
        await proxy.kill()
        rec.emit(text(session_id, "during"))
        t0 = time.perf_counter()
        with pytest.raises(RecorderSpilled) as info:
            await asyncio.wait_for(rec.close(spill_dir=tmp_path), 10)
        assert time.perf_counter() - t0 < 3
        assert info.value.count == 1
        assert stat.S_IMODE(info.value.path.stat().st_mode) == 0o600
    finally:
        await proxied.close()


async def test_durable_append_times_out_and_says_what_happened(pg_url, proxy, session_id) -> None:
    proxied = await open_store(through(pg_url, proxy))
    try:
        async with Recorder(proxied, retry_initial=0.02, retry_max=0.1, close_timeout=20) as rec:
            await rec.append(started(session_id))
            await proxy.kill()
            # The first event becomes the batch being written (kept, retried through the outage);
            # the durable one queues behind it.
            rec.emit(text(session_id, "in flight"))
            await asyncio.sleep(0.1)
            queued = make_event(session_id, "tool.started", {"call": "c1"})
            with pytest.raises(DurableAppendTimeout) as info:
                await rec.append(queued, timeout=0.3)
            assert info.value.withdrawn
            assert "will not be written" in str(info.value)
            await proxy.restart()
            await asyncio.wait_for(rec.flush(), 10)
            log = await proxied.read(session_id)
            assert [e.type for e in log] == ["session.started", "user.text"]  # the withdrawn one never lands
            assert queued.id not in {e.id for e in log}
    finally:
        await proxied.close()


SPILLER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from calltape.events import make_event
    from calltape.eventstore.recorder import Recorder

    folder, who, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    start = float(sys.argv[4])
    while time.time() < start:
        pass
    for i in range(count):
        events = [make_event(f"{who}-{i}", "user.text", {"text": f"{who} {i} {k}"}) for k in range(5)]
        Recorder._spill(events, folder)
    """
)


def test_spill_files_of_concurrent_processes_never_collide(tmp_path: Path) -> None:
    """Three processes spilling 40 files each in the same milliseconds: 120 whole files, none lost."""
    start = time.time() + 1.5
    procs = [
        subprocess.Popen([sys.executable, "-c", SPILLER, str(tmp_path), f"p{n}", "40", str(start)]) for n in range(3)
    ]
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    files = sorted(tmp_path.iterdir())
    assert [f for f in files if not f.name.endswith(".jsonl")] == []  # no partial file left behind
    assert len(files) == 120
    seen = set()
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        events = [parse_event(line) for line in f.read_bytes().splitlines()]
        assert len(events) == 5 and len({e.session for e in events}) == 1
        seen.add(events[0].session)
    assert len(seen) == 120
    assert stat.S_IMODE(tmp_path.stat().st_mode) in (0o700, stat.S_IMODE(tmp_path.stat().st_mode))


async def _install_poison_trigger(store: EventStore, poison: str) -> None:
    """A rule only the database knows (as a constraint added by an operator would be): it refuses
    every event whose id is ``poison``."""
    engine = store.engine  # type: ignore[attr-defined]
    async with engine.begin() as conn:
        if on_citus(store):
            await conn.execute(sql(TRIGGERS_ON_CITUS))
        if store.dialect == "postgresql":
            await conn.execute(
                sql(
                    "CREATE OR REPLACE FUNCTION ct_test_poison() RETURNS trigger AS $$ BEGIN "
                    f"IF NEW.id = '{poison}' THEN RAISE EXCEPTION 'poison'; END IF; RETURN NEW; END $$ "
                    "LANGUAGE plpgsql"
                )
            )
            await conn.execute(sql("DROP TRIGGER IF EXISTS ct_test_poison ON ct_events"))
            await conn.execute(
                sql(
                    "CREATE TRIGGER ct_test_poison BEFORE INSERT ON ct_events "
                    "FOR EACH ROW EXECUTE FUNCTION ct_test_poison()"
                )
            )
        else:
            await conn.execute(sql("DROP TRIGGER IF EXISTS ct_test_poison"))
            await conn.execute(
                sql(
                    "CREATE TRIGGER ct_test_poison BEFORE INSERT ON ct_events "
                    f"WHEN NEW.id = '{poison}' BEGIN SELECT RAISE(ABORT, 'poison'); END"
                )
            )


async def _drop_poison_trigger(store: EventStore) -> None:
    engine = store.engine  # type: ignore[attr-defined]
    async with engine.begin() as conn:
        if on_citus(store):
            await conn.execute(sql(TRIGGERS_ON_CITUS))
        if store.dialect == "postgresql":
            await conn.execute(sql("DROP TRIGGER IF EXISTS ct_test_poison ON ct_events"))
        else:
            await conn.execute(sql("DROP TRIGGER IF EXISTS ct_test_poison"))


async def test_a_poison_event_is_isolated_at_once(store: EventStore, session_id: str) -> None:
    """One event the database refuses costs the other 40 sessions a few small appends, not seconds of
    retries, and is reported once; the rest of its own session is written."""
    poison = f"poison-{session_id}"
    sessions = [f"{session_id}-{k}" for k in range(41)]
    rejected: list[tuple[list[Event], Exception]] = []
    rec = await Recorder(store, on_rejected=lambda ev, err: rejected.append((list(ev), err))).start()
    await _install_poison_trigger(store, poison)
    try:
        for s in sessions:
            rec.emit(started(s))
        await rec.flush()
        batches_before = rec.stats.batches
        for s in sessions:
            rec.emit(text(s, "before"))
        rec.emit(make_event(sessions[7], "user.text", {"text": "4242 4242 4242 4242"}, id=poison))
        for s in sessions:
            rec.emit(text(s, "after"))
        t0 = time.perf_counter()
        await asyncio.wait_for(rec.flush(), 10)
        elapsed = time.perf_counter() - t0
    finally:
        await rec.close()
        await _drop_poison_trigger(store)
    assert [e.id for evs, _ in rejected for e in evs] == [poison]
    assert "4242" not in str(rejected[0][1])
    assert rec.stats.retries == 0
    assert rec.stats.batches - batches_before <= 2 * math.ceil(math.log2(41)) + 2 + 3
    assert elapsed < (6 if on_citus(store) else 2)  # (a Citus append costs several hops per shard)
    for s in sessions:
        assert [e.data.get("text") for e in await store.read(s)] == [None, "before", "after"]
