"""Voice latency figures on hand-built timelines whose answers are known to the millisecond."""

from __future__ import annotations

import heapq

from calltape.eventstore import EventStore
from calltape.runtime import merge_stats, session_stats
from calltape.runtime.latency import Latencies, LatencyTracker, percentile, session_latencies, summarize
from tests.runtime.latency_support import EXPECTED_A, EXPECTED_B, SUMMARY_A, TIMELINE_A, TIMELINE_B, events


def as_lists(found: Latencies) -> dict[str, object]:
    return {**found.samples, "tool_duration": found.tools}


def test_each_figure_on_a_known_timeline() -> None:
    assert as_lists(session_latencies(events("a", TIMELINE_A))) == EXPECTED_A


def test_a_drop_forgets_waits_and_a_clock_behind_is_skipped() -> None:
    assert as_lists(session_latencies(events("b", TIMELINE_B))) == EXPECTED_B


def test_nearest_rank_percentiles() -> None:
    hundred = list(range(100, 0, -1))  # 1..100, unsorted
    assert [percentile(hundred, q) for q in (0.5, 0.95, 0.99, 1.0)] == [50, 95, 99, 100]
    assert summarize([7]) == {"count": 1, "p50": 7, "p95": 7, "p99": 7, "max": 7}
    assert summarize([]) == {"count": 0, "p50": None, "p95": None, "p99": None, "max": None}
    thousand = list(range(1, 1001))
    assert [percentile(thousand, q) for q in (0.5, 0.95, 0.99)] == [500, 950, 990]


def test_session_stats_and_pooled_totals() -> None:
    pooled = Latencies()
    a = session_stats(events("a", TIMELINE_A), into=pooled)
    b = session_stats(events("b", TIMELINE_B), into=pooled)
    assert a["latency_ms"] == SUMMARY_A
    assert a["tools"]["duration_ms_p50"] == 100 and a["tools"]["duration_ms_max"] == 1500
    assert b["latency_ms"]["interruption_to_agent_stopped"]["count"] == 0
    totals = merge_stats([a, b], pooled)
    # Percentiles of the pooled samples (400, 500, 800), not an average of the sessions' percentiles.
    assert totals["latency_ms"]["user_stopped_to_agent_speech"] == {
        "count": 3,
        "p50": 500,
        "p95": 800,
        "p99": 800,
        "max": 800,
    }
    assert totals["latency_ms"]["tool_duration"]["book_table"] == {
        "count": 2,
        "p50": 900,
        "p95": 1500,
        "p99": 1500,
        "max": 1500,
    }
    assert merge_stats([a, b])["latency_ms"]["reply_to_first_text"]["count"] == 0  # no samples given


def test_interleaved_sessions_as_the_feed_delivers_them() -> None:
    feed = list(heapq.merge(events("a", TIMELINE_A), events("b", TIMELINE_B), key=lambda e: (e.seq, e.session)))
    tracker = LatencyTracker()
    found = Latencies()
    for event in feed:
        for sample in tracker.observe(event):
            found.add(sample)
    expected = Latencies()
    expected.update(session_latencies(events("a", TIMELINE_A)))
    expected.update(session_latencies(events("b", TIMELINE_B)))
    assert {k: sorted(v) for k, v in found.samples.items()} == {k: sorted(v) for k, v in expected.samples.items()}
    assert {k: sorted(v) for k, v in found.tools.items()} == {"book_table": [900, 1500], "lookup": [100]}
    assert tracker.open_sessions == 1  # a's state went with its session.ended


def test_memory_is_bounded_by_max_sessions() -> None:
    tracker = LatencyTracker(max_sessions=2)
    for i in range(5):
        tracker.observe(events(f"s{i}", [(0, "user.speech.stopped", {})])[0])
    assert tracker.open_sessions == 2
    # The oldest sessions were forgotten: their waits end in no sample.
    assert tracker.observe(events("s0", [(900, "agent.speech.started", {"reply": "r"})])[0]) == []
    assert [s.ms for s in tracker.observe(events("s4", [(900, "agent.speech.started", {"reply": "r"})])[0])] == [900]


async def test_figures_from_the_store(store: EventStore) -> None:
    await store.append(events("lat-a", TIMELINE_A))
    await store.append(events("lat-b", TIMELINE_B))
    pooled = Latencies()
    a = session_stats(await store.read("lat-a"), into=pooled)
    session_stats(await store.read("lat-b"), into=pooled)
    assert a["latency_ms"] == session_stats(events("lat-a", TIMELINE_A))["latency_ms"]
    assert as_lists(pooled) == {
        "user_stopped_to_agent_speech": [800, 500, 400],
        "interruption_to_agent_stopped": [250, 700],
        "reply_to_first_text": [300, 400],
        "tool_duration": {"book_table": [1500, 900], "lookup": [100]},
    }


def test_a_duplicate_event_id_counts_once() -> None:
    timeline = events("d", TIMELINE_A)
    stop = timeline[16]
    assert stop.type == "user.speech.stopped" and stop.at_ms - timeline[0].at_ms == 4700
    timeline.insert(20, stop)  # redelivered after r2's playout began: it would open a wait for r3's
    assert session_latencies(timeline).samples["user_stopped_to_agent_speech"] == [800, 500, 1400]
    assert session_stats(timeline)["latency_ms"]["user_stopped_to_agent_speech"]["count"] == 2
