"""What the runtime relies on from the layers below (eventstore / projections).

A test marked ``xfail(strict=True)`` names a bug still open there: it turns into a failure (XPASS)
the moment the bug is fixed, and the mark must go.
"""

from __future__ import annotations

import pytest

from calltape.errors import ConcurrencyConflict
from calltape.events import make_event
from calltape.eventstore import EventStore
from calltape.projections import fold_events, render


@pytest.mark.parametrize("fmt", ["native", "openai", "anthropic", "realtime"])
async def test_a_replay_shows_the_context_the_live_agent_saw(
    store: EventStore, session_id: str, request: pytest.FixtureRequest, fmt: str
) -> None:
    """Regression: PostgreSQL stores ``data`` as jsonb, which reorders object keys (shorter keys first);
    arguments and outputs are rendered with sorted keys, so a resume on PostgreSQL hands the new agent
    the very strings the live agent had."""
    events = [
        make_event(session_id, "session.started", {"agent": "triage"}),
        make_event(session_id, "agent.reply.started", {"reply": "r1"}),
        make_event(
            session_id,
            "tool.call",
            {"reply": "r1", "call": "t1", "name": "book", "arguments": {"people": 2, "at": "8"}},
        ),
        make_event(session_id, "agent.reply.done", {"reply": "r1"}),
        make_event(session_id, "tool.result", {"call": "t1", "output": {"status": "ok", "id": "B-1"}}),
    ]
    stored = await store.append(events)
    live = fold_events(stored).native()  # what the live agent folded (the events as emitted)
    replayed = fold_events(await store.read(session_id)).native()
    assert render(replayed, fmt) == render(live, fmt)


async def test_a_stale_expected_seq_is_a_concurrency_conflict(store: EventStore, session_id: str) -> None:
    (started,) = await store.append([make_event(session_id, "session.started", {"agent": "triage"})])
    assert started.seq == 1
    winner = make_event(session_id, "session.resumed", {"agent": "a", "epoch": 2, "from_seq": 1}, epoch=2)
    await store.append([winner], expected_seq=1)
    loser = make_event(session_id, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 1}, epoch=2)
    with pytest.raises(ConcurrencyConflict):
        await store.append([loser], expected_seq=1)
