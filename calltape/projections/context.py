"""The context of a stored session at an instant: newest usable snapshot, plus the tail.

The only module of :mod:`calltape.projections` that does I/O. It is written against the store's
read/snapshot methods (a :class:`typing.Protocol`), so any store -- SQLite, PostgreSQL, a test fake
-- works.

Snapshot policy: a snapshot is only ever taken at a clean point (nothing in flight, so nothing a
later rule change could settle differently is frozen half-way) and records ``FOLD_VERSION``; a
snapshot of another version (v0.1 wrote version 1) is ignored and the session is folded from seq 1.
While :func:`build_context` folds a tail, it captures the state at the first clean point that is at
least ``every`` events past the previous snapshot, then counts again from there; after the fold it
saves the latest one. A capture encodes only what settled since the previous one (see
:mod:`calltape.projections.snapshot`), and only the saved one is turned into bytes. Saving is best
effort: a failing save never fails the read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from calltape.errors import CalltapeError, SessionNotFound
from calltape.events import Event
from calltape.projections import segments
from calltape.projections.fold import FOLD_VERSION, ContextFold
from calltape.projections.instant import AtOffset, AtSeq, AtTime, Instant, parse_instant
from calltape.projections.snapshot import Captured


class _SessionInfo(Protocol):
    @property
    def last_seq(self) -> int: ...

    @property
    def first_at_ms(self) -> int | None: ...


class ContextStore(Protocol):
    """What :func:`build_context` needs from ``calltape.eventstore``."""

    async def read(self, session: str, *, after_seq: int = 0, to_seq: int | None = None) -> list[Event]:
        """A session's events with ``after_seq < seq <= to_seq``."""

    async def seq_at_time(self, session: str, at_ms: int) -> int:
        """The longest prefix of the session whose events happened at or before ``at_ms``."""

    async def session_info(self, session: str) -> Any:
        """The session's summary, or None when it does not exist."""

    async def save_snapshot(self, session: str, seq: int, version: int, state: bytes) -> None:
        """Keeps a fold snapshot so later rebuilds start from it."""

    async def load_snapshot(
        self, session: str, version: int, *, max_seq: int | None = None
    ) -> tuple[int, bytes] | None:
        """The newest snapshot of ``version`` at or before ``max_seq``, as ``(seq, state)``."""


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    """Save a snapshot at a clean point once ``every`` events were folded past the previous one."""

    every: int = 1000


DEFAULT_POLICY = SnapshotPolicy()


async def resolve_seq(store: ContextStore, session: str, at: Instant | int | str | None) -> tuple[int, int]:
    """(N, last_seq) for ``at``; a seq past the end is the end. Unknown session: SessionNotFound."""
    info = await store.session_info(session)
    if info is None:
        raise SessionNotFound(session)
    last: int = info.last_seq
    if at is None:
        return last, last
    instant = at if isinstance(at, (AtSeq, AtTime, AtOffset)) else parse_instant(at)
    if isinstance(instant, AtSeq):
        return min(instant.seq, last), last
    if isinstance(instant, AtTime):
        at_ms = instant.at_ms
    else:
        first = info.first_at_ms
        if first is None:
            return 0, last
        at_ms = first + round(instant.seconds * 1000)
    return min(await store.seq_at_time(session, at_ms), last), last


async def build_context(
    store: ContextStore,
    session: str,
    at: Instant | int | str | None = None,
    *,
    snapshots: SnapshotPolicy | None = DEFAULT_POLICY,
) -> ContextFold:
    """The fold of ``session`` at ``at`` (default: its latest event).

    ``at``: an :data:`Instant`, a seq, or an ``--at`` string. ``snapshots=None`` reads only.
    The returned fold only knows the ids of the tail it read (not those inside the snapshot): keep
    feeding it events from the store or the recorder, which are unique by id.
    """
    n, _ = await resolve_seq(store, session, at)
    fold: ContextFold | None = None
    base = 0
    if n > 0:
        loaded = await store.load_snapshot(session, FOLD_VERSION, max_seq=n)
        if loaded is not None:
            try:
                fold = await segments.restore(store, session, loaded[1])
            except CalltapeError:
                fold = None
            else:
                if fold.seq != loaded[0] or fold.seq > n or fold.session != session:
                    fold = None
        if fold is not None:
            base = fold.seq
    if fold is None:
        fold = ContextFold(session)
    if n <= base:
        return fold
    tail = await store.read(session, after_seq=base, to_seq=n)
    if snapshots is None:
        fold.apply_many(tail)
        return fold
    pending = _fold_with_snapshots(fold, tail, base, max(1, snapshots.every))
    if pending is not None:
        try:
            await segments.save(store, session, pending)
        except CalltapeError:
            pass
    return fold


def _fold_with_snapshots(fold: ContextFold, tail: list[Event], base: int, every: int) -> Captured | None:
    """Folds ``tail``, capturing the state at clean points ``every`` events apart."""
    pending: Captured | None = None
    threshold = base + every
    start = 0
    total = len(tail)
    while start < total:
        # Fold in one fast batch up to the threshold, then event by event to the next clean point.
        cut = start
        while cut < total and (tail[cut].seq or 0) < threshold:
            cut += 1
        if cut > start:
            fold.apply_many(tail[start:cut])
            start = cut
        while start < total:
            fold.apply(tail[start])
            start += 1
            if fold.clean and fold.seq >= threshold:
                pending = fold.capture()
                threshold = fold.seq + every
                break
    return pending


async def snapshot_now(store: ContextStore, session: str, fold: ContextFold | None = None) -> int:
    """Saves a snapshot at the latest clean point now; returns its seq (0: nothing saved, as for a live
    fold held across a redaction or an erasure of the session).

    A clean live ``fold`` is saved as is, but only once the store holds every event it folded
    (a snapshot must never run ahead of the log); otherwise the session is folded from the store
    up to the last clean seq.
    """
    info = await store.session_info(session)
    if info is None:
        raise SessionNotFound(session)
    last: int = info.last_seq
    live = fold if fold is not None and fold.session == session else None
    if live is not None and live.clean and 0 < live.seq <= last:
        target = live
    else:
        if live is None or live.last_clean_seq > last:
            latest = await build_context(store, session, snapshots=None)
            if latest.clean and latest.seq > 0:
                return latest.seq if await segments.save(store, session, latest.capture()) else 0
            seq = latest.last_clean_seq
        else:
            seq = live.last_clean_seq
        if not 0 < seq <= last:
            return 0
        target = await build_context(store, session, AtSeq(seq), snapshots=None)
        if not target.clean or target.seq != seq:
            return 0
    # refused (0): a live fold held across a redaction or an erasure holds what they removed
    return target.seq if await segments.save(store, session, target.capture()) else 0
