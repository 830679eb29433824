"""Redaction after the fact: rewriting a stored session in place, with a record that it happened.

The log is append-only except here. A session recorded before redaction was configured (or with fewer
kinds) is read, passed through the rules in log order (so digits split across chunks are found, as on
write), and the changed ``data`` is written back in one transaction that also drops the session's
snapshots (they hold the old text; they are rebuilt on next use). Then a ``session.redacted`` event
records the kinds and how many spans were replaced, never the values.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from calltape.errors import SessionNotFound
from calltape.events import make_event
from calltape.eventstore.store import EventStore
from calltape.redaction import Redactor


@dataclass(frozen=True, slots=True)
class RedactionReport:
    """What one after-the-fact redaction changed."""

    session: str
    events: int
    """Events whose data was rewritten."""
    spans: dict[str, int]
    """Spans replaced, by label."""


async def redact_session(store: EventStore, session: str, redactor: Redactor) -> RedactionReport:
    """Rewrites ``session`` in place under ``redactor``; records ``session.redacted`` when anything changed."""
    if await store.session_info(session) is None:
        raise SessionNotFound(session)
    events = await store.read(session)
    counts: Counter[str] = Counter()
    redacted = redactor.events(events, counts)
    changes = [
        (old.seq, new.data)
        for old, new in zip(events, redacted, strict=True)
        if new.data != old.data and old.seq is not None
    ]
    if changes:
        await store.rewrite_data(session, changes)
        marker = make_event(
            session, "session.redacted", {"kinds": list(redactor.labels), "spans": sum(counts.values())}
        )
        marker.redacted = True
        await store.append([marker])
    return RedactionReport(session, len(changes), dict(counts))
