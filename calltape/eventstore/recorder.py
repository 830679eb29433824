"""The recorder: what framework hooks call from inside the voice loop.

``emit()`` only enqueues (a deque append), so the audio loop never waits on the database. One writer
task per process group-commits everything queued, across sessions, in batches bounded by size
(``max_batch`` events per transaction: on Citus a batch is one transaction per worker node) and time
(``max_delay``). A durable append skips the wait and resolves once its batch has committed. On a store
whose appends may run side by side (PostgreSQL), a durable append whose session has nothing in the batch
being written does not wait behind that batch: it commits at once, with whatever its session had queued
before it, on a connection of its own (the session's *lane*); events of that session emitted meanwhile
follow it, so each session's order is still its emit order. When the database is unreachable the writer
keeps the batch, backs off and retries: nothing that ``emit()`` accepted is dropped. Memory is bounded
by ``max_pending``; past it ``emit()`` raises :class:`RecorderFull` (the event was *not* accepted) and
``await put()`` waits for room.

Nothing waits forever unless asked to: ``flush()`` waits only for what was accepted before it was
called (so it returns under sustained load), ``close()`` gives the database ``close_timeout`` seconds
and then spills what is unwritten to a file of its own, and a durable append gives up after
``durable_timeout`` seconds. One event the database refuses is found by bisecting its batch along
session lines, so it holds the other sessions back by about one batch, not seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
import warnings
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any

from calltape._backoff import Backoff
from calltape.errors import CalltapeError, StoreUnavailable
from calltape.errors import DurableAppendTimeout as DurableAppendTimeout  # re-exported: public here since v0.1
from calltape.errors import RecorderClosed as RecorderClosed
from calltape.errors import RecorderFull as RecorderFull
from calltape.errors import RecorderSpilled as RecorderSpilled
from calltape.events import Event, EventData, dumps_jsonl, make_event, now_ms
from calltape.eventstore.errors import is_transient
from calltape.eventstore.store import EventStore
from calltape.redaction import RedactingStream, Redactor

log = logging.getLogger("calltape.recorder")

RejectHandler = Callable[[Sequence[Event], CalltapeError], None]


@dataclass(slots=True)
class _Pending:
    event: Event
    done: asyncio.Future[Event] | None = None
    withdrawn: bool = False
    accepted: float = field(default_factory=time.monotonic)
    """When ``emit`` took it (monotonic seconds): how long it waits to commit is the commit lag."""


@dataclass(slots=True)
class RecorderStats:
    """Counters of the writer (batches, retries, rejections, outage time), for metrics and tests."""

    committed: int = 0
    batches: int = 0
    retries: int = 0
    rejected: int = 0
    largest_batch: int = 0
    outage_seconds: float = 0.0
    spilled: int = 0
    """Events ``close()`` saved to a spill file because the database did not take them in time."""
    last_commit_lag_seconds: float = 0.0
    """How long the oldest event of the latest committed batch waited from ``emit`` to its commit."""
    last_error: str | None = None
    _outage_started: float | None = field(default=None, repr=False)


def _log_rejected(events: Sequence[Event], error: CalltapeError) -> None:
    log.error("calltape rejected %d event(s) of session %s: %s", len(events), events[0].session, error)


_WAIT = object()
"""``close()``'s default: the recorder's own ``close_timeout``."""
_TRANSIENT_RETRIES = 3


class Recorder:
    """Batches events from the voice loop into group commits, so recording never waits on the database.

    ``emit`` enqueues (no I/O), ``append`` waits for the commit, ``close`` flushes or spills.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        max_batch: int = 1000,
        max_delay: float = 0.004,
        max_pending: int = 100_000,
        retry_initial: float = 0.05,
        retry_max: float = 2.0,
        on_rejected: RejectHandler = _log_rejected,
        close_timeout: float | None = 30.0,
        durable_timeout: float | None = 10.0,
        redactor: Redactor | None = None,
        durable_lanes: int | None = None,
    ) -> None:
        self.store = store
        self.max_batch = max_batch
        self._batch_cap = max_batch * max(1, store.write_groups)
        """Events per batch: ``max_batch`` for each transaction the store splits a batch into (one on a
        single database; one per worker node on Citus, where a 2,000-event batch of a 2-worker cluster is
        two transactions of about 1,000, each routed statement by statement through the coordinator)."""
        self.max_delay = max_delay
        self.max_pending = max_pending
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.on_rejected = on_rejected
        self.close_timeout = close_timeout
        self.durable_timeout = durable_timeout
        rules = redactor if redactor is not None else getattr(store, "redactor", None)
        self._redacting: RedactingStream | None = rules.stream() if rules is not None else None
        self.stats = RecorderStats()
        self.durable_lanes = int(getattr(store, "durable_lanes", 0)) if durable_lanes is None else durable_lanes
        """How many sessions' durable appends may commit at once beside the batch in flight (see the
        module's text); past that a durable append follows the batch, as with 0 (no lanes). The default
        is the store's: a few on PostgreSQL (each lane holds a pooled connection while it writes), none on
        SQLite, whose writers take turns on one file lock anyway (a lane would only add transactions)."""
        self._busy: set[str] = set()
        """Sessions of the batch the writer task is writing now: their durable appends follow it."""
        self._lanes: dict[str, list[_Pending]] = {}
        """Sessions whose lane is writing: what each emitted since, in order, to be written after it."""
        self._lane_batches: dict[str, list[_Pending]] = {}
        """What each lane is writing now."""
        self._lane_held = 0
        """Events in lanes (being written or waiting to follow): counted against ``max_pending``."""
        self._lane_tasks: set[asyncio.Task[None]] = set()
        self._queue: deque[_Pending] = deque()
        self._inflight = 0
        self._inflight_batch: list[_Pending] = []
        self._wake = asyncio.Event()
        self._hurry = asyncio.Event()
        self._durable = 0
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # flush() is bounded by counts: events accepted so far, and events finished (committed,
        # rejected or withdrawn). A flush waits for `finished` to reach `accepted` as it was.
        self._accepted = 0
        self._finished = 0
        self._flush_waiters: list[list[Any]] = []  # [target, future]
        self._in_handler = False
        self._watchers: dict[str, list[RejectHandler]] = {}
        self._last_refusal = CalltapeError("the store refused the write")
        self.on_commit: list[Callable[[Sequence[Event]], None]] = []
        """Told every batch of stored events (with their seq) once it committed, in the writer task:
        how the process's own calls reach a live observer (traces) without a read of the log. A failing
        observer is logged and never holds the writer back."""

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> Recorder:
        """Starts the writer task (idempotent); returns the recorder."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="calltape-recorder")
        return self

    async def __aenter__(self) -> Recorder:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, timeout: float | object | None = _WAIT, *, spill_dir: Path | None = None) -> None:
        """Flushes everything accepted, then stops the writer.

        A database that stays unreachable does not hold shutdown hostage: after ``timeout`` seconds
        (default: the recorder's ``close_timeout``, 30 s; ``None`` waits forever) what is still
        unwritten is saved as JSONL in a new file in ``spill_dir`` (default: beside the embedded
        database) and :class:`RecorderSpilled` says where. Import is idempotent, so loading that file
        later can never duplicate an event that did commit in the meantime.
        """
        if self._closed:
            return
        if timeout is _WAIT:
            timeout = self.close_timeout
        assert timeout is None or isinstance(timeout, (int, float))
        spilled: list[_Pending] = []
        try:
            if timeout is None:
                await self.flush()
            else:
                try:
                    async with asyncio.timeout(timeout):
                        await self.flush()
                except TimeoutError:
                    spilled = self._unwritten()
        finally:
            self._closed = True
            for lane in list(self._lane_tasks):
                lane.cancel()
            for lane in list(self._lane_tasks):
                with contextlib.suppress(asyncio.CancelledError):
                    await lane
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
                self._task = None
        if spilled:
            self.stats.spilled += len(spilled)
            error = RecorderSpilled(self._spill([p.event for p in spilled], spill_dir), len(spilled))
            for pending in spilled:  # a durable append still waiting is told, never left hanging
                if pending.done is not None and not pending.done.done():
                    pending.done.set_exception(error)
            raise error

    def _unwritten(self) -> list[_Pending]:
        self._release_held()
        lanes = [p for batch in self._lane_batches.values() for p in batch]
        lanes += [p for follow in self._lanes.values() for p in follow]
        pendings = [p for p in (*self._inflight_batch, *lanes, *self._queue) if not p.withdrawn]
        self._queue.clear()
        for follow in self._lanes.values():
            self._lane_held -= len(follow)
            follow.clear()
        return pendings

    @staticmethod
    def _spill(events: list[Event], spill_dir: Path | None) -> Path:
        """Writes a new file that no other process can be handed: a unique name, created exclusively,
        readable by its owner only, and linked into place only once complete (never a partial file,
        never an overwrite)."""
        from calltape.eventstore.connect import default_path

        folder = spill_dir or default_path().parent / "spill"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = f"calltape-spill-{now_ms()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        partial = folder / f".{name}.partial"
        path = folder / f"{name}.jsonl"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(dumps_jsonl(events))
                out.flush()
                os.fsync(out.fileno())
            os.link(partial, path)  # fails rather than replace an existing file
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
        return path

    @property
    def pending(self) -> int:
        """Events accepted and not yet committed (queued, held back by redaction, and being written)."""
        held = self._redacting.holding if self._redacting is not None else 0
        return len(self._queue) + self._inflight + self._lane_held + held

    @property
    def commit_lag(self) -> float:
        """Seconds the oldest event not yet committed has waited since it was accepted (0 when none
        waits): a few milliseconds while the database keeps up, growing through an outage."""
        heads = [b[0] for b in (self._inflight_batch, self._queue, *self._lane_batches.values()) if b]
        return max(0.0, time.monotonic() - min(p.accepted for p in heads)) if heads else 0.0

    # -- accepting ---------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        """Enqueues one validated event; never waits. Raises RecorderFull past ``max_pending``."""
        if self._closed:
            raise RecorderClosed("the recorder is closed")
        if len(self._queue) + self._inflight + self._lane_held >= self.max_pending:
            self._room.clear()
            raise RecorderFull(f"the recorder already holds {self.max_pending} unwritten events")
        queue = self._queue
        if self._lanes:
            self._enqueue([_Pending(e) for e in self._push(event)])
        elif self._redacting is None:
            queue.append(_Pending(event))
        else:
            queue.extend(_Pending(e) for e in self._redacting.push(event))
        self._accepted += 1
        if self._in_handler and self._flush_waiters:
            # Written by a rejection handler while a flush waits: part of what that flush settles.
            for waiter in self._flush_waiters:
                waiter[0] += 1
        self._idle.clear()
        if not self._wake.is_set():
            self._wake.set()
        if len(queue) >= self._batch_cap:
            self._hurry.set()

    async def put(self, event: Event) -> None:
        """Like :meth:`emit`, but waits for room instead of raising (backpressure)."""
        while True:
            try:
                self.emit(event)
                return
            except RecorderFull:
                await self._room.wait()

    async def append(self, event: Event, *, timeout: float | object | None = _WAIT) -> Event:
        """Durable append: returns the stored event once it has committed (after everything emitted before).

        Gives up after ``timeout`` seconds (default: the recorder's ``durable_timeout``, 10 s; ``None``
        waits forever) with :class:`DurableAppendTimeout`, which says whether the event was taken back.
        """
        return await self.submit(event, timeout=timeout)

    def submit(self, event: Event, *, timeout: float | object | None = _WAIT) -> Awaitable[Event]:
        """:meth:`append` in two steps: queues the event now (in order with every ``emit`` before and
        after this call) and returns what to await for its commit.

        A caller that must do something between queueing and waiting (the live session folds the
        event, so its fold keeps the log's order) uses this; the waiting is the same as ``append``'s.
        """
        if self._closed:
            raise RecorderClosed("the recorder is closed")
        if self._task is None:
            raise RecorderClosed("the recorder is not started (await recorder.start())")
        if timeout is _WAIT:
            timeout = self.durable_timeout
        assert timeout is None or isinstance(timeout, (int, float))
        done: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        pending = _Pending(event, done)
        if self._redacting is None:
            ready = [pending]
        else:
            # A durable event goes out now, with whatever its session had held back before it.
            ready = []
            for e in self._redacting.push(event) + self._redacting.release(event.session):
                if e.id == event.id:
                    pending.event = e
                    ready.append(pending)
                else:
                    ready.append(_Pending(e))
        self._accepted += 1
        session = event.session
        if session in self._lanes:
            self._enqueue(ready)  # follows its session's lane write, right after it
        elif session in self._busy or len(self._lanes) >= self.durable_lanes or len(self._queue) > self._batch_cap:
            # Follows its session's events in the batch being written (or every lane is taken, or the
            # writer is a batch or more behind: a lane would first search that whole queue, in the caller).
            self._queue.extend(ready)
            self._durable += 1
            self._hurry.set()
            self._wake.set()
        else:
            self._open_lane(session, ready)
        self._idle.clear()
        return self._committed(pending, timeout)

    def _push(self, event: Event) -> list[Event]:
        """The events ``event`` lets out: itself, or what redaction releases with it."""
        return [event] if self._redacting is None else self._redacting.push(event)

    def _enqueue(self, pendings: Sequence[_Pending]) -> None:
        """Queues for the writer task, or behind its session's lane while that lane writes."""
        lanes = self._lanes
        for pending in pendings:
            follow = lanes.get(pending.event.session) if lanes else None
            if follow is None:
                self._queue.append(pending)
                if pending.done is not None:
                    self._durable += 1
                    self._hurry.set()
            else:
                follow.append(pending)
                self._lane_held += 1
        self._wake.set()

    def _open_lane(self, session: str, ready: list[_Pending]) -> None:
        """Writes ``session``'s queued events and then ``ready`` (a durable append and what redaction let
        out with it) at once, beside the batch in flight. Its session has nothing in that batch, so the
        two never write the same session: order and fencing are decided per session, as before."""
        batch: list[_Pending] = []
        if any(p.event.session == session for p in self._queue):
            keep: list[_Pending] = []
            for p in self._queue:
                if p.event.session != session:
                    keep.append(p)
                elif not p.withdrawn:
                    batch.append(p)
                    if p.done is not None:
                        self._durable -= 1
            self._queue.clear()
            self._queue.extend(keep)
        others = [p for p in ready if p.event.session != session]  # (redaction keeps to one session)
        batch += [p for p in ready if p.event.session == session]
        self._lanes[session] = []
        self._lane_held += len(batch)
        if others:
            self._enqueue(others)
        task = asyncio.create_task(self._lane(session, batch), name="calltape-recorder-lane")
        self._lane_tasks.add(task)
        task.add_done_callback(self._lane_tasks.discard)

    async def _lane(self, session: str, batch: list[_Pending]) -> None:
        """One session's lane: writes its batch, then what followed it while a durable append is among
        those; hands the rest back to the writer task (group commit) and closes."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._lane_batches[session] = batch
                live = [p for p in batch if not p.withdrawn]
                if live:
                    await self._write(live, loop)
                self._lane_held -= len(batch)
                self._lane_batches.pop(session, None)
                batch = []
                follow = self._lanes[session]
                if not any(p.done is not None and not p.withdrawn for p in follow):
                    break
                batch, self._lanes[session] = follow, []
        finally:
            self._lane_held -= len(batch)
            self._lane_batches.pop(session, None)
            follow = self._lanes.pop(session, [])
            self._lane_held -= len(follow)
            live = [p for p in follow if not p.withdrawn]
            if live:
                self._queue.extend(live)
                self._durable += sum(1 for p in live if p.done is not None)
                self._wake.set()
            if not self._room.is_set() and self.pending < self.max_pending:
                self._room.set()

    async def _committed(self, pending: _Pending, timeout: float | None) -> Event:
        done = pending.done
        assert done is not None
        if timeout is None:
            return await done
        try:
            async with asyncio.timeout(timeout):  # (wait_for on 3.11 can lose the caller's cancellation)
                return await asyncio.shield(done)
        except TimeoutError:
            if done.done():
                return done.result()
            queued = pending in self._queue
            withdrawn = queued or pending in self._lanes.get(pending.event.session, ())
            if withdrawn:
                pending.withdrawn = True
                if queued:
                    self._durable -= 1
                self._finish(1)
            raise DurableAppendTimeout(timeout, withdrawn) from None

    def watch(self, session: str, handler: RejectHandler) -> Callable[[], None]:
        """Also tells ``handler`` about every refused event of ``session`` (after ``on_rejected``);
        returns the function that stops it. The live session uses it to keep refused writes out of
        its fold and to report fenced writes."""
        handlers = self._watchers.setdefault(session, [])
        handlers.append(handler)

        def unwatch() -> None:
            with contextlib.suppress(ValueError):
                handlers.remove(handler)
            if not handlers and self._watchers.get(session) is handlers:
                del self._watchers[session]

        return unwatch

    async def flush(self) -> None:
        """Waits until every event accepted before this call has committed (or been rejected).

        Events accepted later are not waited for, so a flush returns under sustained load.
        """
        if self._task is None and self._queue:
            raise RecorderClosed("the recorder is not started (await recorder.start())")
        self._release_held()
        if self._finished >= self._accepted:
            return
        waiter: list[Any] = [self._accepted, asyncio.get_running_loop().create_future()]
        self._flush_waiters.append(waiter)
        self._hurry.set()
        self._wake.set()
        try:
            await waiter[1]
        finally:
            with contextlib.suppress(ValueError):
                self._flush_waiters.remove(waiter)

    def _release_held(self, older_than_ms: int | None = None) -> None:
        """Queues what redaction held back (everything, or what waited longer than ``older_than_ms``)."""
        if self._redacting is not None and self._redacting.holding:
            released = self._redacting.release(older_than_ms=older_than_ms)
            self._enqueue([_Pending(e) for e in released])
            if released:
                self._wake.set()

    def _finish(self, count: int) -> None:
        """Counts events settled for good and wakes the flushes they complete."""
        self._finished += count
        if self._flush_waiters:
            for target, future in self._flush_waiters:
                if self._finished >= target and not future.done():
                    future.set_result(None)

    def session(self, session: str, *, agent: str | None = None, epoch: int | None = 1) -> _SessionTape:
        """A writer for one session: events made with its agent and epoch (the fencing token).

        ``epoch`` defaults to 1, the epoch ``session.started`` opens: the agent that started the call.
        Once the session is resumed (its epoch moves past the tape's), the tape's events are refused and
        go to ``on_rejected``. After a resume, pass the plan's epoch. ``epoch=None`` opts out of
        fencing: the tape's events carry no epoch and are written even after a resume.
        """
        return _SessionTape(self, session, agent=agent, epoch=epoch)

    # -- writing -----------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._redacting is not None and self._redacting.holding:
                # A held chunk whose turn went quiet is let out after hold_ms.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._redacting.hold_ms / 1000):
                        await self._wake.wait()
                self._release_held(older_than_ms=self._redacting.hold_ms)
            else:
                await self._wake.wait()
            self._wake.clear()
            if not self._queue:
                self._idle.set()
                continue
            if not self._hurry.is_set() and len(self._queue) < self._batch_cap:
                # Group commit: let the batch fill for up to max_delay, unless someone needs it now
                # (a durable append, a flush, or a full batch).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.max_delay):
                        await self._hurry.wait()
            while self._queue:
                batch = self._take()
                if not batch:
                    continue
                # A writer a batch or more behind sends the next batch while this one is in flight,
                # planned against the rows this one will leave (the store checks they did).
                ahead = self._take() if self._queue and self.store.pipelines else []
                self._inflight = len(batch) + len(ahead)
                self._inflight_batch = batch + ahead
                if self.durable_lanes:
                    self._busy = {p.event.session for p in self._inflight_batch}
                if ahead:
                    await self._write_pipelined(batch, ahead, loop)
                else:
                    await self._write(batch, loop)
                self._busy = set()
                self._inflight = 0
                self._inflight_batch = []
                if not self._room.is_set() and self.pending < self.max_pending:
                    self._room.set()
            if not self._durable and not self._flush_waiters:
                self._hurry.clear()
            self._idle.set()

    def _take(self) -> list[_Pending]:
        """The next batch off the queue (what was withdrawn meanwhile left out)."""
        n = min(len(self._queue), self._batch_cap)
        batch = [p for p in (self._queue.popleft() for _ in range(n)) if not p.withdrawn]
        self._durable -= sum(1 for p in batch if p.done is not None)
        return batch

    async def _write_pipelined(
        self, batch: list[_Pending], ahead: list[_Pending], loop: asyncio.AbstractEventLoop
    ) -> None:
        """Writes ``batch`` with ``ahead`` sent behind it. What the store could not decide ahead (its
        sessions' rows were not what ``batch`` left, or any error) is appended once ``batch`` is settled,
        so each session's events still commit in emit order. An id in both (the same fact emitted twice)
        is written in turn: the two inserts would wait on each other's unique keys."""
        keys = {(p.event.session, p.event.id) for p in batch}
        if any((p.event.session, p.event.id) in keys for p in ahead):
            await self._write(batch, loop)
            await self._write(ahead, loop)
            return
        sent = asyncio.ensure_future(self.store.append_ahead([p.event for p in ahead]))
        try:
            await self._write(batch, loop)
            try:
                stored = await sent
            except Exception:
                await self._write(ahead, loop)
            else:
                self._settle(ahead, stored)
        finally:
            if not sent.done():
                sent.cancel()
                with contextlib.suppress(BaseException):
                    await sent

    async def _write(self, batch: list[_Pending], loop: asyncio.AbstractEventLoop) -> None:
        try:
            stored = await self._append_retrying([p.event for p in batch], loop)
        except CalltapeError as exc:
            self._last_refusal = exc
            await self._write_apart(batch, loop)
        else:
            self._settle(batch, stored)
        if self.stats._outage_started is not None:
            self.stats.outage_seconds += loop.time() - self.stats._outage_started
            self.stats._outage_started = None

    async def _append_retrying(self, events: list[Event], loop: asyncio.AbstractEventLoop) -> list[Event]:
        """Retries an unreachable store forever (nothing accepted is dropped) and a transient conflict
        (serialization failure, deadlock, a busy SQLite file) a few times at once. A rule's verdict
        (fenced, invalid, conflict) is final, and any other error is treated as a verdict on this batch:
        retrying it would only hold every other session back. The writer never dies."""
        backoff = Backoff(self.retry_initial, self.retry_max)
        transient = 0
        while True:
            try:
                return await self.store.append(events)
            except StoreUnavailable as exc:
                self._note_outage(loop, str(exc))
                delay = backoff.next()
                log.warning("calltape: %s; %d event(s) kept, retrying in %.2fs", exc, self.pending, delay)
            except CalltapeError:
                raise
            except Exception as exc:
                if is_transient(exc) and transient < _TRANSIENT_RETRIES:
                    transient += 1
                    self.stats.retries += 1
                    await asyncio.sleep(0)
                    continue
                # The message names the error's type only: a driver's text may quote the row.
                log.error("calltape: the store refused %d event(s) (%s)", len(events), type(exc).__name__)
                raise CalltapeError(f"the store refused the write ({type(exc).__name__})") from exc
            await asyncio.sleep(delay)

    def _note_outage(self, loop: asyncio.AbstractEventLoop, error: str) -> None:
        self.stats.retries += 1
        self.stats.last_error = error
        if self.stats._outage_started is None:
            self.stats._outage_started = loop.time()

    async def _write_apart(self, batch: list[_Pending], loop: asyncio.AbstractEventLoop) -> None:
        """The store refused the batch: find the refused events by bisecting it along session lines, so
        one fenced zombie or one poison event costs the other calls of the process about
        2·log2(sessions) small appends, not a retry storm and not one append per session."""
        by_session = sorted(batch, key=lambda p: p.event.session)
        groups = [list(g) for _, g in groupby(by_session, key=lambda p: p.event.session)]
        await self._bisect(groups, loop)

    async def _bisect(self, groups: list[list[_Pending]], loop: asyncio.AbstractEventLoop) -> None:
        if len(groups) > 1:
            half = len(groups) // 2
            for part in (groups[:half], groups[half:]):
                pendings = [p for g in part for p in g]
                try:
                    self._settle(pendings, await self._append_retrying([p.event for p in pendings], loop))
                except CalltapeError as exc:
                    self._last_refusal = exc
                    await self._bisect(part, loop)
            return
        # One session's events, just refused together. A lone event has had its verdict; a longer run
        # is written one by one, in order, so only the refused events are lost.
        (group,) = groups
        if len(group) == 1:
            self._reject(group[0], self._last_refusal)
            return
        for pending in group:
            try:
                self._settle([pending], await self._append_retrying([pending.event], loop))
            except CalltapeError as exc:
                self._reject(pending, exc)

    def _reject(self, pending: _Pending, exc: CalltapeError) -> None:
        self.stats.rejected += 1
        self._in_handler = True
        try:
            for handler in (self.on_rejected, *self._watchers.get(pending.event.session, ())):
                try:
                    handler([pending.event], exc)
                except Exception:
                    log.exception("calltape: a rejection handler failed")
        finally:
            self._in_handler = False
        if pending.done is not None and not pending.done.done():
            pending.done.set_exception(exc)
        self._finish(1)

    def _settle(self, batch: Sequence[_Pending], stored: Sequence[Event]) -> None:
        self.stats.committed += len(batch)
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        if batch:
            self.stats.last_commit_lag_seconds = time.monotonic() - batch[0].accepted
        for pending, event in zip(batch, stored, strict=True):
            if pending.done is not None and not pending.done.done():
                pending.done.set_result(event)
        self._finish(len(batch))
        self.notify_committed(stored)

    def notify_committed(self, events: Sequence[Event]) -> None:
        """Tells the ``on_commit`` observers about stored events: the recorder's own batches, and what
        this process wrote to the store directly (a resume's settling events), so they miss nothing."""
        for observer in self.on_commit:
            try:
                observer(events)
            except Exception:
                log.exception("calltape: a commit observer failed")


class _SessionTape:
    """One session's writer handle: fills in the session, the agent and the writer's epoch.

    Private: make it with :meth:`Recorder.session` (a live call's writer is
    :class:`calltape.CallSession`); the old public name ``SessionTape`` still works, with a
    ``DeprecationWarning``.

    The epoch defaults to 1 (see :meth:`Recorder.session`); ``None`` writes unfenced.
    """

    def __init__(self, recorder: Recorder, session: str, *, agent: str | None = None, epoch: int | None = 1):
        self.recorder = recorder
        self.session = session
        self.agent = agent
        self.epoch = epoch

    def make(
        self, event_type: str, data: EventData = None, *, at_ms: int | None = None, id: str | None = None
    ) -> Event:
        """Builds a validated event of this session with the tape's agent and epoch."""
        return make_event(self.session, event_type, data, id=id, agent=self.agent, epoch=self.epoch, at_ms=at_ms)

    def emit(
        self, event_type: str, data: EventData = None, *, at_ms: int | None = None, id: str | None = None
    ) -> Event:
        """Records without waiting. A fixed ``id`` makes re-emitting the same fact harmless."""
        event = self.make(event_type, data, at_ms=at_ms, id=id)
        self.recorder.emit(event)
        return event

    async def append(
        self, event_type: str, data: EventData = None, *, at_ms: int | None = None, id: str | None = None
    ) -> Event:
        """Records one event and returns the stored event once it has committed."""
        return await self.recorder.append(self.make(event_type, data, at_ms=at_ms, id=id))


SESSION_TAPE_DEPRECATED = (
    "calltape.SessionTape is deprecated and will be removed: a live call's writer is calltape.CallSession "
    "(calltape.connect(...).start_call); a recorder's low-level writer handle comes from recorder.session(...)"
)
"""What the old public name ``SessionTape`` warns (its class is private now)."""


def __getattr__(name: str) -> Any:
    """``SessionTape``, the class's old public name: still there, with a ``DeprecationWarning``."""
    if name == "SessionTape":
        warnings.warn(SESSION_TAPE_DEPRECATED, DeprecationWarning, stacklevel=2)
        return _SessionTape
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
