"""``calltape import`` is fenced like any writer (issue 16): an imported event without an epoch holds the
epoch its own file established for its session (1, raised by a ``session.resumed`` in the file), so a
late file cannot write into a call resumed since; ``--allow-after-resume`` is the explicit opt-out, and
export → import still reproduces a resumed call."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import Cli, assert_error, at, barge_in_call, jsonl

LATE = 11


def test_an_import_into_a_resumed_call_is_refused(cli: Cli, tmp_path: Path, session_id: str) -> None:
    call = barge_in_call(session_id)
    original = tmp_path / "call.jsonl"
    original.write_bytes(jsonl(call))
    assert cli("import", str(original)).code == 0
    late = [
        {
            "id": f"{session_id}-late{k}",
            "session": session_id,
            "type": "user.text",
            "at": at(7000 + k),
            "data": {"text": f"late {k}"},
        }
        for k in range(LATE)
    ]
    late_file = tmp_path / "late.jsonl"
    late_file.write_bytes(jsonl(late))
    resumed = cli("resume", session_id, "--agent", "rescue")
    assert resumed.code == 0, resumed
    before = cli("export", session_id).lines()

    refused = cli("import", str(late_file))
    assert_error(refused, f"{late_file.name}:1:", f"session '{session_id}' was resumed", "--allow-after-resume")
    assert "nothing was imported" in refused.err
    assert cli("export", session_id).lines() == before  # none of the 11 got in

    # the file imported before the resume is all stored: re-importing it adds nothing and is not refused
    again = cli("import", str(original), "--json")
    assert again.code == 0 and again.json()["imported"] == 0, again

    # the resumed call round-trips: the file's own session.resumed raises the epoch its events hold
    exported = tmp_path / "resumed.jsonl"
    exported.write_bytes(cli("export", session_id).out.encode())
    fresh = Cli(tmp_path / "home2", f"sqlite:///{tmp_path}/fresh.db")
    assert fresh("import", str(exported)).code == 0
    strip = [{k: v for k, v in e.items() if k != "seq"} for e in before]
    assert [{k: v for k, v in e.items() if k != "seq"} for e in fresh("export", session_id).lines()] == strip

    # the explicit opt-out
    forced = cli("import", str(late_file), "--allow-after-resume", "--json")
    assert forced.code == 0 and forced.json()["imported"] == LATE, forced
    assert len(cli("export", session_id).lines()) == len(before) + LATE


def test_a_file_that_carries_the_resume_may_continue_the_call(cli: Cli, tmp_path: Path, session_id: str) -> None:
    """Before the resume, after it: the events after the file's session.resumed hold the new epoch."""
    call = barge_in_call(session_id)
    resumed = {
        "id": f"{session_id}-resumed",
        "session": session_id,
        "type": "session.resumed",
        "at": at(9000),
        "epoch": 2,
        "data": {"agent": "rescue", "epoch": 2, "from_seq": len(call)},
    }
    after = {
        "id": f"{session_id}-after",
        "session": session_id,
        "type": "user.text",
        "at": at(9100),
        "data": {"text": "hi"},
    }
    path = tmp_path / "whole.jsonl"
    path.write_bytes(jsonl([*call, resumed, after]))
    done = cli("import", str(path), "--json")
    assert done.code == 0 and done.json()["imported"] == len(call) + 2, done
    # a second file with only the tail, no resume of its own: it holds epoch 1, the call is at 2
    tail = tmp_path / "tail.jsonl"
    tail.write_bytes(jsonl([after | {"id": f"{session_id}-after2"}]))
    assert_error(cli("import", str(tail)), f"session '{session_id}' was resumed")
