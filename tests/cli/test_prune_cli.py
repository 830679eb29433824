"""``calltape prune`` shows its progress on a terminal and stays quiet when piped (issue 16)."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import Cli, barge_in_call, jsonl


def test_prune_progress_on_a_terminal_only(plain_cli: Cli, tmp_path: Path) -> None:
    # barge_in_call's events are from 2025, long before "30 days ago"
    path = tmp_path / "old.jsonl"
    path.write_bytes(jsonl([e for i in range(30) for e in barge_in_call(f"old-{i:02d}")]))
    assert plain_cli("import", str(path)).code == 0
    dry = plain_cli("prune", "--older-than", "30d", "--dry-run", "--json")
    assert dry.code == 0 and dry.err == "" and dry.json()["sessions"] == 30, dry
    proc, drawn = plain_cli.on_terminal("prune", "--older-than", "30d")
    assert proc.returncode == 0, drawn
    assert b"pruning" in drawn, drawn
    assert b"Erased 30 session(s)" in proc.stdout and b"\x1b" not in proc.stdout
    assert plain_cli("import", str(path)).code != 0  # tombstones refuse the re-import
    piped = plain_cli("prune", "--older-than", "30d")
    assert piped.code == 0 and piped.err == "" and "Erased 0 session(s)" in piped.out, piped
