"""`calltape stats`: the voice latency figures, as users run it (the console script in a subprocess)."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import Cli, jsonl
from tests.runtime.latency_support import SUMMARY_A, TIMELINE_A, TIMELINE_B, wire


def _import_two(cli: Cli, tmp_path: Path, prefix: str) -> tuple[str, str]:
    a, b = f"{prefix}-a", f"{prefix}-b"
    rows = wire(a, TIMELINE_A) + wire(b, TIMELINE_B)
    for row in rows:
        if row["type"] == "session.started":
            row["data"] = {**row["data"], "tenant": prefix}  # totals over these two sessions only
    path = tmp_path / "calls.jsonl"
    path.write_bytes(jsonl(rows))
    imported = cli("--all-tenants", "import", str(path))  # sessions of a tenant: the operator's store
    assert imported.code == 0, imported
    return a, b


def test_latency_figures_per_session_and_across_sessions(cli: Cli, tmp_path: Path, session_id: str) -> None:
    a, _ = _import_two(cli, tmp_path, session_id)
    one, totals, table, totals_table = cli.many(
        ["--all-tenants", "stats", a, "--json"],
        ["--all-tenants", "stats", "--of-tenant", session_id, "--json"],
        ["--all-tenants", "stats", a],
        ["--all-tenants", "stats", "--of-tenant", session_id],
    )
    assert one.code == 0 and one.err == "", one
    assert one.json()["latency_ms"] == SUMMARY_A
    # Across sessions: percentiles of the pooled samples; no progress bar when stderr is piped.
    assert totals.code == 0 and totals.err == "", totals
    pooled = totals.json()
    assert pooled["sessions"] == 2, totals
    assert pooled["latency_ms"]["user_stopped_to_agent_speech"] == {
        "count": 3,
        "p50": 500,
        "p95": 800,
        "p99": 800,
        "max": 800,
    }
    assert pooled["latency_ms"]["tool_duration"]["book_table"] == {
        "count": 2,
        "p50": 900,
        "p95": 1500,
        "p99": 1500,
        "max": 1500,
    }
    assert pooled["latency_ms"]["interruption_to_agent_stopped"]["count"] == 2
    # The table: one row per figure and per tool, count p50 p95 p99 max.
    assert table.code == 0 and totals_table.code == 0, (table, totals_table)
    rows = _rows(table.out)
    assert rows["user stopped → agent speaks"] == ["2", "500", "800", "800", "800"], table
    assert rows["interruption → agent silent"] == ["2", "250", "700", "700", "700"], table
    assert rows["reply started → first text"] == ["2", "300", "400", "400", "400"], table
    assert rows["tool book_table"] == ["1", "1500", "1500", "1500", "1500"], table
    assert rows["tool lookup"] == ["1", "100", "100", "100", "100"], table
    assert _rows(totals_table.out)["tool book_table"] == ["2", "900", "1500", "1500", "1500"], totals_table


def _rows(out: str) -> dict[str, list[str]]:
    """The latency table's rows: label -> the five figures."""
    return {" ".join(x.split()[:-5]): x.split()[-5:] for x in out.splitlines() if len(x.split()) > 5}


def test_a_session_without_speech_prints_dashes(cli: Cli, tmp_path: Path, session_id: str) -> None:
    path = tmp_path / "text.jsonl"
    path.write_bytes(jsonl(wire(session_id, [(0, "session.started", {"agent": "a", "modality": "text"})])))
    assert cli("import", str(path)).code == 0
    shown, as_json = cli.many(["stats", session_id], ["stats", session_id, "--json"])
    assert as_json.json()["latency_ms"]["reply_to_first_text"] == {
        "count": 0,
        "p50": None,
        "p95": None,
        "p99": None,
        "max": None,
    }
    assert _rows(shown.out)["reply started → first text"] == ["0", "-", "-", "-", "-"], shown


def test_progress_bar_on_a_terminal_only(plain_cli: Cli, tmp_path: Path) -> None:
    _import_two(plain_cli, tmp_path, "bar")
    proc, drawn = plain_cli.on_terminal("stats", "--json")
    assert proc.returncode == 0 and b"\x1b" not in proc.stdout
    assert b"reading sessions" in drawn, drawn
