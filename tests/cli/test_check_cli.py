"""``calltape check`` as users run it: the console script in a subprocess, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from conftest import Cli, assert_error, at, jsonl


def _call(session: str, *rows: tuple[int, str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"id": f"{session}-{i}", "session": session, "type": t, "at": at(ms), "data": d}
        for i, (ms, t, d) in enumerate(rows, start=1)
    ]


def late_start_call(session: str) -> list[dict[str, Any]]:
    """pipecat#4997's shape: a call queued by a generation that the caller interrupted, run anyway."""
    return _call(
        session,
        (0, "session.started", {"agent": "a"}),
        (100, "agent.reply.started", {"reply": "r1"}),
        (110, "agent.text", {"reply": "r1", "text": "Booking"}),
        (120, "tool.call", {"reply": "r1", "call": "c1", "name": "book", "arguments": {"people": 2}}),
        (200, "interruption", {"reply": "r1", "cause": "user_speech"}),
        (300, "tool.started", {"call": "c1"}),
        (400, "tool.result", {"call": "c1", "output": {"ok": True}}),
        (500, "session.ended", {}),
    )


def clean_call(session: str) -> list[dict[str, Any]]:
    return _call(
        session,
        (0, "session.started", {"agent": "a"}),
        (50, "user.text", {"text": "book a table"}),
        (100, "agent.reply.started", {"reply": "r1"}),
        (110, "agent.text", {"reply": "r1", "text": "Booking"}),
        (120, "tool.call", {"reply": "r1", "call": "c1", "name": "book", "arguments": {"people": 2}}),
        (130, "agent.reply.done", {"reply": "r1"}),
        (140, "tool.started", {"call": "c1"}),
        (150, "agent.speech.started", {"reply": "r1"}),
        (200, "interruption", {"reply": "r1", "cause": "user_speech"}),
        (250, "agent.speech.ended", {"reply": "r1", "interrupted": True}),
        (400, "tool.result", {"call": "c1", "output": {"ok": True}}),
        (500, "session.ended", {}),
    )


def mine(text: str, *prefixes: str) -> str:
    """The output lines about this test's sessions (the PostgreSQL database is shared by the run)."""
    return "".join(line + "\n" for line in text.splitlines() if line.startswith(prefixes))


def test_check_sessions_files_and_sweeps(cli: Cli, tmp_path: Path) -> None:
    bad, good = late_start_call("bad-1"), clean_call("good-1")
    file = tmp_path / "calls.jsonl"
    file.write_bytes(jsonl(bad + good))
    imported = cli("import", str(file))
    assert imported.code == 0, imported

    # three at a time: each start-up costs seconds on a loaded machine
    one_bad, one_good, both = cli.many(("check", "bad-1"), ("check", "good-1"), ("check", "good-1", "bad-1"))
    every, every_json, recent = cli.many(
        ("check", "--all"), ("check", "--all", "--json"), ("check", "--all", "--since", "1h")
    )
    from_file, file_json, only_rule = cli.many(
        ("check", "--file", str(file)),
        ("check", "--file", str(file), "--json"),
        ("check", "bad-1", "--rule", "orphan-call"),
    )
    line = "bad-1 6 late-start: tool call 'book' [c1] started after its reply [r1] was interrupted at seq 5"
    assert one_bad.code == 1 and one_bad.out.startswith(line), one_bad
    assert one_bad.out.count("\n") == 1
    assert one_good.code == 0 and one_good.out == "", one_good
    assert "no violations" in one_good.err
    assert both.code == 1 and both.out == one_bad.out, both
    assert every.code == 1 and mine(every.out, "bad-1 ", "good-1 ") == one_bad.out, every
    expected = [
        {
            "session": "bad-1",
            "seq": 6,
            "rule": "late-start",
            "message": one_bad.out.split(": ", 1)[1].strip(),
        }
    ]
    assert every_json.code == 1, every_json
    assert [v for v in every_json.json() if v["session"] in ("bad-1", "good-1")] == expected
    # the events happened in January 2025: neither session had events in the last hour
    assert mine(recent.out, "bad-1 ", "good-1 ") == "", recent
    # a file is checked without a database, with the same lines (the file carries no seq: positions)
    assert from_file.code == 1 and from_file.out == one_bad.out, from_file
    assert file_json.json() == expected
    assert only_rule.code == 0 and only_rule.out == "", only_rule


def test_check_usage_and_input_errors(cli: Cli, tmp_path: Path) -> None:
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_bytes(jsonl(clean_call("x")[:2]) + b'{"session": "x", "type": "tool.result", "data": {}}\n')
    existing = tmp_path / "existing.jsonl"
    existing.write_bytes(jsonl(clean_call("existing")))
    imported = cli("import", str(existing))  # the store exists: a missing session is about the session
    assert imported.code == 0, imported
    commands = [
        ("check",),
        ("check", "a", "--all"),
        ("check", "a", "--since", "1h"),
        ("check", "--all", "--rule", "nope"),
        ("check", "--all", "--stale-after", "soon"),
        ("check", "--all", "--talk-over-ms", "-1"),
        ("check", "no-such-session"),
        ("check", "--file", str(tmp_path / "missing.jsonl")),
        ("check", "--file", str(bad_line)),
        ("check", "--file", str(tmp_path)),
    ]
    results = [r for i in range(0, len(commands), 3) for r in cli.many(*commands[i : i + 3])]
    fragments = [
        ("give SESSION..., --file FILE or --all",),
        ("only one of",),
        ("--since goes with --all",),
        ("unknown rule 'nope'", "orphan-call"),
        ("'soon' is not a duration",),
        ("--talk-over-ms",),
        ("no-such-session",),
        ("missing.jsonl",),
        (f"{bad_line}:3:",),
        ("is a directory",),
    ]
    for result, expected in zip(results, fragments, strict=True):
        assert_error(result, *expected)
        assert result.out == "", result


def test_check_the_demo_call(plain_cli: Cli) -> None:
    demo = plain_cli("demo")
    assert demo.code == 0, demo
    result = plain_cli("check", "--all", "--json")
    assert result.code in (0, 1), result
    for violation in result.json():
        assert set(violation) == {"session", "seq", "rule", "message"}


def test_a_sweep_in_several_processes_reports_the_same(cli: Cli, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    calls = [e for i in range(45) for e in (late_start_call if i % 20 == 7 else clean_call)(f"{run}-{i:02d}")]
    file = tmp_path / "many.jsonl"
    file.write_bytes(jsonl(calls))
    assert cli("import", str(file)).code == 0
    one, two = cli.many(("check", "--all", "-j", "1"), ("check", "--all", "-j", "2"))
    assert one.code == two.code == 1, (one, two)
    assert one.out == two.out
    assert [line.split(" ", 1)[0] for line in mine(one.out, run).splitlines()] == [f"{run}-07", f"{run}-27"]
