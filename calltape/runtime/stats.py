"""Per-session figures from the log alone: what ``calltape stats`` prints."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from calltape.events import Event
from calltape.projections import ContextFold
from calltape.runtime.recovery import RECOVERY_EVENT_TYPE


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def session_stats(events: Iterable[Event]) -> dict[str, Any]:
    """Counts, tool outcomes and durations, and the recoveries calltape performed."""
    fold = ContextFold()
    types: Counter[str] = Counter()
    recoveries: Counter[str] = Counter()
    started_at: dict[str, int] = {}
    durations: list[float] = []
    first = last = None
    for event in events:
        fold.apply(event)
        types[event.type] += 1
        first = event.at_ms if first is None else first
        last = event.at_ms
        if event.type == RECOVERY_EVENT_TYPE:
            recoveries[str(event.data.get("kind"))] += 1
        elif event.type == "tool.started":
            started_at.setdefault(event.data["call"], event.at_ms)
        elif event.type in ("tool.result", "tool.cancelled") and event.data["call"] in started_at:
            durations.append(event.at_ms - started_at.pop(event.data["call"]))
    outcomes = Counter(c.status for c in fold.tool_calls() if c.included)
    return {
        "session": fold.session,
        "events": sum(types.values()),
        "duration_s": round((last - first) / 1000, 3) if first is not None and last is not None else 0.0,
        "types": dict(sorted(types.items())),
        "interruptions": fold.counters.get("interruptions", 0),
        "tools": {
            "calls": sum(outcomes.values()),
            "outcomes": dict(sorted(outcomes.items())),
            "duration_ms_p50": _percentile(durations, 0.5),
            "duration_ms_max": max(durations) if durations else None,
        },
        "resumes": types.get("session.resumed", 0),
        "handoffs": types.get("agent.handoff", 0),
        "drops": types.get("session.dropped", 0),
        "recoveries": dict(sorted(recoveries.items())),
    }


def merge_stats(all_stats: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Totals over several sessions (``calltape stats`` with no session)."""
    total: dict[str, Any] = {"sessions": 0, "events": 0, "interruptions": 0, "resumes": 0, "handoffs": 0, "drops": 0}
    outcomes: Counter[str] = Counter()
    recoveries: Counter[str] = Counter()
    for s in all_stats:
        total["sessions"] += 1
        for key in ("events", "interruptions", "resumes", "handoffs", "drops"):
            total[key] += s[key]
        outcomes.update(s["tools"]["outcomes"])
        recoveries.update(s["recoveries"])
    total["tool_outcomes"] = dict(sorted(outcomes.items()))
    total["recoveries"] = dict(sorted(recoveries.items()))
    return total
