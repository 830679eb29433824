"""Bulk import: any number of batches, one transaction, all or nothing.

``calltape import`` of a million-event file must write nothing when any line is invalid or any
event is refused (a stale epoch, a second ``session.started``), whatever its size. ``store.append``
commits each call, so an import built on it leaves the first batches behind when a later one fails.
Here every batch goes through the same append rules (:func:`plan_append`), inside one transaction
opened for the whole import; the caller commits by leaving the ``async with`` block normally and
rolls everything back by raising.

The SQL is the backends' own append steps (:class:`~calltape.eventstore.writer.AppendWriter`:
COPY on PostgreSQL, one ``executemany`` on SQLite); the session rows are locked once per import,
kept in memory between batches and written back once at the end.

The transaction holds the SQLite write lock, and on PostgreSQL the locks of the imported sessions,
until it commits; on PostgreSQL the global feed also waits for it (readers never skip a
transaction still in flight). Import in the quiet hours if the file is very large.

On Citus an import over several shards commits by two-phase commit, whose worker rows become visible
only after the coordinator's transaction ended; the feed waits for Citus to confirm those commits
(see :mod:`.citus`), and the import asks for that confirmation as it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import exc as sa_exc

from calltape.errors import CalltapeError
from calltape.errors import ImportRefused as ImportRefused  # re-exported: public here since v0.1
from calltape.events import Event
from calltape.eventstore.append_plan import SessionInfo, plan_append
from calltape.eventstore.citus import CitusEventStore, settle_two_phase
from calltape.eventstore.errors import translate_errors
from calltape.eventstore.postgres import PgWriter, PostgresEventStore
from calltape.eventstore.sqlite import SqliteDb, SqliteWriter
from calltape.eventstore.store import EventStore
from calltape.eventstore.tenancy import admit
from calltape.eventstore.writer import AppendWriter
from calltape.redaction import Redactor

SQLITE_LOCK_WAIT = 600.0
"""Seconds an SQLite import waits for the write lock held by another import or writer."""


@dataclass(slots=True)
class ImportCounts:
    """What an import did (or would do, until it commits)."""

    new: int = 0
    """Events written."""
    stored: int = 0
    """Events skipped because the session already had their id."""
    sessions: set[str] = field(default_factory=set)
    """Sessions the imported events belong to (new or already stored)."""


class BulkImport:
    """One open import transaction; :meth:`add` batches, then leave the block to commit."""

    def __init__(
        self, writer: AppendWriter, *, allow_after_resume: bool = False, redactor: Redactor | None = None
    ) -> None:
        self.counts = ImportCounts()
        self._writer = writer
        self._redactor = redactor
        self._rows: dict[str, SessionInfo] = {}
        self._changed: dict[str, SessionInfo] = {}
        # An imported event without an epoch holds the epoch its own file established for its session
        # (1, raised by the file's session.resumed): a late spill file or an old export cannot write into
        # a call that was resumed since. allow_after_resume opts out (such events are not fenced).
        self._unmarked: dict[str, int] | None = None if allow_after_resume else {}

    async def add(self, events: Sequence[Event]) -> int:
        """Appends ``events`` inside the import transaction; returns how many were new.

        The events become the import's: each new one gets its ``seq`` in place. Raises
        :class:`ImportRefused` (naming the event by its index in ``events``) when the append rules
        refuse one; the import must then be abandoned (raise out of the block)."""
        if not events:
            return 0
        given = events
        if self._redactor is not None:  # redaction on write covers imports too (SPEC: the raw value never lands)
            events = self._redactor.events(events)
        events = admit(events, self._writer.tenant, self._writer.everyone)
        batch_sessions = {e.session for e in events}
        self.counts.sessions.update(batch_sessions)
        fresh = sorted(batch_sessions - self._rows.keys())
        if fresh:
            self._rows.update(await self._writer.lock_sessions(fresh))
        stored = await self._writer.lookup(events, self._rows)
        unmarked_before = dict(self._unmarked) if self._unmarked is not None else None
        try:
            plan = plan_append(events, self._rows, stored, unmarked=self._unmarked, owned=True)
        except CalltapeError as exc:
            culprit = events[self._culprit(events, stored, unmarked_before)]
            index = next(i for i, e in enumerate(given) if (e.session, e.id) == (culprit.session, culprit.id))
            raise ImportRefused(index, exc) from None
        if plan.inserts:
            await self._writer.insert(plan.inserts, plan.rows)
        self._rows.update(plan.rows)
        self._changed.update(plan.rows)
        self.counts.new += len(plan.inserts)
        self.counts.stored += len(events) - len(plan.inserts)
        return len(plan.inserts)

    def _culprit(
        self, events: Sequence[Event], stored: dict[tuple[str, str], Event], unmarked: dict[str, int] | None
    ) -> int:
        """The index of the first event the rules refuse (planned one by one; only on failure)."""
        rows = dict(self._rows)
        for index, event in enumerate(events):
            try:
                plan = plan_append([event], rows, stored, unmarked=unmarked, owned=True)
            except CalltapeError:
                return index
            rows.update(plan.rows)
            stored.update({(e.session, e.id): e for e in plan.inserts})
        return len(events) - 1  # pragma: no cover - the batch failed as a whole, so one event does

    async def finish(self) -> None:
        """Writes the session summaries back (called once, before the commit)."""
        if self._changed:
            await self._writer.update_sessions(list(self._changed.values()))

    async def stored_count(self, keys: Sequence[tuple[str, str]]) -> int:
        """How many of ``(session, id)`` the store already has (for the quick re-import check)."""
        return len(await self._writer.stored_keys(keys))


def _transaction(store: EventStore, conn: Any) -> contextlib.AbstractAsyncContextManager[Any]:
    """The import's transaction, with the store's tenant handed on where it must be (Citus)."""
    return store.transaction(conn) if isinstance(store, PostgresEventStore) else conn.transaction()


def _copy_in(store: EventStore) -> bool:
    """Whether the store's role may COPY (PostgreSQL refuses it under row-level security)."""
    return bool(getattr(store, "copy_in", True))


@contextlib.asynccontextmanager
async def bulk_import(store: EventStore, *, allow_after_resume: bool = False) -> AsyncIterator[BulkImport]:
    """``async with bulk_import(store) as imp: await imp.add(batch) ...``: one transaction for all
    batches; committed when the block ends normally, rolled back (nothing written) when it raises.

    Events without an epoch are fenced: each holds the epoch the import itself established for its
    session (1, raised by a ``session.resumed`` in the import), so they are refused once the session
    was resumed past that. ``allow_after_resume=True`` writes them anyway (an explicit opt-out)."""
    engine = getattr(store, "engine", None)
    if engine is None:
        raise CalltapeError(f"bulk import is not available for a {type(store).__name__}")
    if store.dialect == "sqlite":
        async with translate_errors(store.url):
            # Another import (or writer) may hold the write lock for a while: nothing is written yet,
            # so wait for it (beyond the driver's busy timeout) rather than fail.
            deadline = time.monotonic() + SQLITE_LOCK_WAIT
            while True:
                sa_conn = await engine.connect()
                try:
                    conn = await sa_conn.execution_options(calltape_begin="IMMEDIATE")
                    transaction = await conn.begin()
                    break
                except sa_exc.OperationalError as exc:
                    await sa_conn.invalidate()
                    await sa_conn.close()
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
            try:
                writer = SqliteWriter(SqliteDb(conn), store.tenant, store.all_tenants)
                sqlite_import = BulkImport(writer, allow_after_resume=allow_after_resume, redactor=store.redactor)
                try:
                    yield sqlite_import
                    await sqlite_import.finish()
                except BaseException:
                    await transaction.rollback()
                    raise
                await transaction.commit()
            finally:
                await sa_conn.close()
        return
    async with translate_errors(store.url, tenant=store.tenant), engine.connect() as sa_conn:
        raw = await sa_conn.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        try:
            async with _transaction(store, driver):
                # Citus: the import is one transaction over every shard it touches (two-phase commit).
                writer_class = getattr(store, "writer_class", PgWriter)
                pg_writer = writer_class(
                    driver, tenant=store.tenant, copy_in=_copy_in(store), everyone=store.all_tenants
                )
                pg_import = BulkImport(pg_writer, allow_after_resume=allow_after_resume, redactor=store.redactor)
                yield pg_import
                await pg_import.finish()
            if isinstance(store, CitusEventStore):
                # The feed waits until Citus has confirmed the two-phase commit on every worker: now,
                # rather than at its next recovery round (see citus.py).
                await settle_two_phase(driver)
        except BaseException:
            if driver.is_closed():
                await sa_conn.invalidate()
            raise


async def stored_keys(store: EventStore, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of ``(session, id)`` the store already has (a read; nothing is locked or written)."""
    if not keys:
        return set()
    engine = getattr(store, "engine", None)
    if engine is None:
        raise CalltapeError(f"bulk import is not available for a {type(store).__name__}")
    async with translate_errors(store.url), engine.connect() as sa_conn:
        if store.dialect == "sqlite":
            return await SqliteWriter(SqliteDb(sa_conn), store.tenant, store.all_tenants).stored_keys(keys)
        raw = await sa_conn.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        writer_class = getattr(store, "writer_class", PgWriter)  # Citus: routed to the sessions' shards
        async with store.reading(driver) if isinstance(store, PostgresEventStore) else contextlib.nullcontext():
            return await writer_class(driver, tenant=store.tenant, everyone=store.all_tenants).stored_keys(keys)
