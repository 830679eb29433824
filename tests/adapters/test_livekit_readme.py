"""The LiveKit guide's attach program (docs/guides/livekit.md; every block of the docs runs in
tests/api/test_readme.py) prints the recorded greeting, and takes at most three lines of calltape; the
blocks of docs/adapters-livekit.md print what they promise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("livekit.agents")

pytestmark = pytest.mark.livekit

ROOT = Path(__file__).resolve().parents[2]


def livekit_blocks() -> list[str]:
    text = (ROOT / "docs" / "guides" / "livekit.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def docs_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "adapters-livekit.md").read_text(), flags=re.S)


def run_block(code: str, tmp_path: Path) -> str:
    """Runs ``code`` as a script; returns its stdout (fails the test when it fails)."""
    script = tmp_path / "block.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_attach_program_records_the_greeting(tmp_path: Path) -> None:
    assert "'role': 'assistant', 'content': 'Hello, how can I help?'" in run_block(livekit_blocks()[0], tmp_path)


def test_docs_page_blocks_run_as_written(tmp_path: Path) -> None:
    handoff, start_result = docs_blocks()
    assert run_block(handoff, tmp_path).strip() == "triage -> billing"
    assert "ChatMessageEvent" in run_block(start_result, tmp_path)


def test_attach_takes_three_lines() -> None:
    attach = livekit_blocks()[0]
    calltape_lines = [
        line for line in attach.splitlines() if "calltape" in line or "ct" in re.findall(r"\b\w+\b", line)
    ]
    # the import, connect, start (which replaces session.start), and reading the result back
    imports = [line for line in calltape_lines if line.startswith(("import", "from"))]
    code = [line for line in calltape_lines if line not in imports and "print(" not in line]
    assert len(code) <= 3, code
