"""The API's edges answer in one sentence that says what to do (issue 31): an append of something that
is not an event names what it got; an unknown event type names the nearest one; a relative SQLite path
whose directory is missing says how to write the absolute one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from calltape import CalltapeError, InvalidEvent, make_event, open_store, parse_event
from calltape.eventstore import EventStore

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (
            [{"session": "s", "type": "user.text", "data": {"text": "my card is 4242"}}],
            "item 0 is a dict, not an Event",
        ),
        ("user.text", "takes a list of events and got a str"),
        ({"session": "s"}, "takes a list of events and got a dict"),
    ],
)
async def test_appending_what_is_not_an_event_is_one_sentence(store: EventStore, batch: object, expected: str) -> None:
    before = await store.sessions()  # on PostgreSQL the store holds other tests' calls too
    with pytest.raises(InvalidEvent) as refused:
        await store.append(batch)  # type: ignore[arg-type]
    message = str(refused.value)
    assert expected in message and "\n" not in message
    assert "4242" not in message  # what it got is named by type, never by content
    assert await store.sessions() == before  # nothing was written


async def test_one_event_instead_of_a_list_says_to_wrap_it(store: EventStore) -> None:
    event = make_event("s", "session.started", {"agent": "a"})
    with pytest.raises(InvalidEvent, match=r"got one Event: pass \[event\]"):
        await store.append(event)  # type: ignore[arg-type]
    mixed = [event, ("user.text", {"text": "hi"})]
    with pytest.raises(InvalidEvent, match=r"item 1 is a tuple, not an Event: make it with calltape\.make_event"):
        await store.append(mixed)  # type: ignore[arg-type]
    assert await store.read("s") == []  # all or nothing: the good event was not written either


@pytest.mark.parametrize(
    ("typo", "nearest"),
    [("user.transcrpt", "user.transcript"), ("tool.results", "tool.result"), ("session.start", "session.started")],
)
def test_an_unknown_type_suggests_the_nearest(typo: str, nearest: str) -> None:
    with pytest.raises(InvalidEvent, match=f"did you mean '{nearest}'"):
        make_event("s", typo, {})
    wire = {"session": "s", "type": typo, "at": "2026-11-27T10:00:00Z", "data": {}}
    with pytest.raises(InvalidEvent, match=f"unknown event type '{typo}'.*did you mean '{nearest}'"):
        parse_event(wire)


def test_a_type_far_from_every_type_gets_no_guess() -> None:
    with pytest.raises(InvalidEvent) as refused:
        make_event("s", "weather.report", {})
    assert "did you mean" not in str(refused.value) and "x.<name>" in str(refused.value)


async def test_a_relative_sqlite_path_without_its_directory_says_four_slashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CalltapeError) as refused:
        await open_store("sqlite:///data/calls.db")
    message = str(refused.value)
    assert "relative to the current directory" in message and "sqlite:////data/calls.db" in message
    assert not (tmp_path / "data").exists()  # no stray database made here
    (tmp_path / "data").mkdir()  # a relative path whose directory is there is what it says
    store = await open_store("sqlite:///data/calls.db")
    await store.close()
    assert (tmp_path / "data" / "calls.db").exists()


def test_the_command_line_says_four_slashes_too(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLTAPE_")}
    env["CALLTAPE_HOME"] = str(tmp_path / "home")
    code = "from calltape.cli.app import main; main()"
    (tmp_path / "there").mkdir()
    for url, fragment in [
        ("sqlite:///data/calls.db", "which has no 'data' directory: an absolute path takes four slashes"),
        ("sqlite:///there/calls.db", "a path relative to the current directory (an absolute path takes four"),
    ]:
        done = subprocess.run(
            [sys.executable, "-c", code, "--db", url, "sessions"],
            cwd=tmp_path,
            env={**env, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done
        assert fragment in " ".join(done.stderr.split()), done.stderr
        assert "sqlite:////" in done.stderr
    assert not (tmp_path / "data").exists() and list((tmp_path / "there").iterdir()) == []
