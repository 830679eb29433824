"""Small statistics helpers: every figure is a median over repeats, with its spread."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of unsorted values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


@dataclass(slots=True)
class Spread:
    """The median of repeated measurements and their range."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        vals = [v for v in values if v is not None and not math.isnan(v)]
        if not vals:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(vals), min(vals), max(vals), len(vals))

    def json(self, digits: int = 3) -> dict[str, Any]:
        return {
            "median": _round(self.median, digits),
            "min": _round(self.low, digits),
            "max": _round(self.high, digits),
            "n": self.n,
        }

    def text(self, fmt: str = "{:.2f}") -> str:
        if self.n == 0:
            return "—"
        if self.n == 1:
            return fmt.format(self.median)
        return f"{fmt.format(self.median)} [{fmt.format(self.low)}-{fmt.format(self.high)}]"


def latency_summary(samples: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """p50 / p90 / p99 / max of one run's latency samples (same unit as the samples)."""
    return {
        "n": len(samples),
        "p50": _round(percentile(samples, 50), digits),
        "p90": _round(percentile(samples, 90), digits),
        "p99": _round(percentile(samples, 99), digits),
        "max": _round(max(samples) if samples else math.nan, digits),
    }


def _round(value: float, digits: int) -> float | None:
    if value is None or math.isnan(value):
        return None
    return round(value, digits)
