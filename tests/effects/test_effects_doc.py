"""docs/effects.md: every Python block runs as written, in a fresh interpreter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).parents[2] / "docs" / "effects.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_the_page_has_blocks_and_links_the_reference() -> None:
    assert len(BLOCKS) >= 2
    assert "reference.md#8-effects-a-real-world-action-at-most-once" in DOC.read_text()
    assert "## 8. Effects: a real-world action at most once" in (DOC.parent / "reference.md").read_text()


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_every_block_runs(code: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
