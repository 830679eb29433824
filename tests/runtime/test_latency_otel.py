"""The latency figures as OpenTelemetry histograms (the SDK's in-memory reader), fed live from the feed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from calltape.eventstore import EventStore
from calltape.runtime import follow_latencies, otel_latency_sink
from calltape.runtime.latency import OTHER_TOOL, Sample, ToolLabels, samples
from tests.runtime.latency_support import TIMELINE_A, TIMELINE_B, events

pytest.importorskip("opentelemetry.sdk")


def _reader_and_sink() -> tuple[Any, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    sink = otel_latency_sink(MeterProvider(metric_readers=[reader]))
    assert sink is not None
    return reader, sink


def _points(reader: Any) -> dict[tuple[str, tuple[tuple[str, Any], ...]], Any]:
    return {
        (metric.name, tuple(sorted(point.attributes.items()))): point
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        for point in metric.data.data_points
    }


class Collect:
    """A sink that keeps samples and wakes a waiter once it has ``n``."""

    def __init__(self) -> None:
        self.got: list[Sample] = []
        self._grew = asyncio.Event()

    def __call__(self, sample: Sample) -> None:
        self.got.append(sample)
        self._grew.set()

    async def wait_for(self, n: int) -> None:
        async with asyncio.timeout(20):
            while len(self.got) < n:
                self._grew.clear()
                await self._grew.wait()


def test_histograms_of_known_timelines() -> None:
    reader, sink = _reader_and_sink()
    for sample in [*samples(events("a", TIMELINE_A)), *samples(events("b", TIMELINE_B))]:
        sink(sample)
    points = _points(reader)
    summary = {key: (p.count, p.sum, p.min, p.max) for key, p in points.items()}
    assert summary == {
        ("calltape.latency.user_stopped_to_agent_speech", ()): (3, 1700, 400, 800),
        ("calltape.latency.interruption_to_agent_stopped", ()): (2, 950, 250, 700),
        ("calltape.latency.reply_to_first_text", ()): (2, 700, 300, 400),
        ("calltape.tool.duration", (("tool", "book_table"),)): (2, 2400, 900, 1500),
        ("calltape.tool.duration", (("tool", "lookup"),)): (1, 100, 100, 100),
    }
    response = points[("calltape.latency.user_stopped_to_agent_speech", ())]
    edges = list(response.explicit_bounds)
    assert edges[:6] == [50, 100, 200, 300, 500, 750]
    # 400 and 500 fall in (300, 500], 800 in (750, 1000]
    assert response.bucket_counts[edges.index(500)] == 2 and response.bucket_counts[edges.index(1000)] == 1


def test_tool_labels_carry_no_content_and_stay_bounded() -> None:
    labels = ToolLabels(limit=2)
    assert labels("book_table") == "book_table" and labels("crm.lookup:v2") == "crm.lookup:v2"
    assert labels("card 4242 4242 4242 4242") == OTHER_TOOL  # not an identifier: could be anything said
    assert labels("x" * 65) == OTHER_TOOL and labels(None) == OTHER_TOOL
    assert labels("third_tool") == OTHER_TOOL  # past the limit of distinct names
    assert labels("book_table") == "book_table"  # a known one keeps its label

    reader, sink = _reader_and_sink()
    sink(Sample("tool_duration", 10, "my name is Jane Doe"))
    assert [key for key in _points(reader)] == [("calltape.tool.duration", (("tool", OTHER_TOOL),))]


async def test_follow_the_feed_into_otel(store: EventStore) -> None:
    reader, sink = _reader_and_sink()
    collect = Collect()
    await store.append(events("before", TIMELINE_B))  # before the starting point: not counted
    now = await store.head()
    follower = asyncio.create_task(follow_latencies(store, [sink, collect], after=now, poll_interval=0.05))
    try:
        await store.append(events("otel-a", TIMELINE_A))
        await store.append(events("otel-b", TIMELINE_B))
        await collect.wait_for(10)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    got = collect.got
    assert sorted(s.ms for s in got if s.figure == "user_stopped_to_agent_speech") == [400, 500, 800]
    assert len(got) == 10
    point = _points(reader)[("calltape.tool.duration", (("tool", "book_table"),))]
    assert (point.count, point.sum) == (2, 2400)


async def test_a_failing_sink_does_not_stop_the_others(store: EventStore, caplog: pytest.LogCaptureFixture) -> None:
    collect = Collect()

    def broken(sample: Sample) -> None:
        raise RuntimeError("sink down")

    now = await store.head()
    follower = asyncio.create_task(follow_latencies(store, [broken, collect], after=now, poll_interval=0.05))
    try:
        await store.append(events("broken-a", TIMELINE_A))
        await collect.wait_for(8)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    assert len(collect.got) == 8 and "latency sink failed" in caplog.text
