"""docs/platforms-openai-agents.md: every Python block is a complete program that runs as written,
offline, in a subprocess; the attach takes at most three lines of calltape."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("agents.realtime.testing")

pytestmark = pytest.mark.openai_agents

PAGE = Path(__file__).resolve().parents[2] / "docs" / "platforms-openai-agents.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def run(block: str, cwd: Path) -> str:
    script = cwd / "block.py"
    script.write_text(block)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_attach_block_records_the_call(tmp_path: Path) -> None:
    out = run(blocks()[0], tmp_path)
    assert "'role': 'user', 'content': 'A table for two at seven'" in out
    assert "'type': 'function_call_output', 'call_id': 'c1', 'output': 'booked for 19:00'" in out


def test_the_restore_block_seeds_the_new_session(tmp_path: Path) -> None:
    out = run(blocks()[1], tmp_path)
    assert "A table for two at seven" in out and "restored after the connection was lost" in out


def test_the_renew_block_renews_once(tmp_path: Path) -> None:
    out = run(blocks()[2], tmp_path)
    assert out.count("renewing after session_expired") == 1


def test_attach_takes_three_lines() -> None:
    code = blocks()[0].splitlines()
    ours = [
        line.strip()
        for line in code
        if re.search(r"\b(calltape|ct|tap)\b", line)
        and not line.startswith(("import", "from"))
        and "context" not in line  # reading the result back
    ]
    assert len(ours) <= 3, ours
