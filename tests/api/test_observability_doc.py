"""docs/observability.md: its Python blocks run as written; the metric names it lists are served."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text())


def test_the_page_has_python_blocks() -> None:
    assert blocks()


@pytest.mark.parametrize("code", blocks())
def test_every_python_block_runs_as_written(code: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "invoke_agent booking" in proc.stdout and "calltape.reply.interrupted': True" in proc.stdout


def test_the_metrics_it_lists_are_the_servers() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from calltape.server.metrics import ServerMetrics

    served = {f.name for f in text_string_to_metric_families(ServerMetrics(None).exposition().decode())}
    listed = set(re.findall(r"^\| `(calltape_[a-z_]+)`", DOC.read_text(), re.M))
    assert listed, "the page's metrics table is gone"
    for name in listed:
        family = re.sub(r"_total$", "", name)
        assert family in served, f"{name} is listed in docs/observability.md but not served"
