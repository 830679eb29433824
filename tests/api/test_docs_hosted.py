"""docs/hosted.md runs as written: each ```python block is a complete program, run in its own subprocess
and temporary directory (the README's runner), and prints what the page says it prints."""

from __future__ import annotations

import re
from pathlib import Path

from test_readme import FENCE, run_block

PAGE = Path(__file__).resolve().parents[2] / "docs" / "hosted.md"


def python_blocks() -> list[str]:
    return [m.group(2) for m in FENCE.finditer(PAGE.read_text()) if m.group(1) == "python"]


def test_the_hosted_page_blocks_run_and_show_what_they_say(tmp_path: Path) -> None:
    elevenlabs, ultravox = python_blocks()
    for name in ("el", "uv"):
        (tmp_path / name).mkdir()
    heard = run_block(elevenlabs, tmp_path / "el")
    assert heard.returncode == 0, heard.stderr
    assert "'Booked for two, your code is'" in heard.stdout and "BK-42" not in heard.stdout, heard.stdout
    resumed = run_block(ultravox, tmp_path / "uv")
    assert resumed.returncode == 0, resumed.stderr
    assert re.search(r"You book tables\. .*'invocationId': 'inv-1'", resumed.stdout), resumed.stdout
    assert '{"status":"unknown"}' in resumed.stdout, resumed.stdout


def test_the_live_elevenlabs_attach_is_the_examples() -> None:
    """The page's three-line live attach (a fragment, so not run by itself) is what the example runs."""
    (fragment,) = [m.group(2) for m in FENCE.finditer(PAGE.read_text()) if m.group(1) == "py"]
    example = PAGE.parents[1] / "examples" / "elevenlabs_live.py"
    code = {line.split("  #")[0].strip() for line in example.read_text().splitlines()}
    lines = fragment.strip().splitlines()
    assert len(lines) <= 3 and all(line.split("  #")[0].strip() in code for line in lines), lines


def test_every_platform_attaches_in_at_most_three_lines() -> None:
    text = PAGE.read_text()
    shells = [m.group(2) for m in FENCE.finditer(text) if m.group(1) == "sh"]
    assert len(shells) == 5
    assert all(len(block.strip().splitlines()) <= 3 for block in shells), shells
