"""``GET /metrics`` counts what the store's calls do from the server's start: events by type, sessions,
tool outcomes, effects, check findings by rule, and the recorder's queue: scraped from the app and parsed
back with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from calltape.checks import RULES
from calltape.events import Event
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.server import create_app
from calltape.server.metrics import CallCounters, ServerMetrics
from tests.runtime.latency_support import TIMELINE_A, TIMELINE_B, events

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# A call that ends with a tool call never answered (orphan-call) and a call of an interrupted reply
# that started anyway (late-start).
TIMELINE_C: list[tuple[int, str, dict[str, Any]]] = [
    (0, "session.started", {"agent": "booker"}),
    (50, "agent.reply.started", {"reply": "r0"}),
    (60, "tool.call", {"reply": "r0", "call": "k1", "name": "lookup", "arguments": {}}),
    (70, "agent.reply.done", {"reply": "r0"}),
    (100, "agent.reply.started", {"reply": "r1"}),
    (300, "tool.call", {"reply": "r1", "call": "k2", "name": "charge_card", "arguments": {"card": "4242"}}),
    (400, "interruption", {"reply": "r1", "cause": "user_speech"}),
    (500, "tool.started", {"call": "k2"}),
    (600, "tool.result", {"call": "k2", "output": {"charged": "4242"}, "error": True}),
    (700, "x.note", {"anything": "a developer's own event"}),
    (800, "session.ended", {"reason": "hangup"}),
]


def parse(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def _scrape(client: httpx.AsyncClient, until: Any) -> tuple[str, Samples]:
    deadline = time.monotonic() + 20
    while True:
        text = (await client.get("/metrics")).text
        samples = parse(text)
        if until(samples) or time.monotonic() > deadline:
            return text, samples
        await asyncio.sleep(0.1)


async def test_the_counts_from_the_servers_start(store: EventStore) -> None:
    await store.append(events("before-start", TIMELINE_A))  # in the store already: not counted
    app = create_app(store)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://calltape") as client:
            _, first = await _scrape(client, lambda s: True)
            assert first[("calltape_sessions_started_total", ())] == 0
            assert first[("calltape_events_appended_total", (("type", "session.started"),))] == 0
            for rule in RULES:  # every rule's series exists from the start, at zero
                assert first[("calltape_check_findings_total", (("rule", rule),))] == 0
            await store.append(events("count-a", TIMELINE_A))
            await store.append(events("count-b", TIMELINE_B))
            await store.append(events("count-c", TIMELINE_C))
            text, s = await _scrape(client, lambda s: s.get(("calltape_checked_sessions_total", ()), 0) >= 2)
    assert s[("calltape_sessions_started_total", ())] == 3
    assert s[("calltape_sessions_ended_total", ())] == 2
    assert s[("calltape_sessions_dropped_total", ())] == 1
    assert s[("calltape_sessions_resumed_total", ())] == 1
    by_type = {labels[0][1]: v for (name, labels), v in s.items() if name == "calltape_events_appended_total"}
    assert by_type["interruption"] == 3 + 0 + 1
    assert by_type["tool.call"] == 2 + 1 + 2 and by_type["agent.reply.done"] == 1
    assert by_type["x"] == 1  # an extension's own name never becomes a label
    assert sum(by_type.values()) == len(TIMELINE_A) + len(TIMELINE_B) + len(TIMELINE_C)
    outcomes = {
        tuple(v for _, v in labels): value
        for (name, labels), value in s.items()
        if name == "calltape_tool_outcomes_total"
    }
    # a: book_table completed, lookup timed out; b: book_table unknown at the drop, then completed
    # after the resume (the result decides the call's output); c: charge_card error, lookup never settled
    assert outcomes == {
        ("completed", "book_table"): 2,
        ("timeout", "lookup"): 1,
        ("unknown", "book_table"): 1,
        ("error", "charge_card"): 1,
    }
    # the ended calls were checked: a talked over the user for 700 ms (talk-over), c left k1 without
    # an output (orphan-call) and started k2 after its reply's interruption (late-start)
    assert s[("calltape_checked_sessions_total", ())] == 2
    assert s[("calltape_sessions_with_findings_total", ())] == 2
    findings = {labels[0][1]: v for (name, labels), v in s.items() if name == "calltape_check_findings_total"}
    assert {rule: n for rule, n in findings.items() if n} == {"talk-over": 1, "orphan-call": 1, "late-start": 1}
    assert s[("calltape_check_skipped_sessions_total", ())] == 0
    # the latency histograms are still there beside the counts
    assert s[("calltape_tool_duration_seconds_count", (("tool", "book_table"),))] == 2
    # no session id and nothing said reaches the exposition
    for secret in ("count-a", "before-start", "4242", "table for two", "hangup", "x.note"):
        assert secret not in text
    labels = {k for (_, pairs) in s for k, _ in pairs}
    assert labels == {"le", "tool", "type", "outcome", "rule"}


def test_effects_are_counted_by_phase_from_the_data() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    counters = CallCounters(registry)

    def event(kind: str, data: dict[str, Any]) -> Event:
        return Event(type=kind, data=data, session="fx")

    counters(event("tool.call", {"call": "c1", "name": "charge_card", "arguments": {}}))
    counters(event("tool.effect", {"call": "c1", "name": "charge_card", "key": "order-7", "phase": "started"}))
    counters(event("tool.effect", {"call": "c1", "name": "charge_card", "key": "order-7", "phase": "done"}))
    counters(event("tool.effect", {"call": "c2", "key": "order-8", "phase": "exploded"}))  # unnamed, odd phase
    s = parse(generate_latest(registry).decode())
    assert s[("calltape_effects_total", (("phase", "started"), ("tool", "charge_card")))] == 1
    assert s[("calltape_effects_total", (("phase", "done"), ("tool", "charge_card")))] == 1
    assert s[("calltape_effects_total", (("phase", "other"), ("tool", "other")))] == 1
    assert s[("calltape_events_appended_total", (("type", "tool.effect"),))] == 3
    assert "order-7" not in generate_latest(registry).decode()


async def test_the_recorders_queue_depth_lag_and_commits(store: EventStore) -> None:
    recorder = Recorder(store)
    metrics = ServerMetrics(store, recorders=lambda: [recorder])
    tape = recorder.session("rec-1")
    tape.emit("session.started", {"agent": "a"})
    for i in range(9):
        tape.emit("user.text", {"text": f"line {i}"})
    await asyncio.sleep(0.05)
    waiting = parse(metrics.exposition().decode())
    assert waiting[("calltape_recorder_queue_depth", ())] == 10
    assert waiting[("calltape_recorder_commit_lag_seconds", ())] >= 0.05
    assert waiting[("calltape_recorder_committed_events_total", ())] == 0
    await recorder.start()
    await recorder.close()
    done = parse(metrics.exposition().decode())
    assert done[("calltape_recorder_queue_depth", ())] == 0
    assert done[("calltape_recorder_commit_lag_seconds", ())] == 0
    assert done[("calltape_recorder_committed_events_total", ())] == 10
    assert done[("calltape_recorder_batches_total", ())] >= 1
    assert done[("calltape_recorder_last_batch_lag_seconds", ())] >= 0.05
    assert done[("calltape_recorder_spilled_events_total", ())] == 0
    assert len(await store.read("rec-1")) == 10


async def test_a_server_without_a_recorder_reads_zero(store: EventStore) -> None:
    app = create_app(store)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://calltape") as client:
            s = parse((await client.get("/metrics")).text)
    assert s[("calltape_recorder_queue_depth", ())] == 0
    assert s[("calltape_recorder_committed_events_total", ())] == 0


@pytest.mark.parametrize("kind", ["tool.result", "tool.cancelled"])
def test_a_second_settlement_counts_nothing(kind: str) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    counters = CallCounters(registry)
    counters(Event(type="tool.call", data={"call": "c", "name": "t", "arguments": {}}, session="s"))
    counters(Event(type="tool.result", data={"call": "c", "output": 1}, session="s"))
    counters(Event(type=kind, data={"call": "c", "output": 2, "reason": "interrupted"}, session="s"))
    s = parse(generate_latest(registry).decode())
    assert s[("calltape_tool_outcomes_total", (("outcome", "completed"), ("tool", "t")))] == 1
    assert sum(v for (name, _), v in s.items() if name == "calltape_tool_outcomes_total") == 1
