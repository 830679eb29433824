"""The `eventsourcing` side of the comparison: one aggregate per call, one domain event per calltape
event, saved through an ``Application`` on its PostgreSQL persistence (psycopg 3, its own schema in
the same scratch database). This is the library used the way its documentation shows; nothing in
it is replaced or tuned except the pool size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from bench.workload import Step


class Call(Aggregate):
    """One voice call. The fold is a counter: the comparison is about persistence."""

    @event("Started")
    def __init__(self, session: str, agent: str, data: dict[str, Any]) -> None:
        self.session = session
        self.agent = agent
        self.count = 1

    @event("Recorded")
    def record(self, event_id: str, kind: str, at_ms: int, agent: str | None, data: dict[str, Any]) -> None:
        self.count += 1


class CallTapeApp(Application[UUID]):
    """The application that holds the calls (table ``es_bench.calltapeapp_events``)."""

    is_snapshotting_enabled = False


def open_app(env: dict[str, str]) -> CallTapeApp:
    return CallTapeApp(env=env)


def start_call(session: str, step: Step) -> Call:
    kind, data = step
    assert kind == "session.started"
    return Call(session=session, agent=data["agent"], data=data)


def record(call: Call, step: Step, event_id: str, at_ms: int) -> None:
    kind, data = step
    call.record(event_id=event_id, kind=kind, at_ms=at_ms, agent=None, data=data)


def save(app: CallTapeApp, calls: Sequence[Call]) -> None:
    """One transaction for every pending event of these calls (the library's own batching)."""
    app.save(*calls)
