"""The LiveKit guide's attach program (docs/guides/livekit.md; every block of the docs runs in
tests/api/test_readme.py) prints the recorded greeting, and takes at most three lines of calltape."""

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


def test_the_attach_program_records_the_greeting(tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(livekit_blocks()[0])
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'role': 'assistant', 'content': 'Hello, how can I help?'" in done.stdout


def test_attach_takes_three_lines() -> None:
    attach = livekit_blocks()[0]
    calltape_lines = [
        line for line in attach.splitlines() if "calltape" in line or "ct" in re.findall(r"\b\w+\b", line)
    ]
    # the import, connect, start (which replaces session.start), and reading the result back
    imports = [line for line in calltape_lines if line.startswith(("import", "from"))]
    code = [line for line in calltape_lines if line not in imports and "print(" not in line]
    assert len(code) <= 3, code
