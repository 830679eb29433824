"""Erasure and retention: a session removed for good, and every session older than a duration.

Erasing is one transaction per session in the store (:meth:`EventStore.erase`): events, snapshots and
the summary go, and a tombstone (id, time, event count, no content) stays, so a replayed spill file, a
late webhook or a re-import of an old export cannot bring the session back. Pruning erases the sessions
whose last event is older than a cutoff one by one, so no transaction ever holds more than one
session's rows and live appends to other sessions are never held up for long. On SQLite, where every
writer waits on the one database lock, a transaction holds at most :data:`STEP` events however long the
call (:meth:`EventStore.erase_in_steps`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from calltape.eventstore.store import EventStore

STEP = 2000
"""Events per transaction when a prune erases on SQLite (the newest first; the last step goes with the
summary and the tombstone in one transaction). Steps of 500 with rests between them measured no better
under load (bench/README.md)."""

PruneStatus = str
"""``ended``, ``dropped`` or ``any``."""


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What a prune removed (or, in a dry run, would remove)."""

    sessions: int
    events: int
    dry_run: bool


async def prune(
    store: EventStore,
    *,
    before_ms: int,
    status: PruneStatus = "any",
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> PruneReport:
    """Erases every session whose last event is before ``before_ms`` (and, unless ``any``, whose status
    is ``status``); ``progress(done, total)`` after each session."""
    found = await store.sessions(
        until_ms=before_ms, status=None if status == "any" else status, order="session", descending=False
    )
    found = [info for info in found if info.last_at_ms is not None and info.last_at_ms < before_ms]
    if dry_run:
        return PruneReport(len(found), sum(info.last_seq for info in found), True)
    sessions = events = 0
    for done, info in enumerate(found, 1):
        # before_ms again at erase time: a call resumed since it was listed is no longer old, and kept
        erased = await store.erase_in_steps(info.session, STEP, before_ms=before_ms)
        if erased is not None:
            sessions, events = sessions + 1, events + erased
        if progress is not None:
            progress(done, len(found))
    return PruneReport(sessions, events, False)
