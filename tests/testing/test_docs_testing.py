"""docs/testing.md runs as written: every ```python block is a complete program, run in its own
subprocess and temporary directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)


def python_blocks() -> list[tuple[int, str]]:
    text = PAGE.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == "python"]


BLOCKS = python_blocks()


def test_the_page_has_its_examples() -> None:
    assert len(BLOCKS) == 3


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_every_python_block_runs_as_written(line: int, code: str, tmp_path: Path) -> None:
    if "livekit" in code:
        pytest.importorskip("livekit.agents")
    if "pipecat" in code:
        pytest.importorskip("pipecat")
    script = tmp_path / "block.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLTAPE_")}
    env["CALLTAPE_HOME"] = str(tmp_path / "home")
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"docs/testing.md:{line} failed:\n{done.stdout}\n{done.stderr[-3000:]}"
