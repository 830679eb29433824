"""The resume plan's context is taken at the resume and rendered when read; its JSON copies the
settled items as the snapshot keeps them (the shared ``store`` fixture: SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from calltape.events import make_event
from calltape.eventstore import EventStore
from calltape.projections import build_context, render, snapshot_now
from calltape.projections.snapshot import frozen_native_chunks
from calltape.runtime import ToolSpec, resume


def turn(session: str, i: int) -> list[Any]:
    rid, call = f"r{i}", f"c{i}"
    steps: list[tuple[str, dict[str, Any]]] = [
        ("user.transcript", {"text": f"question {i}", "final": True}),
        ("agent.reply.started", {"reply": rid}),
        ("agent.text", {"reply": rid, "text": f"answer {i}"}),
        ("tool.call", {"call": call, "name": "lookup", "arguments": {"i": i}, "reply": rid}),
        ("tool.result", {"call": call, "output": {"i": i}}),
        ("agent.reply.done", {"reply": rid}),
        ("agent.speech.started", {"reply": rid}),
        ("agent.speech.ended", {"reply": rid, "interrupted": False}),
    ]
    return [make_event(session, t, d, agent="a", epoch=1) for t, d in steps]


@pytest.mark.parametrize("format", ["native", "openai"])
async def test_the_plan_context_is_the_log_after_the_resume_and_its_json_the_same(
    store: EventStore, format: str
) -> None:
    session = f"plan-{format}"
    events = [make_event(session, "session.started", {"agent": "a", "modality": "voice"}, agent="a", epoch=1)]
    for i in range(30):
        events += turn(session, i)
    await store.append(events)
    assert await snapshot_now(store, session) == len(events)  # the settled turns are frozen from here on
    drop = [
        ("agent.reply.started", {"reply": "open"}),
        ("agent.text", {"reply": "open", "text": "Booking"}),
        ("tool.call", {"call": "book", "name": "book", "arguments": {}, "reply": "open"}),
        ("tool.started", {"call": "book"}),
        ("session.dropped", {"reason": "transport lost"}),
    ]
    await store.append([make_event(session, t, d, agent="a", epoch=1) for t, d in drop])

    plan = await resume(store, session, "b", tools={"book": ToolSpec()}, format=format)
    assert plan.fold is not None and frozen_native_chunks(plan.fold)  # the plan has a frozen part
    encoded = plan.to_json_bytes()  # before anything rendered the context: the frozen bytes copied
    after = (await build_context(store, session, snapshots=None)).native()
    expected = after if format == "native" else render(after, format)
    assert orjson.loads(encoded) == orjson.loads(orjson.dumps(plan.to_json()))
    assert plan.context == expected
    assert plan.context is plan.context  # rendered once
    assert orjson.loads(plan.to_json_bytes())["context"] == orjson.loads(orjson.dumps(expected))
    # what the plan holds does not move with the fold it was made from
    plan.fold.apply(make_event(session, "user.text", {"text": "later"}, agent="b", epoch=2))
    assert plan.context == expected
