"""The event store interface shared by the PostgreSQL, Citus and SQLite backends, split by role:
writing (:class:`EventWriter`), reading (:class:`EventReader`) and administration
(:class:`StoreAdmin`); :class:`EventStore` is all three with a lifecycle. Each role is small enough
to read at once, and a caller that needs one role says so in its signature."""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from calltape._backoff import Backoff
from calltape.errors import InvalidEvent, StoreUnavailable
from calltape.events import Event
from calltape.eventstore.append_plan import SessionInfo
from calltape.redaction import Redactor

log = logging.getLogger("calltape.eventstore")


class FeedPosition(NamedTuple):
    """A place in the global feed: ``(txid, pos)``; ``txid`` is always 0 on SQLite."""

    txid: int
    pos: int

    def __str__(self) -> str:
        return f"{self.txid}:{self.pos}"

    @classmethod
    def parse(cls, text: str) -> FeedPosition:
        """Reads a position as printed (``TXID:POS``, or ``POS`` alone)."""
        txid, _, pos = text.strip().rpartition(":")
        try:
            return cls(int(txid or 0), int(pos))
        except ValueError:
            raise ValueError(f"'{text}' is not a feed position (expected TXID:POS or POS)") from None


START = FeedPosition(0, 0)


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What stays of an erased session: its id, when, and how many events it had. Never content."""

    session: str
    erased_at_ms: int
    events: int


class _ErasuresHere:
    """How many erasures and rewrites (redaction) this process has committed, through any store: a
    subscription that sees the count move reads again the page it holds (see :meth:`EventStore.subscribe`)."""

    count = 0


def note_erasure() -> None:
    """Records that this process has just committed an erasure or a rewrite (called by the stores'
    ``erase`` and ``rewrite_data``)."""
    _ErasuresHere.count += 1


class ChangeWaiter(ABC):
    """Sleeps until the log may have changed (a wake-up only: readers always re-read the feed), and
    watches for erasures committed by other processes."""

    @abstractmethod
    async def wait(self, seconds: float) -> None:
        """Returns after at most ``seconds``, earlier when the log may have changed."""

    async def ready(self) -> None:
        """Starts watching for erasures; a subscription calls it before it reads its first page."""
        return None

    def erasures(self) -> int:
        """A number that changes whenever another process may have erased a session since the last
        call (or while the waiter could not watch). Cheap: no query, called before every event."""
        return 0

    async def close(self) -> None:
        """Releases what the waiter holds (a LISTEN connection, say)."""
        return None


class SleepWaiter(ChangeWaiter):
    """A waiter that only sleeps: polling, for stores without change notifications."""

    async def wait(self, seconds: float) -> None:
        """Sleeps ``seconds``."""
        await asyncio.sleep(seconds)


def checked_batch(events: object) -> Sequence[Event]:
    """``events`` if it is a list of :class:`Event`; else one sentence naming what it got (its type and
    position, never its content), where a dict would otherwise fail deep in the append."""
    if isinstance(events, Event):
        raise InvalidEvent("store.append takes a list of events and got one Event: pass [event]")
    if isinstance(events, str | bytes | Mapping) or not isinstance(events, Sequence):
        raise InvalidEvent(f"store.append takes a list of events and got a {type(events).__name__}")
    for i, event in enumerate(events):
        if not isinstance(event, Event):
            raise InvalidEvent(
                f"store.append takes events and item {i} is a {type(event).__name__}, not an Event: "
                "make it with calltape.make_event(...) or calltape.parse_event(...)"
            )
    return events


class _AppendNotAhead(Exception):
    """:meth:`EventStore.append_ahead` wrote nothing: append the batch after the one in flight."""


class EventWriter(ABC):
    """The writing role of a store: what a writer (the recorder, the bulk import) needs. Appends and
    fold snapshots; nothing is ever changed in place here."""

    @abstractmethod
    async def append(self, events: Sequence[Event], *, expected_seq: int | None = None) -> list[Event]:
        """Appends atomically; returns the stored event for each input event, in input order.

        Events whose id the session already has are not written again: the stored one is returned.
        ``expected_seq`` (single-session batches) raises ``ConcurrencyConflict`` unless the session's
        last seq is exactly that.
        """

    @abstractmethod
    async def save_snapshot(self, session: str, seq: int, version: int, state: bytes) -> None:
        """Stores a fold snapshot of a session at ``seq`` for fold ``version`` (saving it again is harmless)."""


class EventReader(ABC):
    """The reading role of a store: what readers (``show``, ``check``, resume, the server's live
    feed) need. One session's log and summary, the list of sessions, the global feed and its
    subscription, fold snapshots."""

    async def read(
        self,
        session: str,
        *,
        after_seq: int = 0,
        to_seq: int | None = None,
        limit: int | None = None,
        types: Collection[str] | None = None,
    ) -> list[Event]:
        """A session's events with ``after_seq < seq <= to_seq``, in seq order.

        ``types``: only events of these types, filtered by the database (``limit`` counts those): a
        caller that needs a few of a long call's events (the effect API's ``tool.effect``) does not
        fetch and decode the call. An empty collection reads nothing."""
        if types is not None and not types:
            return []
        return await self._read_events(session, after_seq, to_seq, limit, types)

    @abstractmethod
    async def _read_events(
        self, session: str, after_seq: int, to_seq: int | None, limit: int | None, types: Collection[str] | None
    ) -> list[Event]:
        """:meth:`read` for a backend (``types`` is None or not empty), so the signature is written once,
        above."""

    @abstractmethod
    async def seq_at_time(self, session: str, at_ms: int) -> int:
        """The longest prefix of the session whose events all happened at or before ``at_ms``."""

    @abstractmethod
    async def session_info(self, session: str) -> SessionInfo | None:
        """The session's summary (agent, tenant, status, event count, epoch, times), or None."""

    async def sessions(
        self,
        *,
        agent: str | None = None,
        tenant: str | None = None,
        status: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        order: str = "last_at",
        descending: bool = True,
        limit: int | None = None,
    ) -> list[SessionInfo]:
        """Sessions with their summaries; ``order`` is one of last_at, first_at, session, events."""
        given = {"agent": agent, "tenant": tenant, "status": status, "since_ms": since_ms, "until_ms": until_ms}
        filters = {k: v for k, v in given.items() if v is not None}
        return await self._list_sessions(filters, order, descending, limit)

    @abstractmethod
    async def _list_sessions(
        self, filters: dict[str, Any], order: str, descending: bool, limit: int | None
    ) -> list[SessionInfo]:
        """:meth:`sessions` for a backend: ``filters`` holds only the filters given (agent, tenant,
        status, since_ms, until_ms), so the signature is written once, above."""

    @abstractmethod
    async def feed(
        self, after: FeedPosition | None = None, *, limit: int = 1000, session: str | None = None
    ) -> list[tuple[FeedPosition, Event]]:
        """Committed events after ``after`` across sessions, in an order that never changes behind a
        reader: an event that commits later always lands after every position already returned."""

    @abstractmethod
    async def head(self) -> FeedPosition:
        """The position after which new events will appear (for following from now)."""

    @abstractmethod
    def change_waiter(self) -> ChangeWaiter:
        """A waiter that wakes subscribers when the log may have changed."""

    async def subscribe(
        self,
        after: FeedPosition | None = None,
        *,
        session: str | None = None,
        poll_interval: float = 0.5,
        batch: int = 500,
    ) -> AsyncIterator[tuple[FeedPosition, Event]]:
        """Follows the feed forever from ``after``; survives lost connections without gaps or repeats.

        Events are read a page at a time, but a page is not handed out as it was read once stored events
        changed under it: an erased session's events are never handed out once the erasure is known, and
        a redacted session's events are handed out as rewritten. Before each event the subscription
        compares a count of erasures and rewrites (this process's, and the waiter's view of other
        processes': no query); when it moved, it reads the rest of the page again. When it moved already
        at a page's first event (the change committed while the page was read, or a waiter that cannot
        watch and moves every time), it reads that one event again and hands it out: that read comes
        after the change.
        """
        position = after or START
        waiter = self.change_waiter()
        backoff = Backoff(0.05, 2.0)
        limit = batch
        first_is_fresh = False  # the page's first event was read after the last change seen

        def changes() -> tuple[int, int]:
            return _ErasuresHere.count, waiter.erasures()

        try:
            await waiter.ready()
            while True:
                checked = changes()  # before the read: an erasure or a rewrite after it moves the count
                try:
                    rows = await self.feed(position, limit=limit, session=session)
                except StoreUnavailable as exc:
                    delay = backoff.next()
                    log.warning("subscription: %s; retrying in %.2fs", exc, delay)
                    await asyncio.sleep(delay)
                    continue
                backoff.reset()
                for i, (at, event) in enumerate(rows):
                    if (i or not first_is_fresh) and changes() != checked:
                        limit, first_is_fresh = (1, True) if i == 0 else (batch, False)
                        break  # read the rest again, from the last event handed out
                    position = at
                    yield at, event
                else:
                    short = len(rows) < limit
                    limit, first_is_fresh = min(batch, 2 * limit), False
                    if short:
                        await waiter.wait(poll_interval)
        finally:
            await waiter.close()

    @abstractmethod
    async def load_snapshot(
        self, session: str, version: int, *, max_seq: int | None = None
    ) -> tuple[int, bytes] | None:
        """The newest snapshot of this fold version at or before ``max_seq``."""


class StoreAdmin(ABC):
    """The administration role of a store: what an operator's tools (``erase``, retention,
    ``redact``) need. The only ways stored events change or go."""

    @abstractmethod
    async def erase(self, session: str) -> int:
        """Removes the session's events, snapshots and summary in one transaction and leaves a
        :class:`Tombstone`; returns how many events went (0 when it was already erased).
        Raises :class:`~calltape.errors.SessionNotFound` for a session that never existed."""

    @abstractmethod
    async def erase_in_steps(self, session: str, step: int, *, before_ms: int | None = None) -> int | None:
        """Erases like :meth:`erase`, for retention: a store whose writers all wait on one lock (SQLite)
        first deletes the session's newest events ``step`` at a time, each in a transaction of its own,
        so live appends get the lock between them, and erases the last ``step`` with the summary in one
        transaction. Elsewhere it is :meth:`erase`.

        With ``before_ms`` the decision is retention's: a session whose last event is no longer before
        it when the first deleting transaction runs (a call resumed since it was listed) is kept, and
        ``None`` is returned. Once that transaction has deleted anything the erasure goes through."""

    @abstractmethod
    async def tombstone(self, session: str) -> Tombstone | None:
        """The tombstone of an erased session, or ``None``."""

    @abstractmethod
    async def rewrite_data(self, session: str, changes: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """Replaces the ``data`` of stored events in place (``(seq, data)`` pairs) and drops the session's
        snapshots, in one transaction. Only redaction uses it: the log is otherwise append-only."""


class EventStore(EventWriter, EventReader, StoreAdmin):
    """An append-only, per-session event log with a global feed: the three roles
    (:class:`EventWriter`, :class:`EventReader`, :class:`StoreAdmin`) and the store's lifecycle.

    A backend subclasses it and passes :mod:`calltape.testing.store_conformance`; code that needs
    one role only can take that role's type."""

    dialect: str
    url: str
    redactor: Redactor | None = None
    """Redaction on write: every appended event passes these rules before it reaches the database."""
    tenant: str | None = None
    """The tenant the store was opened for: it sees and writes only that tenant's sessions (None: only the
    sessions without a tenant, unless :attr:`all_tenants`; see :mod:`.tenancy`)."""
    all_tenants: bool = False
    """Opened for every tenant (``tenant="*"``, the operator's): sees and writes every session."""
    durable_lanes: int = 0
    """How many appends of other sessions may commit on this store beside the recorder's batch in flight,
    each on a connection of its own: the recorder writes that many sessions' durable appends in lanes
    of their own instead of behind the batch. SQLite's writers take turns on one file lock: none."""
    pipelines: bool = False
    """Whether :meth:`append_ahead` may write: the recorder then sends its next batch while one is in flight."""
    write_groups: int = 1
    """How many transactions one append of many sessions commits side by side, each over its own share of
    the events (Citus: one per worker node holding shards). A recorder batch holds ``max_batch`` events
    for each, so that every transaction carries about what one PostgreSQL's would."""

    async def append_ahead(self, events: Sequence[Event]) -> list[Event]:
        """:meth:`append`, sent while another append of this store is in flight and decided against the
        session rows that one will leave; it commits after it, and only if it committed what it planned.
        Raises :class:`_AppendNotAhead`, having written nothing, when it cannot decide so: the caller then
        appends the batch once the one in flight is done. Only a store that :attr:`pipelines` does."""
        raise _AppendNotAhead

    def _redact(self, events: Sequence[Event]) -> Sequence[Event]:
        """The batch with the store's redaction applied, unless a writer (the recorder) already did."""
        if self.redactor is None or all(e.redacted for e in events):
            return events
        return self.redactor.events(events)

    # -- lifecycle ---------------------------------------------------------------------------

    @abstractmethod
    async def close(self) -> None:
        """Closes the store's connections."""

    async def __aenter__(self) -> EventStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
