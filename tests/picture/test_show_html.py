"""``calltape show SESSION --html FILE``, run as users run it (the console script, in a subprocess)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import orjson
import pytest
from cli.conftest import Cli, assert_error
from picture_support import HOSTILE, SCRIPT, wire_events


def jsonl(events: list[dict]) -> bytes:  # type: ignore[type-arg]
    return b"".join(orjson.dumps(e) + b"\n" for e in events)


@pytest.fixture
def session(cli: Cli, tmp_path: Path) -> str:
    sid = f"call-{uuid.uuid4().hex[:12]}"
    path = tmp_path / "call.jsonl"
    path.write_bytes(jsonl(wire_events(session=sid)))
    assert cli("import", str(path)).code == 0
    return sid


def test_show_html_writes_one_page(cli: Cli, session: str, tmp_path: Path) -> None:
    page = tmp_path / "call.html"
    written, stdout, upto = cli.many(
        ["show", session, "--html", str(page)],
        ["show", session, "--html", "-"],
        ["show", session, "--html", str(tmp_path / "upto.html"), "--to", "12"],
    )
    assert written.code == 0 and written.out == "", written
    assert f"Wrote the timeline picture to {page}" in written.err
    html = page.read_text()
    assert stdout.code == 0 and stdout.out == html
    assert html.startswith("<!doctype html>") and f"<h1>{session}</h1>" in html
    assert "ended · agent sommelier-2 · epoch 2" in html and f"{len(SCRIPT)} events" in html
    assert "\\u003c/script\\u003e\\u003cscript\\u003ewindow.__pwned" in html and HOSTILE not in html
    assert upto.code == 0
    cut = (tmp_path / "upto.html").read_text()
    assert "sommelier" not in cut.split('id="ct-data"')[1] and "book_table" in cut
    assert f"{len(SCRIPT)} events · shown up to seq 12 ·" in cut


def test_show_html_errors_write_nothing(cli: Cli, session: str, tmp_path: Path) -> None:
    both, nodir, isdir, unknown = cli.many(
        ["show", session, "--html", str(tmp_path / "a.html"), "--json"],
        ["show", session, "--html", str(tmp_path / "missing" / "a.html")],
        ["show", session, "--html", str(tmp_path)],
        ["show", "no-such-call", "--html", str(tmp_path / "b.html")],
    )
    assert_error(both, "--html and --json")
    assert_error(nodir, "does not exist")
    assert_error(isdir, "is a directory")
    assert_error(unknown, "no-such-call")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "home") == ["call.jsonl"]


CARD = "4242 4242 4242 4242"


def _content(page: str) -> str:
    """The page without its layout: pixel offsets and axis ticks are numbers that may hold any digits
    (the redaction marker is stamped now, so a 2025 call's axis runs to today: "left:14242.9px")."""
    page = re.sub(r'<div class="ct-tick"[^>]*>.*?</div>', "", page)
    return re.sub(r' style="[^"]*"', "", page)


def test_a_redacted_call_shows_no_removed_value(cli: Cli, tmp_path: Path) -> None:
    sid = f"call-{uuid.uuid4().hex[:12]}"
    script = [
        (0, "session.started", {"agent": "shop"}),
        (100, "user.transcript", {"text": f"my card is {CARD}", "final": True}),
        (200, "agent.reply.started", {"reply": "r1"}),
        (300, "agent.text", {"reply": "r1", "text": f"Charging {CARD} now, mail to ann@example.com."}),
        (300, "tool.call", {"reply": "r1", "call": "c1", "name": "charge", "arguments": {"card": CARD}}),
        (400, "tool.started", {"call": "c1"}),
        (500, "tool.result", {"call": "c1", "output": {"charged": CARD}}),
        (600, "agent.reply.done", {"reply": "r1"}),
        (700, "interruption", {"reply": "r1", "heard": f"Charging {CARD}"}),
        (800, "session.ended", {}),
    ]
    path = tmp_path / "call.jsonl"
    path.write_bytes(jsonl(wire_events(script, session=sid)))
    assert cli("import", str(path)).code == 0
    before = cli("show", sid, "--html", "-")
    assert "4242" in _content(before.out)  # the check below can fail
    assert cli("redact", sid).code == 0
    after = cli("show", sid, "--html", "-")
    assert after.code == 0, after
    assert "4242" not in _content(after.out) and "ann@example.com" not in after.out
    assert "[card]" in after.out and "redacted" in after.out
