"""The example test files users copy (examples/test_*_agent.py) pass as they are, run by pytest in a
subprocess the way a user runs them (they live outside ``testpaths``, so the suite runs them here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(ROOT / "examples" / name)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.pipecat
def test_the_pipecat_example_passes() -> None:
    pytest.importorskip("pipecat")
    done = run_example("test_pipecat_agent.py")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "1 passed" in done.stdout
    assert " runs (2 with a drop) in " in done.stdout  # a drop per tool call, carried on a new pipeline


@pytest.mark.livekit
def test_the_livekit_example_passes() -> None:
    pytest.importorskip("livekit.agents")
    done = run_example("test_livekit_agent.py")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "1 passed" in done.stdout
    assert " runs in " in done.stdout
