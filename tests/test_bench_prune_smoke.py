"""``python -m bench.prune_load`` runs end to end at a tiny size on both backends: the prune really erases
every seeded event while the load runs, and every figure is reported. Nothing about speed is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[1]


def test_prune_load_bench_completes(pg_admin_url: str, tmp_path: Path) -> None:
    out = tmp_path / "prune.json"
    args = ["--sessions", "6", "--events", "150", "--load-sessions", "5", "--window", "0.5", "--baseline-windows", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.prune_load", *args, "--sqlite", "--db", pg_admin_url, "--json", str(out)],
        cwd=ROOT,
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    for backend in ("postgres", "sqlite"):
        assert figures[f"{backend}_seeded"] == 900
        result = figures[backend]
        assert result["prune"]["events"] == 900 and result["prune"]["sessions"] == 6
        assert result["with_prune"]["windows"] >= 1
        for phase in ("without_prune_before", "with_prune", "without_prune_after"):
            assert result[phase]["emit_us"]["n"] > 0 and result[phase]["commit_lag_ms"]["p99"] is not None
        assert all(result[k] > 0 for k in ("ratio_emit_p99", "ratio_durable_p99", "ratio_commit_lag_p99"))
