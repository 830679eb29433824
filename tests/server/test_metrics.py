"""``GET /metrics``: the latency figures in the Prometheus text format, over real HTTP, parsed by
prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from calltape.eventstore import EventStore, open_store
from calltape.server import create_app
from tests.runtime.latency_support import TIMELINE_A, TIMELINE_B, events

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from receiver_support import free_port, running_receiver  # noqa: E402


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture
async def served(store: EventStore) -> AsyncIterator[str]:
    """The receiver app under uvicorn on a loopback port of this process; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(store), host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:  # noqa: ASYNC110  (uvicorn offers a flag, no event)
                await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


async def _scrape_until(base: str, name: str, count: float, labels: tuple[tuple[str, str], ...] = ()) -> Any:
    """The parsed exposition once ``name``'s count reached ``count`` (the feed is followed every 0.5 s)."""
    deadline = time.monotonic() + 20
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        while True:
            response = await client.get("/metrics")
            assert response.status_code == 200, response.text
            samples = parse(response.text)
            if samples.get((f"{name}_count", labels), 0) >= count or time.monotonic() > deadline:
                return response, samples
            await asyncio.sleep(0.1)


async def test_metrics_over_http(store: EventStore, served: str) -> None:
    # Written by another writer after the server started: the server follows the store's feed.
    await store.append(events("prom-a", TIMELINE_A))
    await store.append(events("prom-b", TIMELINE_B))
    response, samples = await _scrape_until(served, "calltape_tool_duration_seconds", 2, (("tool", "book_table"),))
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    response_s = "calltape_user_stopped_to_agent_speech_seconds"
    assert samples[(f"{response_s}_count", ())] == 3
    assert samples[(f"{response_s}_sum", ())] == pytest.approx(1.7)
    # cumulative buckets: 0.4 and 0.5 are <= 0.5; 0.8 is <= 1.0 but not <= 0.75
    assert samples[(f"{response_s}_bucket", (("le", "0.3"),))] == 0
    assert samples[(f"{response_s}_bucket", (("le", "0.5"),))] == 2
    assert samples[(f"{response_s}_bucket", (("le", "0.75"),))] == 2
    assert samples[(f"{response_s}_bucket", (("le", "1.0"),))] == 3
    assert samples[(f"{response_s}_bucket", (("le", "+Inf"),))] == 3
    talk_over = "calltape_interruption_to_agent_stopped_seconds"
    assert samples[(f"{talk_over}_count", ())] == 2 and samples[(f"{talk_over}_sum", ())] == pytest.approx(0.95)
    first_text = "calltape_reply_to_first_text_seconds"
    assert samples[(f"{first_text}_count", ())] == 2 and samples[(f"{first_text}_sum", ())] == pytest.approx(0.7)
    tool = "calltape_tool_duration_seconds"
    assert samples[(f"{tool}_sum", (("tool", "book_table"),))] == pytest.approx(2.4)
    assert samples[(f"{tool}_count", (("tool", "lookup"),))] == 1
    # no session ids, no content: the labels are the buckets', the tool's name, and the counters' bounded
    # identifiers (event types, outcomes, rule ids; tests/server/test_metrics_counts.py)
    labels = {k for (_, pairs) in samples for k, _ in pairs}
    assert labels == {"le", "tool", "type", "outcome", "rule"}
    assert "prom-a" not in response.text and "table for two" not in response.text


async def test_a_server_started_after_the_calls_counts_from_its_start(store: EventStore) -> None:
    await store.append(events("old-a", TIMELINE_A))
    app = create_app(store)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://calltape") as client:
            await store.append(events("new-b", TIMELINE_B))
            deadline = time.monotonic() + 20
            while True:
                samples = parse((await client.get("/metrics")).text)
                done = samples.get(("calltape_tool_duration_seconds_count", (("tool", "book_table"),)), 0)
                if done or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
    assert samples[("calltape_tool_duration_seconds_count", (("tool", "book_table"),))] == 1  # b's only
    assert samples[("calltape_user_stopped_to_agent_speech_seconds_count", ())] == 1
    assert ("calltape_tool_duration_seconds_count", (("tool", "lookup"),)) not in samples


def test_calltape_serve_process_serves_metrics(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/serve.db"
    port = free_port()
    code = f"from calltape.server import run_server; run_server({url!r}, '127.0.0.1', {port}, log_level='warning')"
    with running_receiver(code, port) as (base, _):

        async def write() -> None:
            store = await open_store(url)
            try:
                await store.append(events("proc-a", TIMELINE_A))
            finally:
                await store.close()

        asyncio.run(write())
        _, samples = asyncio.run(_scrape_until(base, "calltape_reply_to_first_text_seconds", 2))
    assert samples[("calltape_reply_to_first_text_seconds_count", ())] == 2
    assert samples[("calltape_reply_to_first_text_seconds_sum", ())] == pytest.approx(0.7)


async def test_metrics_can_be_turned_off(store: EventStore) -> None:
    app = create_app(store, metrics=False)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://calltape") as client:
            assert (await client.get("/metrics")).status_code == 404
            assert (await client.get("/healthz")).status_code == 200
