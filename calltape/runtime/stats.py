"""Per-session figures from the log alone: what ``calltape stats`` prints."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from calltape.events import Event
from calltape.projections.callrecord import CallRecord
from calltape.projections.effects import EffectLog
from calltape.runtime.latency import Latencies, LatencyTracker, percentile
from calltape.runtime.recovery import RECOVERY_EVENT_TYPE


def session_stats(events: Iterable[Event], *, into: Latencies | None = None) -> dict[str, Any]:
    """Counts, tool outcomes and durations, the recoveries calltape performed, and the voice latency
    figures (:mod:`calltape.runtime.latency`); ``into`` also receives the latency samples, for totals.
    The call's state (outcomes, interruptions, effects) is read from its
    :class:`~calltape.projections.callrecord.CallRecord`."""
    record = CallRecord()
    types: Counter[str] = Counter()
    recoveries: Counter[str] = Counter()
    tracker = LatencyTracker()
    latencies = Latencies()
    for event in events:
        if not record.apply(event).new:
            continue  # a duplicate id: it happened once
        for sample in tracker.observe(event):
            latencies.add(sample)
        types[event.type] += 1
        if event.type == RECOVERY_EVENT_TYPE:
            recoveries[str(event.data.get("kind"))] += 1
    fold, effects = record.fold, record.effects
    first, last = record.first_at_ms, record.last_at_ms
    if into is not None:
        into.update(latencies)
    durations = [ms for values in latencies.tools.values() for ms in values]
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
            "duration_ms_p50": percentile(durations, 0.5),
            "duration_ms_max": max(durations) if durations else None,
        },
        "resumes": types.get("session.resumed", 0),
        "handoffs": types.get("agent.handoff", 0),
        "drops": types.get("session.dropped", 0),
        "recoveries": dict(sorted(recoveries.items())),
        "effects": effect_outcomes(effects),
        "latency_ms": latencies.summary(),
    }


def effect_outcomes(effects: EffectLog) -> dict[str, dict[str, int]]:
    """Runs of each effect by name and outcome (a run's latest phase: done, failed, unknown, or
    started when the log ends with it running), e.g. ``{"charge": {"done": 3, "unknown": 1}}``."""
    counts: dict[str, Counter[str]] = {}
    for state in effects:
        for run in state.runs:
            counts.setdefault(state.name, Counter())[run.phase] += 1
    return {name: dict(sorted(c.items())) for name, c in sorted(counts.items())}


def merge_stats(all_stats: Iterable[dict[str, Any]], latencies: Latencies | None = None) -> dict[str, Any]:
    """Totals over several sessions (``calltape stats`` with no session); ``latencies`` holds every
    session's samples (``session_stats(..., into=latencies)``): percentiles are of the pooled samples."""
    total: dict[str, Any] = {"sessions": 0, "events": 0, "interruptions": 0, "resumes": 0, "handoffs": 0, "drops": 0}
    outcomes: Counter[str] = Counter()
    recoveries: Counter[str] = Counter()
    effects: dict[str, Counter[str]] = {}
    for s in all_stats:
        total["sessions"] += 1
        for key in ("events", "interruptions", "resumes", "handoffs", "drops"):
            total[key] += s[key]
        outcomes.update(s["tools"]["outcomes"])
        recoveries.update(s["recoveries"])
        for name, outcomes_of in s.get("effects", {}).items():
            effects.setdefault(name, Counter()).update(outcomes_of)
    total["tool_outcomes"] = dict(sorted(outcomes.items()))
    total["recoveries"] = dict(sorted(recoveries.items()))
    total["effects"] = {name: dict(sorted(c.items())) for name, c in sorted(effects.items())}
    total["latency_ms"] = (latencies or Latencies()).summary()
    return total
