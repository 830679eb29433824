"""``calltape import``: all or nothing at any size on both backends, gzip, the quick re-import, and
progress only on a terminal."""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from calltape.cli.reading import CHILD_READER_BYTES
from tests.cli.conftest import Cli, Result, assert_error, barge_in_call, jsonl

N = 23  # events in barge_in_call


def _many_sessions(prefix: str, sessions: int) -> list[dict[str, Any]]:
    return [e for i in range(sessions) for e in barge_in_call(f"{prefix}-{i:03d}")]


def _listed(cli: Cli, prefix: str) -> set[str]:
    rows = cli("sessions", "--json", "--limit", "0").json()
    return {r["session"] for r in rows if r["session"].startswith(prefix)}


def test_a_late_bad_line_writes_nothing(cli: Cli, tmp_path: Path, session_id: str) -> None:
    # 3,450 valid events (more than one write batch) and then one the store refuses, and in a second
    # file 2,300 valid events followed by a line that is not an event: in both cases nothing at all
    events = _many_sessions(session_id, 150)
    refused = tmp_path / "refused.jsonl"
    again = dict(events[0], id=f"{session_id}-again")  # a second session.started of a stored session
    refused.write_bytes(jsonl([*events, again]))
    invalid = tmp_path / "invalid.jsonl"
    invalid.write_bytes(
        jsonl(events[:2300]) + b'{"session": "x", "type": "user.text", "data": {"text": "a\\u0000b"}}\n'
    )
    first, second = cli("import", str(refused), "--batch", "1000"), cli("import", str(invalid), "--batch", "1000")
    assert_error(first, f"{refused}:{len(events) + 1}: the store refused this event", "has already started")
    assert "nothing was imported" in first.err
    assert_error(second, "nothing was imported: 1 invalid line")
    assert f"{invalid}:2301:" in second.err and "NUL" in second.err, second
    assert _listed(cli, session_id) == set()
    # the valid part alone goes in, all of it
    good = tmp_path / "good.jsonl"
    good.write_bytes(jsonl(events))
    done = cli("import", str(good), "--json", "--batch", "1000")
    assert done.code == 0 and done.json() == {
        "imported": len(events),
        "skipped": 0,
        "sessions": 150,
        "lines": len(events),
    }
    assert len(_listed(cli, session_id)) == 150


def test_a_large_file_is_read_in_a_second_process(cli: Cli, tmp_path: Path, session_id: str) -> None:
    # Over CHILD_READER_BYTES: a second process reads and checks while the command stores. All or
    # nothing and FILE:LINE hold the same there: an invalid line after many valid batches, an event
    # the store refuses at the very end, then the valid part, all of it
    events = _many_sessions(session_id, 1100)
    body = jsonl(events)
    assert len(body) >= CHILD_READER_BYTES
    invalid, refused, good = tmp_path / "invalid.jsonl", tmp_path / "refused.jsonl", tmp_path / "good.jsonl"
    invalid.write_bytes(body + b'{"session": "x", "type": "user.text", "data": {"text": 1}}\n')
    refused.write_bytes(body + jsonl([dict(events[0], id=f"{session_id}-again")]))
    good.write_bytes(body)
    bad_line = cli("import", str(invalid), "--batch", "2000")
    assert_error(bad_line, "nothing was imported: 1 invalid line")
    assert f"{invalid}:{len(events) + 1}:" in bad_line.err, bad_line
    stale = cli("import", str(refused), "--batch", "2000")
    assert_error(stale, f"{refused}:{len(events) + 1}: the store refused this event", "has already started")
    assert _listed(cli, session_id) == set()
    done = cli("import", str(good), "--json")
    assert done.code == 0 and done.json() == {
        "imported": len(events),
        "skipped": 0,
        "sessions": 1100,
        "lines": len(events),
    }
    exported = cli("export", f"{session_id}-000", f"{session_id}-1099")
    assert [e["id"] for e in exported.lines()] == [e["id"] for e in events[:N] + events[-N:]], exported
    assert [e["seq"] for e in exported.lines()] == list(range(1, N + 1)) * 2


def test_gzip_and_quick_reimport(cli: Cli, tmp_path: Path, session_id: str) -> None:
    events = _many_sessions(session_id, 3)
    packed = tmp_path / "calls.jsonl.gz"
    packed.write_bytes(gzip.compress(jsonl(events)))
    first = cli("import", str(packed), "--json")
    assert first.code == 0 and first.json()["imported"] == 3 * N, first
    # standard input may be gzip too
    piped = cli("import", "-", "--json", input=gzip.compress(jsonl(events)))
    assert piped.code == 0 and piped.json() == {"imported": 0, "skipped": 3 * N, "sessions": 3, "lines": 3 * N}, piped
    # the file again: recognised as stored, nothing written
    again = cli("import", str(packed))
    assert again.code == 0 and f"Imported 0 new events into 3 sessions ({3 * N} already stored)" in again.out, again
    # one new event in an otherwise stored file: the real import runs and adds exactly it
    extra = dict(events[-1], id=f"{session_id}-late", type="x.note", data={"n": 1})
    grown = tmp_path / "grown.jsonl"
    grown.write_bytes(jsonl([*events, extra]))
    more = cli("import", str(grown), "--json")
    assert more.code == 0 and more.json()["imported"] == 1 and more.json()["skipped"] == 3 * N, more
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(jsonl(events))[:-20])
    assert_error(cli("import", str(broken)), f"cannot read '{broken}'")


def test_progress_on_a_terminal_only(plain_cli: Cli, tmp_path: Path) -> None:
    events = _many_sessions("call-progress", 40)
    path = tmp_path / "calls.jsonl"
    path.write_bytes(jsonl(events))
    piped = plain_cli("import", str(path))
    assert piped.code == 0 and piped.err == "", piped
    # stderr on a pseudo-terminal: rich draws the bar there (stdout stays plain)
    exported = tmp_path / "export.jsonl"
    with exported.open("wb") as sink:
        proc, drawn = plain_cli.on_terminal("export", "--all", stdout=sink)
    assert proc.returncode == 0
    assert b"exporting" in drawn, drawn
    lines = [orjson.loads(line) for line in exported.read_bytes().splitlines()]
    assert len(lines) == len(events) and b"\x1b" not in exported.read_bytes()


def test_export_many_sessions(cli: Cli, tmp_path: Path, session_id: str) -> None:
    events = _many_sessions(session_id, 4)
    path = tmp_path / "calls.jsonl"
    path.write_bytes(jsonl(events))
    assert cli("import", str(path)).code == 0
    listed = tmp_path / "ids.txt"
    listed.write_text(f"# two of them\n{session_id}-001\n\n{session_id}-003\n")
    two, from_file, everything, recent, old, both, to_many, missing = cli.many(
        ["export", f"{session_id}-000", f"{session_id}-002"],
        ["export", "--session-file", str(listed)],
        ["export", "--all"],
        ["export", "--all", "--since", "1h"],
        ["export", "--all", "--since", "2025-01-01"],
        ["export", f"{session_id}-000", "--all"],
        ["export", f"{session_id}-000", f"{session_id}-001", "--to", "3"],
        ["export", f"{session_id}-000", "nosuch"],
    )
    assert [e["session"] for e in two.lines()] == [f"{session_id}-000"] * N + [f"{session_id}-002"] * N, two
    assert {e["session"] for e in from_file.lines()} == {f"{session_id}-001", f"{session_id}-003"}, from_file
    assert {e["id"] for e in events} <= {e["id"] for e in everything.lines()}, everything
    assert recent.code == 0 and not any(e["session"].startswith(session_id) for e in recent.lines()), recent
    assert {e["id"] for e in events} <= {e["id"] for e in old.lines()}, old
    assert_error(both, "give sessions or --all, not both")
    assert_error(to_many, "--to needs exactly one session")
    assert_error(missing, "there is no session 'nosuch'")
    assert missing.out == ""


def _child_of(pid: int, timeout: float = 60) -> int:
    """The first child process of ``pid`` (Linux), waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.002)
    raise AssertionError(f"process {pid} started no child within {timeout} s")


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the reader process through /proc")
def test_an_import_whose_reader_process_dies_says_so_and_writes_nothing(
    cli: Cli, tmp_path: Path, session_id: str
) -> None:
    # The second process reading a large file is killed as soon as it starts (it would take a second or
    # more to read this file): the import ends in one sentence, and nothing is written.
    events = _many_sessions(session_id, 3300)
    body = jsonl(events)
    assert len(body) >= 3 * CHILD_READER_BYTES
    path = tmp_path / "large.jsonl"
    path.write_bytes(body)
    proc = cli.popen("import", str(path))
    os.kill(_child_of(proc.pid), signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert_error(
        Result(("import",), proc.returncode, out.decode(), err.decode()), "reader process stopped unexpectedly"
    )
    assert _listed(cli, session_id) == set()


def test_lines_without_an_id_are_counted_under_a_digest_and_keep_their_ids() -> None:
    """Issue 26 item 15: the count of each line without an id (its deterministic id's occurrence number)
    was kept under the line's whole canonical JSON, so a million such events peaked at 4.1 GB. It is
    kept under a 16-byte digest; the ids stay what they were (a file imported before re-imports as a no-op)."""
    import sys

    from calltape.cli.reading import LineParser

    parser = LineParser()
    lines = [
        orjson.dumps({"session": "s1", "type": "user.text", "data": {"text": f"{i:04d} " + "word " * 2000}})
        for i in range(300)
    ]
    assert len({parser.parse(line).id for line in lines}) == len(lines)
    assert sum(sys.getsizeof(k) for k in parser.occurrences) < 100 * len(lines)  # not 10 KB a line
    pinned = b'{"session":"s1","type":"user.text","at":"2025-01-31T09:30:00.000Z","data":{"text":"hello"}}'
    again = LineParser()
    assert [again.parse(pinned).id for _ in range(2)] == [  # the ids calltape 0.x gave this line, twice
        "f600e54a-24e2-5bfc-9730-defee4d2d530",
        "7ea6c608-1c12-5cbc-b436-a809cb03b356",
    ]
