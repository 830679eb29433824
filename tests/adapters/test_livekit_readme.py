"""The README's LiveKit blocks are complete programs: each runs as written, offline, in a subprocess;
the attach snippet takes at most three lines of calltape."""

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
    text = (ROOT / "README.md").read_text()
    start = text.index("### LiveKit Agents")
    end = text.index("\n## ", start)
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


@pytest.mark.parametrize("index", range(4))
def test_block_runs_as_written(index: int, tmp_path: Path) -> None:
    blocks = livekit_blocks()
    assert len(blocks) == 4
    script = tmp_path / "block.py"
    script.write_text(blocks[index])
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    if index == 0:
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
