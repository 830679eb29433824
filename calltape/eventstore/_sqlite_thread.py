"""The embedded store's writer: one thread with its own standard-library ``sqlite3`` connection.

Through aiosqlite every statement of an append is a hop to aiosqlite's thread and back to the event
loop (a queue, a future, a wake-up of the loop): an append of one batch of 200 sessions ran some 200
statements and spent most of its time in those hops. Here the whole append transaction (``BEGIN
IMMEDIATE``, the session rows, the duplicate look-up, the plan, ``executemany`` of the rows, the summaries,
``COMMIT``) is one call into the writer's thread: one hop per batch. The append steps are the same
:class:`~calltape.eventstore.writer.AppendWriter` code as everywhere else; its coroutines never
suspend on a :class:`ThreadDb`, so the thread runs them to the end with :func:`run_to_end`.

While SQLite works (``sqlite3`` releases the GIL around every step and around ``COMMIT``) the caller's
loop goes on: the voice loop's ``emit`` is not held behind the database's own work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from calltape.eventstore.queries import Db, Query

T = TypeVar("T")


def run_to_end(coro: Coroutine[Any, Any, T]) -> T:
    """Runs a coroutine that never suspends (one awaiting only a :class:`ThreadDb`) in this thread."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise RuntimeError("an append step waited on something other than the writer's own connection")


class ThreadDb(Db):
    """Compiled queries on the writer thread's ``sqlite3`` connection: the async methods run at once."""

    conn: sqlite3.Connection

    async def fetch(self, query: Query, **params: Any) -> Sequence[Sequence[Any]]:
        sql, args = query.bind(self.dialect, params)
        return self.conn.execute(sql, args).fetchall()

    async def fetch_sql(self, sql: str, args: Sequence[Any]) -> Sequence[Sequence[Any]]:
        """Rows of SQL text written for SQLite alone."""
        return self.conn.execute(sql, args).fetchall()

    async def execute(self, query: Query, **params: Any) -> int:
        sql, args = query.bind(self.dialect, params)
        return self.conn.execute(sql, args).rowcount

    async def executemany(self, query: Query, rows: Iterable[Mapping[str, Any]]) -> None:
        binds = [query.bind(self.dialect, r) for r in rows]
        if binds:
            self.conn.executemany(binds[0][0], [args for _, args in binds])

    async def insert_rows(self, sql: str, records: Sequence[Sequence[Any]]) -> None:
        """``executemany`` of ready-made positional rows."""
        self.conn.executemany(sql, records)


class WriterThread:
    """One thread owning one ``sqlite3`` connection, opened on first use; jobs run one at a time, in order."""

    def __init__(
        self, path: str, configure: Callable[[sqlite3.Connection], None], name: str = "calltape-sqlite-writer"
    ) -> None:
        self._path = path
        self._configure = configure
        self._name = name
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    async def run(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Runs ``job(connection)`` in the writer's thread; returns what it returned, raises what it raised."""
        if self._pid != os.getpid():
            # a forked child has no writer thread (threads do not survive fork) and must not share the
            # parent's SQLite connection: it opens its own, in a thread of its own
            self._pid, self._executor, self._conn = os.getpid(), None, None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, job)

    def _call(self, job: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            try:
                self._configure(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return job(self._conn)

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def close(self) -> None:
        """Closes the connection (after the jobs already handed over) and ends the thread."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._close_connection)
        finally:
            executor.shutdown(wait=False)


def in_transaction(conn: sqlite3.Connection, job: Callable[[], T]) -> T:
    """``job`` inside ``BEGIN IMMEDIATE`` … ``COMMIT`` (the write lock taken up front, as every writer
    of the file does); rolled back if it raises. Returns once the commit is done: durable as SQLite's
    ``synchronous`` setting makes it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = job()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # the first error is the one to report
                conn.execute("ROLLBACK")
        raise
    return result


WAL_CHECKPOINT_PAGES = 1000
"""WAL frames past which a passive checkpoint runs once the writer is idle (SQLite's own automatic
checkpoint threshold, which ran inside the commit that crossed it)."""

WAL_CAP_PAGES = 4 * WAL_CHECKPOINT_PAGES
"""WAL frames past which the checkpoint runs on the writer thread right after a commit even if the writer
never goes idle: the WAL stays bounded under a writer that is always busy."""

WAL_CAP_BYTES = WAL_CAP_PAGES * (4096 + 24)
"""The cap as the WAL file's size (4 KiB pages, each frame with its header). The writer's connection
sets ``journal_size_limit`` to it: SQLite truncates the WAL to it when it resets the log, so a WAL file
larger than this holds more frames than the cap since its last reset."""


def checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """A passive checkpoint (it never waits for a lock nor blocks a writer or a reader): ``(busy, frames in
    the WAL, frames checkpointed)``; ``(1, -1, -1)`` when another checkpoint holds the file."""
    try:
        row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    except sqlite3.OperationalError:
        return (1, -1, -1)
    return (int(row[0]), int(row[1]), int(row[2]))


class WalCheckpoints:
    """When the embedded store checkpoints its WAL: off the commit path (issue 32).

    The writer's connection runs with ``wal_autocheckpoint=0``: SQLite's automatic checkpoint ran inside
    the commit that pushed the WAL past 1,000 pages, a slow turn every ~1,000 events. Instead, once an
    append returns and no other append is waiting, and the WAL has grown past
    :data:`WAL_CHECKPOINT_PAGES`, a passive checkpoint runs on a thread and connection of its own (a
    passive checkpoint takes no write lock: an append meanwhile commits). Past :data:`WAL_CAP_PAGES` it
    runs on the writer's thread right after the commit that crossed the cap, before the appends queued
    behind it: the WAL is reset only by a write that starts after a complete checkpoint, which a writer
    that never idles would not leave.

    Python's ``sqlite3`` cannot tell how many frames a commit added (no WAL hook), so this counts commits
    and learns the frames per commit from what each checkpoint reports. The bookkeeping runs on the
    event loop's thread; the writer's thread only reads :meth:`over_cap`."""

    def __init__(self, path: str, configure: Callable[[sqlite3.Connection], None]) -> None:
        self._thread = WriterThread(path, configure, name="calltape-sqlite-checkpoint")
        self.frames_per_commit = 32.0
        """What a commit adds to the WAL, learnt from the checkpoints (a first guess until one ran)."""
        self.commits = 0
        """Commits since the last checkpoint began."""
        self.runs = 0
        """Checkpoints run so far (tests, benchmarks)."""
        self._task: asyncio.Task[None] | None = None
        self._wal = f"{path}-wal"
        self._pid = os.getpid()

    def estimate(self) -> float:
        """The WAL's frames not yet checkpointed, as far as this process's commits tell."""
        return self.commits * self.frames_per_commit

    def over_cap(self) -> bool:
        """True when the writer should checkpoint right after its commit (on the writer's thread): the WAL
        file has grown past the cap since its last reset (checkpoints on the other thread met appends and
        left no point at which to reset it, or the writer has not been idle for that long)."""
        try:
            return os.stat(self._wal).st_size > WAL_CAP_BYTES
        except OSError:
            return False

    def committed(self, idle: bool, inline: tuple[int, int, int] | None = None) -> None:
        """After an append's commit (``inline``: the checkpoint the writer ran right after it, past the
        cap): starts a checkpoint if one is due (``idle``: no append waits)."""
        self.commits += 1
        if self._pid != os.getpid():  # a forked child: the parent's checkpoint task is not its own
            self._pid, self._task = os.getpid(), None
        if inline is not None:
            self._account(self.commits, inline)
        elif idle and self.estimate() >= WAL_CHECKPOINT_PAGES and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(), name="calltape-sqlite-checkpoint")

    async def _run(self) -> None:
        commits = self.commits
        try:
            result = await self._thread.run(checkpoint)
        except Exception:  # a chore: the next commit tries again (an outage shows on the appends)
            return
        self._account(commits, result)

    def _account(self, commits: int, result: tuple[int, int, int]) -> None:
        busy, frames, done = result
        self.runs += 1
        if busy and frames < 0:
            return  # another checkpoint (another process's) is under way: count on, try again later
        if commits > 0 and frames > 0:
            # frames counts every commit since the WAL was last reset (another process's too): never
            # fewer than this process's, so the estimate errs towards checkpointing early
            self.frames_per_commit = min(max(frames / commits, 1.0), float(WAL_CHECKPOINT_PAGES))
        # what a reader's old snapshot kept from being checkpointed still counts
        left = round(max(frames - done, 0) / self.frames_per_commit)
        self.commits = max(0, self.commits - commits) + left

    async def close(self) -> None:
        """Waits for a checkpoint under way, then closes the checkpoint thread's connection."""
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(Exception):
                await task
        await self._thread.close()
