"""The Grafana dashboard in ops/grafana/ loads: valid JSON of the shape Grafana imports, and every PromQL
query names metrics (and group-by labels) that ``GET /metrics`` really serves."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from calltape.events import Event
from calltape.eventstore import EventStore
from calltape.runtime.latency import samples
from calltape.server.metrics import ServerMetrics
from tests.runtime.latency_support import TIMELINE_A, TIMELINE_B, events

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "grafana" / "calltape.json"
METRIC = re.compile(r"\b(calltape_[a-z0-9_]+)\b")
BY = re.compile(r"\bby \(([^)]*)\)")


def queries(dashboard: dict[str, Any]) -> list[str]:
    found = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    found += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return found


async def exposed(store: EventStore) -> dict[str, set[str]]:
    """Every sample name the server exposes after two calls, with the labels it carries."""
    metrics = ServerMetrics(store)
    feed = [*events("dash-a", TIMELINE_A), *events("dash-b", TIMELINE_B)]
    for event in feed:
        metrics.observe(event)
    # an effect (SPEC section 8), built directly: this store's event model may not know the type yet
    metrics.observe(Event("tool.effect", {"call": "c1", "name": "book_table", "key": "t4", "phase": "done"}, "dash-a"))
    for sample in samples(feed):
        metrics.latency(sample)
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def test_the_dashboard_is_valid_json_grafana_imports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        assert panel["targets"] and panel["datasource"]["type"] == "prometheus"
        box = panel["gridPos"]
        assert 0 <= box["x"] and box["x"] + box["w"] <= 24
        mine = {(x, y) for x in range(box["x"], box["x"] + box["w"]) for y in range(box["y"], box["y"] + box["h"])}
        assert not cells & mine, f"panel {panel['title']!r} overlaps another"
        cells |= mine
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


async def test_every_query_names_metrics_the_server_serves(store: EventStore) -> None:
    served = await exposed(store)
    dashboard = json.loads(DASHBOARD.read_text())
    named: set[str] = set()
    for expr in queries(dashboard):
        metrics = METRIC.findall(expr)
        assert metrics, f"a query names no calltape metric: {expr}"
        for name in metrics:
            assert name in served, f"{name} (in {expr}) is not served by GET /metrics"
            named.add(name)
        grouped = {label.strip() for match in BY.findall(expr) for label in match.split(",")}
        carried = set().union(*(served[name] for name in metrics)) | {"job"}
        assert grouped <= carried, f"{expr} groups by labels its metrics do not carry: {grouped - carried}"
    # the dashboard shows every family the issue asks for
    for family in (
        "calltape_events_appended_total",
        "calltape_sessions_dropped_total",
        "calltape_sessions_resumed_total",
        "calltape_tool_outcomes_total",
        "calltape_effects_total",
        "calltape_check_findings_total",
        "calltape_recorder_queue_depth",
        "calltape_recorder_commit_lag_seconds",
        "calltape_recorder_spilled_events_total",
        "calltape_user_stopped_to_agent_speech_seconds_bucket",
    ):
        assert family in named, f"the dashboard does not show {family}"
