"""A Citus worker lost during a write is an outage, not a verdict on the events (issue 26 item 16).

Citus reports a worker stopped mid-transaction at COMMIT as an internal error (SQLSTATE XX000, "could
not commit transaction for shard … on at least one active node"). ``store.append`` must raise it as
:class:`~calltape.errors.StoreUnavailable`, and the recorder must retry it (never bisect the batch, never
refuse an event). On the single node the same COMMIT failure is made real by a deferred constraint trigger
that raises Citus's error while a switch table has a row; the test marked ``citus`` stops a worker for
real (see ``test_citus.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from eventstore_support import TRIGGERS_ON_CITUS, asyncpg_dsn, on_citus, started, text
from sqlalchemy import text as sql

from calltape.errors import StoreUnavailable
from calltape.events import Event
from calltape.eventstore import EventStore, open_store
from calltape.eventstore.errors import is_node_failure
from calltape.eventstore.recorder import Recorder

pytestmark = pytest.mark.postgres

REFUSAL = "the store refused"
"""What the recorder logs when it gives events a verdict (bisecting the batch), never for an outage."""

LOST_WORKER = "could not commit transaction for shard 102008 on at least one active node"


async def _install_lost_worker(store: EventStore, prefix: str) -> None:
    """At COMMIT (a deferred constraint trigger), Citus's error for a lost worker, for the events of
    sessions starting with ``prefix`` while ``ct_test_worker_down`` has a row (single node only)."""
    engine = store.engine  # type: ignore[attr-defined]
    async with engine.begin() as conn:
        await conn.execute(sql("CREATE TABLE IF NOT EXISTS ct_test_worker_down (down boolean)"))
        await conn.execute(
            sql(
                "CREATE OR REPLACE FUNCTION ct_test_lost_worker() RETURNS trigger AS $$ BEGIN "
                f"IF NEW.session LIKE '{prefix}%' AND EXISTS (SELECT 1 FROM ct_test_worker_down) THEN "
                f"RAISE EXCEPTION USING ERRCODE = 'XX000', MESSAGE = '{LOST_WORKER}'; END IF; "
                "RETURN NULL; END $$ LANGUAGE plpgsql"
            )
        )
        await conn.execute(sql("DROP TRIGGER IF EXISTS ct_test_lost_worker ON ct_events"))
        await conn.execute(
            sql(
                "CREATE CONSTRAINT TRIGGER ct_test_lost_worker AFTER INSERT ON ct_events "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ct_test_lost_worker()"
            )
        )


async def _drop_lost_worker(store: EventStore) -> None:
    engine = store.engine  # type: ignore[attr-defined]
    async with engine.begin() as conn:
        await conn.execute(sql("DROP TRIGGER IF EXISTS ct_test_lost_worker ON ct_events"))
        await conn.execute(sql("DROP TABLE IF EXISTS ct_test_worker_down"))


async def _worker(store: EventStore, down: bool) -> None:
    engine = store.engine  # type: ignore[attr-defined]
    async with engine.begin() as conn:
        await conn.execute(
            sql("INSERT INTO ct_test_worker_down VALUES (true)" if down else "DELETE FROM ct_test_worker_down")
        )


@pytest.fixture
async def lost_worker(pg_url: str, session_id: str):  # type: ignore[no-untyped-def]
    store = await open_store(pg_url)
    if on_citus(store):  # the switch table would live on the coordinator only: there a worker is stopped
        await store.close()
        pytest.skip("on the cluster, test_a_worker_stopped_during_writes_is_an_outage stops a real worker")
    await _install_lost_worker(store, session_id)
    try:
        yield store
    finally:
        await _drop_lost_worker(store)
        await store.close()


def test_citus_words_for_a_lost_worker_are_an_outage() -> None:
    for words in (
        LOST_WORKER,
        "could not commit transaction for shard 102008 on any active node",
        "could not commit transaction on any active node",
        "failure on connection marked as essential: 10.0.0.7:5432",
    ):
        assert is_node_failure(asyncpg.InternalServerError(words)), words
    assert not is_node_failure(asyncpg.InternalServerError("poison"))  # another internal error: a verdict
    assert not is_node_failure(asyncpg.RaiseError(LOST_WORKER))  # the words without Citus's SQLSTATE


async def test_a_commit_that_loses_a_worker_is_store_unavailable(lost_worker: EventStore, session_id: str) -> None:
    store = lost_worker
    await _worker(store, down=True)
    events = [started(session_id), text(session_id, "one")]
    with pytest.raises(StoreUnavailable) as info:
        await store.append(events)
    assert LOST_WORKER in str(info.value) and "one" not in str(info.value).replace(LOST_WORKER, "")
    assert await store.read(session_id) == []  # rolled back whole
    await _worker(store, down=False)
    stored = await store.append(events)  # the retry, once the worker is back
    assert [e.seq for e in stored] == [1, 2]
    assert [e.id for e in await store.read(session_id)] == [e.id for e in events]


async def test_the_recorder_retries_a_lost_worker_and_refuses_nothing(
    lost_worker: EventStore, session_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = lost_worker
    sessions = [f"{session_id}-{k}" for k in range(12)]
    rejected: list[Event] = []
    rec = Recorder(store, retry_initial=0.05, retry_max=0.2, on_rejected=lambda ev, _: rejected.extend(ev))
    await rec.start()
    try:
        await _worker(store, down=True)
        with caplog.at_level(logging.WARNING, logger="calltape"):
            for s in sessions:
                rec.emit(started(s))
                for i in range(30):
                    rec.emit(text(s, f"n{i}"))
            await asyncio.sleep(1.0)  # the worker stays down for a second of retries
            assert rec.stats.retries >= 2 and rec.pending == len(sessions) * 31
            await _worker(store, down=False)
            await asyncio.wait_for(rec.flush(), 30)
    finally:
        await rec.close()
    assert rejected == []
    assert not [r for r in caplog.records if REFUSAL in r.getMessage()], caplog.text
    assert any(LOST_WORKER in r.getMessage() and "retrying" in r.getMessage() for r in caplog.records)
    for s in sessions:
        assert [e.data.get("text") for e in await store.read(s)] == [None, *(f"n{i}" for i in range(30))]


async def test_without_the_switch_the_trigger_lets_every_commit_through(lost_worker: EventStore) -> None:
    """The fixture itself: nothing fails while the worker is up (so the tests above fail for the reason named)."""
    session = f"other-{uuid.uuid4().hex[:8]}"
    assert [e.seq for e in await lost_worker.append([started(session)])] == [1]
    conn = await asyncpg.connect(asyncpg_dsn(lost_worker.url))
    try:
        assert await conn.fetchval("SELECT count(*) FROM ct_test_worker_down") == 0
    finally:
        await conn.close()


# -- on the cluster ----------------------------------------------------------------------------

STOP_ENV, START_ENV = "CALLTAPE_TEST_CITUS_WORKER_STOP", "CALLTAPE_TEST_CITUS_WORKER_START"
"""Shell commands that stop and start one worker (``{host}`` and ``{port}`` are filled in), for example
``pg_ctl -D /srv/citus/w{port} stop -m fast``. Without them the test stops the worker serving the suite's
database from SQL: no new connection is let in, every open one is ended (what the coordinator sees of a
stopped worker), and it lets them in again to start it."""


async def _run(command: str, host: str, port: int) -> None:
    proc = await asyncio.create_subprocess_shell(command.format(host=host, port=port))
    assert await asyncio.wait_for(proc.wait(), 60) == 0, command


async def _stop_worker(url: str, host: str, port: int, stop: bool) -> None:
    import os

    command = os.environ.get(STOP_ENV if stop else START_ENV)
    if command:
        await _run(command, host, port)
        return
    from sqlalchemy.engine import make_url

    name = make_url(url).database
    admin = await asyncpg.connect(asyncpg_dsn(url), host=host, port=port, database="postgres")
    try:
        await admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {"false" if stop else "true"}')
        if stop:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                name,
            )
    finally:
        await admin.close()


CITUS_LOST_AT_COMMIT = ("could not commit transaction", "failure on connection marked as essential")
"""Citus's words for a worker lost between a transaction's statements and its COMMIT (SQLSTATE XX000)."""

MAX_STOPS = 12
"""A stop catches one of the worker's transactions in its COMMIT most times (see ``_slow_commits``)."""


@contextlib.asynccontextmanager
async def _slow_commits(store: EventStore, session: str) -> AsyncIterator[None]:
    """The worker's COMMIT of each transaction that carries events of ``session`` takes 200 ms more (a
    deferred trigger, once a transaction): a stop then mostly finds a transaction committing, where
    without it about one stop in five did (the gap between a statement and its COMMIT is short)."""
    engine = store.engine  # type: ignore[attr-defined]
    async with engine.begin() as conn:
        await conn.execute(sql(TRIGGERS_ON_CITUS))
        await conn.execute(
            sql(
                "CREATE OR REPLACE FUNCTION ct_test_slow_commit() RETURNS trigger AS $$ BEGIN "
                "IF current_setting('ct_test.slept', true) IS DISTINCT FROM 'y' THEN "
                "PERFORM set_config('ct_test.slept', 'y', true); PERFORM pg_sleep(0.2); END IF; "
                "RETURN NULL; END $$ LANGUAGE plpgsql"
            )
        )
        await conn.execute(
            sql(
                "CREATE CONSTRAINT TRIGGER ct_test_slow_commit AFTER INSERT ON ct_events "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
                f"WHEN (NEW.session = '{session}') EXECUTE FUNCTION ct_test_slow_commit()"
            )
        )
    try:
        yield
    finally:
        async with engine.begin() as conn:
            await conn.execute(sql(TRIGGERS_ON_CITUS))
            await conn.execute(sql("DROP TRIGGER IF EXISTS ct_test_slow_commit ON ct_events"))


@pytest.mark.citus
async def test_a_worker_stopped_during_writes_is_an_outage(
    pg_url: str, session_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """40 calls keep writing while one worker is stopped for 2 s and started again, as many times as it
    takes (up to 12) for Citus to report the lost worker at a COMMIT (the case of issue 26 item 16, which
    the recorder used to refuse and bisect): the recorder retries, refuses nothing, and every event is
    stored once, in order."""
    from eventstore_support import settle

    sessions = [f"{session_id}-{k}" for k in range(40)]
    rejected: list[Event] = []
    coordinator = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        host, port, group = await coordinator.fetchrow(
            "SELECT nodename, nodeport, groupid FROM pg_dist_node WHERE noderole = 'primary' AND groupid > 0 "
            "ORDER BY groupid LIMIT 1"
        )
    finally:
        await coordinator.close()

    def lost_at_commit() -> bool:  # retried as an outage (fixed) or refused (the bug): either ends the stops
        messages = [r.getMessage() for r in caplog.records]
        return any(REFUSAL in m or any(words in m for words in CITUS_LOST_AT_COMMIT) for m in messages)

    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(await open_store(pg_url))
        placed = await store.placements(sessions)  # type: ignore[attr-defined]
        slow = next(s for s in sessions if placed[s][1] == group)  # a call whose shard is on that worker
        await stack.enter_async_context(_slow_commits(store, slow))
        rec = Recorder(store, retry_initial=0.05, retry_max=0.5, on_rejected=lambda ev, _: rejected.extend(ev))
        await rec.start()
        emitted, stops = 0, 0
        done = asyncio.Event()

        async def calls() -> None:  # 40 calls at 20 events/s each until the stops are over
            nonlocal emitted
            for s in sessions:
                rec.emit(started(s))
            while not done.is_set():
                for s in sessions:
                    rec.emit(text(s, f"n{emitted}"))
                emitted += 1
                await asyncio.sleep(0.05)

        stopped = False
        try:
            with caplog.at_level(logging.WARNING, logger="calltape"):
                writing = asyncio.create_task(calls())
                await asyncio.sleep(1.5)
                while stops < MAX_STOPS and not lost_at_commit():
                    await _stop_worker(pg_url, host, port, stop=True)
                    stopped, stops = True, stops + 1
                    await asyncio.sleep(2)
                    await _stop_worker(pg_url, host, port, stop=False)
                    stopped = False
                    await asyncio.sleep(1)
                done.set()
                await writing
                await asyncio.wait_for(rec.flush(), 120)
        finally:
            done.set()
            if stopped:
                await _stop_worker(pg_url, host, port, stop=False)
            await rec.close()
        await settle(store)
        assert lost_at_commit(), f"Citus reported no worker lost at COMMIT in {stops} stops"
        assert rejected == []
        # the recorder's verdict sentence, not any "refused": a stopped worker's "Connection refused" is
        # the outage itself, retried
        assert not [r for r in caplog.records if REFUSAL in r.getMessage()], caplog.text
        assert rec.stats.retries > 0
        for s in sessions:
            assert [e.data.get("text") for e in await store.read(s)] == [None, *(f"n{i}" for i in range(emitted))]
