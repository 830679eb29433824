"""The steps of an append transaction, which each backend writes in its fastest SQL.

``store.append`` and the bulk import (``bulk.py``) run the same steps around the same rules
(:func:`~calltape.eventstore.append_plan.plan_append`): lock the batch's session rows, look up the
ids the sessions may already hold, insert what the plan admits, write the summaries back. Only the
SQL differs: PostgreSQL passes whole columns as arrays (``unnest``) and inserts by COPY, SQLite
runs one ``executemany``. A backend implements :class:`AppendWriter` once; both callers use it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from calltape.events import Event
from calltape.eventstore.append_plan import SessionInfo, plan_append

Key = tuple[str, str]
"""``(session, id)``: what makes an event a duplicate."""


class AppendWriter(ABC):
    """One connection inside a write transaction, speaking the append's SQL."""

    tenant: str | None = None
    """The store's tenant: the writer writes only that tenant's sessions (see :mod:`.tenancy`)."""
    everyone: bool = False
    """A writer for every tenant (the operator's): no tenant check."""

    @abstractmethod
    async def lock_sessions(self, sessions: Sequence[str]) -> dict[str, SessionInfo]:
        """Creates the missing session rows and returns all of them, locked until the transaction ends.

        ``sessions`` comes sorted, so two writers always lock in the same order (no deadlock)."""

    @abstractmethod
    async def stored(self, keys: Sequence[Key]) -> dict[Key, Event]:
        """The stored events among ``keys``."""

    @abstractmethod
    async def stored_keys(self, keys: Sequence[Key]) -> set[Key]:
        """Which of ``keys`` are stored (ids only, nothing decoded)."""

    @abstractmethod
    async def insert(self, events: Sequence[Event], rows: Mapping[str, SessionInfo]) -> None:
        """Writes planned events by the cheapest path; an id already stored makes it raise. Each row
        carries its session's tenant, from ``rows`` (the summaries as the plan leaves them)."""

    @abstractmethod
    async def update_sessions(self, rows: Sequence[SessionInfo]) -> None:
        """Writes session summaries back and wakes the feed's followers (after the commit)."""

    async def lookup(self, events: Sequence[Event], rows: dict[str, SessionInfo]) -> dict[Key, Event]:
        """The stored duplicates the batch may meet: only a session that has events can hold one."""
        keys = [(e.session, e.id) for e in events if rows[e.session].last_seq > 0]
        return await self.stored(keys) if keys else {}

    async def append(self, events: Sequence[Event], expected_seq: int | None = None) -> list[Event]:
        """The whole append in this transaction: lock, look up, plan, write; returns the stored events."""
        rows = await self.lock_sessions(sorted({e.session for e in events}))
        plan = plan_append(events, rows, await self.lookup(events, rows), expected_seq)
        if plan.inserts:
            await self.insert(plan.inserts, plan.rows)
            await self.update_sessions(list(plan.rows.values()))
        return plan.results
