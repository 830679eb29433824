"""The benchmark suite runs end to end (``python -m bench --quick``) and writes every headline key.

A smoke test only: it asserts nothing about speed (CI machines are noisy; figures are compared
within one run, in bench/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[1]

HEADLINE_KEYS = {
    "append_ratio_vs_raw_copy",
    "append_ratio_vs_eventsourcing",
    "emit_p99_us",
    "durable_append_p99_ms",
    "durable_ratio_vs_raw_commit",
    "rebuild_ratio_vs_raw_read",
    "rebuild_snapshot_ms",
    "resume_p99_ms",
    "interrupt_release_p99_ms",
    "read_ratio_vs_eventsourcing",
    "read_ratio_vs_raw",
    "max_sessions_sustained",
    "sqlite_append_ratio_vs_raw",
    "resume_growth_200k_vs_10k",
    "turn_checkpoint_ratio_vs_session_continuity",
    "resume_ratio_vs_session_continuity",
    "import_peak_rss_mb",
}


def _bench(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m module args`` from the checkout's root; fails the test on a non-zero exit."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "150"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_quick_bench_completes_and_reports_every_key(pg_admin_url: str, tmp_path: Path) -> None:
    pytest.importorskip("eventsourcing", reason="the bench extra is not installed (pip install -e '.[bench]')")
    pytest.importorskip("pipecat_session_continuity", reason="the bench extra is not installed")
    out = tmp_path / "bench.json"
    _bench("bench", "--quick", "--db", pg_admin_url, "--json", str(out), timeout=600)
    figures = json.loads(out.read_text())
    missing = HEADLINE_KEYS - figures.keys()
    assert not missing, f"missing keys: {sorted(missing)}"
    for key in HEADLINE_KEYS:
        assert key in figures["goals"]
    from bench.run import HEADLINE_KEYS as SUITE_KEYS

    assert set(SUITE_KEYS) == HEADLINE_KEYS
    assert figures["notes"] == [], figures["notes"]  # no benchmark failed
    assert [p["sessions"] for p in figures["details"]["scale"]["points"]][:1] == [200]
    assert figures["details"]["sqlite_append"]["raw_sqlite3_events_per_s"]["median"] > 0
    curve = figures["details"]["peer"]["curve"]
    assert [p["turns"] for p in curve] == [10, 50]
    assert all(p["peer_checkpoint"]["n"] == p["turns"] == p["calltape_turn_durable"]["n"] for p in curve)
    imported = figures["details"]["import"]  # a subprocess's own peak, with and without ids
    assert imported["rss_events"] == 20_000
    assert 10 < imported["import_peak_rss_mb"] < 1000 and 10 < imported["import_peak_rss_mb_with_ids"] < 1000


def test_import_bench_reports_speed_and_compares_with_a_revision(pg_admin_url: str) -> None:
    # the baseline is this very revision (HEAD): the harness is what is checked, not a figure
    small = ["--sessions", "2", "--events", "100", "--db", pg_admin_url]
    proc = _bench("bench.importing", *small, "--baseline", "HEAD", "--repeat", "1", timeout=300)
    figures = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert figures["events"] == 200
    for backend in ("sqlite", "postgres"):
        assert figures[f"{backend}_import_events_per_s_median"] > 0
        assert figures[f"{backend}_baseline_events_per_s_median"] > 0
        assert len(figures[f"{backend}_runs_s"]["baseline"]) == 1
