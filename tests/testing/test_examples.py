"""The example test files users copy (examples/test_*_agent.py) pass as they are, run by pytest in a
subprocess the way a user runs them (they live outside ``testpaths``, so the suite runs them here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=240"]
    try:
        return subprocess.run(
            [*command, str(ROOT / "examples" / name)], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired as exc:  # show where it hung: the example's thread dump is on stderr
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr or "")
        pytest.fail(f"{name} did not finish in {exc.timeout:g} s; its stderr ends:\n{stderr[-12000:]}")


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


def run_script(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.pipecat
def test_the_pipecat_quickstart_records_the_call_the_docs_way() -> None:
    pytest.importorskip("pipecat")
    done = run_script("pipecat_quickstart.py")
    assert done.returncode == 0, done.stderr[-4000:]
    assert '"content": "Order 42 shipped on Monday."' in done.stdout
    assert '"content": "{\\"order\\":42,\\"status\\":\\"shipped\\"}"' in done.stdout  # the guarded tool's result
    assert "seeded a new LLMContext with 5 messages" in done.stdout


@pytest.mark.livekit
def test_the_livekit_quickstart_records_the_call_the_docs_way() -> None:
    pytest.importorskip("livekit.agents")
    done = run_script("livekit_quickstart.py")
    assert done.returncode == 0, done.stderr[-4000:]
    assert '"content": "table booked for 7pm"' in done.stdout  # the result that landed after the barge-in
    (seeded,) = [line for line in done.stdout.splitlines() if line.startswith("seeded agent's items:")]
    assert "'function_call', 'function_call_output'" in seeded  # the second agent lacks `book`, keeps its call
