"""The append rules, in one place for both backends.

A backend locks the batch's session rows, hands them here with the stored duplicates it knows of, and
writes what the plan says. Everything that decides (idempotency, optimistic concurrency, epoch
fencing, seq assignment, the session summary) is plain Python over plain values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from calltape.errors import ConcurrencyConflict, FencedWrite, InvalidEvent
from calltape.events import Event, ensure_checked


@dataclass(slots=True)
class SessionInfo:
    """One session's summary, kept current by the append transaction (table ``ct_sessions``)."""

    session: str
    agent: str | None = None
    tenant: str | None = None
    modality: str | None = None
    framework: str | None = None
    status: str = "active"
    last_seq: int = 0
    epoch: int = 1
    first_at_ms: int | None = None
    last_at_ms: int | None = None
    started: bool = False

    def copy(self) -> SessionInfo:
        """A copy the plan may advance (``dataclasses.replace`` costs several times as much, once per
        session of every batch)."""
        return SessionInfo(
            self.session,
            self.agent,
            self.tenant,
            self.modality,
            self.framework,
            self.status,
            self.last_seq,
            self.epoch,
            self.first_at_ms,
            self.last_at_ms,
            self.started,
        )


@dataclass(slots=True)
class AppendPlan:
    """What one append decided, before any write: the stored results, the rows to insert, the summaries."""

    results: list[Event]
    """One stored event per input event, in input order (a duplicate maps to the stored one)."""
    inserts: list[Event]
    rows: dict[str, SessionInfo]
    """The summaries of the sessions that received new events."""


def plan_append(
    events: Sequence[Event],
    rows: Mapping[str, SessionInfo],
    stored: Mapping[tuple[str, str], Event],
    expected_seq: int | None = None,
    unmarked: dict[str, int] | None = None,
    *,
    owned: bool = False,
) -> AppendPlan:
    """Decides what an append writes; raises before anything is written.

    ``unmarked`` fences events that carry no epoch (an import's lines): each is judged as holding the
    epoch its own write last established for its session (1, raised by every ``session.resumed`` the
    write carries, stored or new), and is refused once the session's epoch is past that. The dict is
    updated as the write goes, so one import keeps it across batches. ``None`` leaves them unfenced.

    ``owned``: the events belong to the append (an import's freshly parsed lines), so a new event gets
    its ``seq`` and agent in place instead of as a copy.
    """
    for event in events:
        if not event.checked:
            ensure_checked(event)  # the store never writes an event that did not pass the boundary
    if expected_seq is not None:
        sessions = {e.session for e in events}
        if len(sessions) > 1:
            raise InvalidEvent("expected_seq needs a batch of one session")
        if any((e.session, e.id) not in stored for e in events):
            # Checked before any rule: a writer that lost the race must hear "conflict", not a rule
            # failure caused by the events that beat it.
            (session,) = sessions
            actual = rows[session].last_seq
            if actual != expected_seq:
                raise ConcurrencyConflict(session, expected_seq, actual)
    changed: dict[str, SessionInfo] = {}
    admitted: dict[tuple[str, str], Event] = {}
    results: list[Event] = []
    inserts: list[Event] = []
    for event in events:
        key = (event.session, event.id)
        known = stored.get(key) or admitted.get(key)
        if known is not None:  # a duplicate: the stored (or earlier) event stands
            results.append(known)
            if unmarked is not None and event.type == "session.resumed":
                _raise_implied(unmarked, known)
            continue
        row = changed.get(event.session)
        if row is None:
            row = changed[event.session] = rows[event.session].copy()
        implied = unmarked.get(event.session, 1) if unmarked is not None else None
        new = _admit(event, row, implied, owned)
        if unmarked is not None and event.type == "session.resumed":
            _raise_implied(unmarked, new)
        admitted[key] = new
        results.append(new)
        inserts.append(new)
    return AppendPlan(results, inserts, {s: r for s, r in changed.items() if r.last_seq != rows[s].last_seq})


def _raise_implied(unmarked: dict[str, int], resumed: Event) -> None:
    """A write that carries a session's ``session.resumed`` holds that session's new epoch from there on."""
    epoch = resumed.data.get("epoch")
    if isinstance(epoch, int):
        unmarked[resumed.session] = max(unmarked.get(resumed.session, 1), epoch)


_RULED = frozenset({"session.started", "session.resumed", "agent.handoff", "session.ended", "session.dropped"})
"""The types that change a session's summary beyond its seq and times."""


def _admit(event: Event, row: SessionInfo, implied: int | None = None, owned: bool = False) -> Event:
    """Checks one new event against its session and advances the session summary.

    ``implied`` is the epoch an event without one is judged by (``None``: such an event is not fenced);
    ``owned``: the event itself gets its seq and agent (see :func:`plan_append`).
    """
    held = event.epoch if event.epoch is not None else implied
    if held is not None and held < row.epoch:
        raise FencedWrite(row.session, held, row.epoch)
    data = event.data
    agent = event.agent if event.agent is not None else row.agent
    kind = event.type
    if kind not in _RULED:
        pass
    elif kind == "session.started":
        if row.started:
            raise InvalidEvent(f"session '{row.session}' has already started")
        row.started = True
        row.agent = agent = event.agent or data["agent"]
        row.tenant = data.get("tenant")
        row.modality = data.get("modality", "voice")
        row.framework = data.get("framework")
    elif kind == "session.resumed":
        new_epoch = int(data["epoch"])
        if new_epoch <= row.epoch:
            raise FencedWrite(row.session, new_epoch, row.epoch)
        if new_epoch != row.epoch + 1:
            raise InvalidEvent(
                f"session.resumed must raise the epoch of '{row.session}' by one (to {row.epoch + 1}, not {new_epoch})"
            )
        row.epoch = new_epoch
        row.agent = agent = event.agent or data["agent"]
        row.status = "active"
    elif kind == "agent.handoff":
        row.agent = data["to"]
    elif kind == "session.ended":
        row.status = "ended"
    elif kind == "session.dropped":
        row.status = "dropped"
    row.last_seq += 1
    if row.first_at_ms is None:
        row.first_at_ms = event.at_ms
    if row.last_at_ms is None or event.at_ms > row.last_at_ms:
        row.last_at_ms = event.at_ms
    if owned:
        event.agent = agent
        event.seq = row.last_seq
        return event
    # positional: half the cost of keywords, once per event of every batch (fields in Event's order)
    return Event(kind, data, event.session, event.id, event.at_ms, agent, event.epoch, row.last_seq, True)
