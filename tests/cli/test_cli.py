"""Every command, on SQLite and PostgreSQL, through the installed console script."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest
from sqlalchemy.engine import make_url

from tests.cli.conftest import Cli, assert_error, barge_in_call, jsonl

N = 23  # events in barge_in_call


def _complete(cli: Cli, words: str) -> list[str]:
    """Bash completion through the protocol the installed script speaks (no shell detection, so the
    answer does not depend on which process started the test)."""
    env = {
        **cli.env,
        "_CALLTAPE_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - 1),
    }
    proc = subprocess.run([cli.exe], capture_output=True, env=env, timeout=60)
    assert proc.returncode == 0, proc
    return proc.stdout.decode().split()


def test_help_and_completion(plain_cli: Cli) -> None:
    root, bare, diff = plain_cli.many(["--help"], [], ["diff", "--help"])
    for result in (root, bare, diff):
        assert result.code == 0, result
    for command in ("import", "export", "sessions", "show", "context", "diff", "replay", "tail", "resume", "demo"):
        assert command in root.out
    assert "CALLTAPE_DATABASE_URL" in root.out and "Exit status" in root.out
    assert "Usage: calltape" in bare.out
    assert "--vs-at" in diff.out and "Like diff(1)" in diff.out
    env = {**plain_cli.env, "_CALLTAPE_COMPLETE": "source_bash"}
    script = subprocess.run([plain_cli.exe], capture_output=True, env=env, timeout=60)
    assert script.returncode == 0 and b"_calltape_completion" in script.stdout, script
    assert _complete(plain_cli, "calltape con") == ["context"]
    assert _complete(plain_cli, "calltape context s --format o") == ["openai"]
    assert _complete(plain_cli, "calltape sessions --status d") == ["dropped"]


def test_log_and_inspect(cli: Cli, store_url: str, tmp_path: Path, session_id: str) -> None:
    s = session_id
    call = tmp_path / "call.jsonl"
    call.write_bytes(jsonl(barge_in_call(s)))
    # id-less events get deterministic ids, so re-importing them is a no-op too
    extra = tmp_path / "extra.jsonl"
    extra.write_bytes(
        jsonl(
            [
                {"session": f"{s}-b", "type": "session.started", "at": "2025-01-31T10:00:00Z", "data": {"agent": "x"}},
                {"session": f"{s}-b", "type": "user.text", "at": "2025-01-31T10:00:01Z", "data": {"text": "hi"}},
                {"session": f"{s}-b", "type": "x.note", "data": {"any": "thing"}},
            ]
        )
        + b"\n"
    )
    first = cli("import", str(call), "-", input=extra.read_bytes())
    assert first.code == 0 and f"Imported {N + 3} new events into 2 sessions" in first.out, first

    exported, listed, show_json, ctx_offset, ctx_time, diff_at, replay = cli.many(
        ["export", s],
        ["sessions", "--json", "--agent", "triage", "--status", "dropped", "--since", "2025-01-31", "--sort", "events"],
        ["show", s, "--json"],
        ["context", s, "--at", "+4.6"],
        ["context", s, "--at", "2025-01-31T09:30:02.550Z", "--format", "openai"],
        ["diff", s, "--at", "8", "--vs-at", "15", "--json"],
        ["replay", s, "--into", f"{s}-copy", "--to", "15"],
    )
    # export: JSONL of the stored events (store seqs: the file's seq 99 was ignored)
    assert exported.code == 0, exported
    lines = exported.lines()
    assert [e["seq"] for e in lines] == list(range(1, N + 1))
    assert [(e["id"], e["type"]) for e in lines] == [(e["id"], e["type"]) for e in barge_in_call(s)]
    assert lines[0]["data"]["modality"] == "voice" and lines[5]["data"]["text"].startswith("Sure, let me book")

    assert listed.code == 0, listed
    row = next(r for r in listed.json() if r["session"] == s)
    assert row["status"] == "dropped" and row["events"] == N and row["tenant"] is None and row["agent"] == "triage"
    assert row["first_at"] == "2025-01-31T09:30:00.000Z"

    # show --json: heard vs generated, tool outcome + duration, late result, clean points, drop
    timeline = show_json.json()
    tools = {t["call_id"]: t for t in timeline["tools"]}
    assert tools["c1"]["status"] == "completed" and tools["c1"]["late"] and tools["c1"]["duration_ms"] == 2300
    assert tools["c2"]["status"] == "in_progress" and tools["c2"]["late"] is None
    r1 = next(r for r in timeline["replies"] if r["reply"] == "r1")
    assert r1["heard"] == "Sure, let me book" and r1["interrupted"]
    assert r1["generated"] == "Sure, let me book two at eight for you."
    assert timeline["summary"]["last_clean_seq"] == 15 and timeline["summary"]["drops"] == 1
    assert [r["seq"] for r in timeline["rows"] if r["clean"]][-1] == 15

    # context --at: an offset from the start and a wall-clock time (resolved by the store)
    native = ctx_offset.json()
    assert native["seq"] == 14 and native["session"] == s, ctx_offset
    assert [i["content"] for i in native["items"] if i.get("role") == "user"][-1] == "actually make it three"
    messages = ctx_time.json()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"], ctx_time
    assert messages[2]["tool_calls"][0]["id"] == "c1"
    assert orjson.loads(messages[3]["content"]) == {"status": "in_progress"}

    # diff of one session at two instants: exit 1, item by item, summary
    assert diff_at.code == 1, diff_at
    result = diff_at.json()
    assert result["same"] is False and result["summary"]["interruptions"] == [0, 1]
    changed = [r for r in result["items"] if r["op"] == "~"]
    assert {"role": "assistant", "content": "Sure, let me book", "interrupted": True, "type": "message"} in [
        r["b"] for r in changed
    ]

    assert replay.code == 0 and f"Replayed 15 events of '{s}' into '{s}-copy'" in replay.out, replay
    again, same, replay_again = cli.many(
        ["import", str(call), str(extra)],
        ["diff", s, f"{s}-copy", "--at", "15", "--json"],
        ["replay", s, "--into", f"{s}-copy"],
    )
    assert again.code == 0 and "Imported 0 new events" in again.out and f"({N + 3} already stored)" in again.out, again
    assert same.code == 0 and same.json()["same"] is True, same
    assert_error(replay_again, f"session '{s}-copy' already has 15 events")

    if store_url.startswith("postgresql"):
        # export -> import into an empty store reproduces the session (here PostgreSQL -> SQLite)
        empty = Cli(tmp_path / "empty-home", f"sqlite:///{tmp_path}/empty.db")
        assert empty("import", "-", input=exported.out.encode()).code == 0
        assert empty("export", s).lines() == lines


def test_rendering_on_the_embedded_default(plain_cli: Cli, tmp_path: Path) -> None:
    s = "call-render"
    call = tmp_path / "call.jsonl"
    call.write_bytes(jsonl(barge_in_call(s)))
    assert plain_cli("import", str(call)).code == 0
    show, table, anthropic, diff, replay = plain_cli.many(
        ["show", s],
        ["sessions", "--agent", "triage", "--limit", "0", "--asc"],
        ["context", s, "-f", "anthropic"],
        ["diff", s, "--at", "8", "--vs-at", "15"],
        ["replay", s, "--into", "call-render-2"],
    )
    assert show.code == 0, show
    for fragment in (
        "'Book a table for two at eight'",
        "Sure, let me book two at eight for you.",
        "heard: 'Sure, let me book'",
        "barge-in (user_speech)",
        "book_table [c1] → completed in 2.3s",
        "LATE after the barge-in at seq 12",
        "update_booking [c2] … asked for 3 seats",
        "call dropped (agent crashed)",
        "last clean point: seq 15",
        "✓",
    ):
        assert fragment in show.out, (fragment, show)
    assert table.code == 0 and s in table.out and "SESSION" in table.out and "dropped" in table.out, table
    body = anthropic.json()
    assert body["system"] == "You book tables." and body["messages"][0]["role"] == "user", anthropic
    assert diff.code == 1 and "assistant: 'Sure, let me book' (interrupted)" in diff.out, diff
    assert "The contexts differ" in diff.out and "interruptions" in diff.out
    assert replay.code == 0
    totals = plain_cli("stats", "--json")
    assert totals.code == 0 and totals.json()["sessions"] == 2 and totals.json()["drops"] == 2, totals


def test_usage_errors(plain_cli: Cli, tmp_path: Path) -> None:
    s = "call-errors"
    good = tmp_path / "good.jsonl"
    good.write_bytes(jsonl(barge_in_call(s)))
    assert plain_cli("import", str(good)).code == 0
    results = plain_cli.many(
        ["import", str(tmp_path / "missing.jsonl")],
        ["context", s, "--at", "yesterday"],
        ["context", s, "--at", "0"],
        ["context", s, "--format", "xml"],
        ["resume", s, "--agent", "b", "--format", "xml"],
        ["diff", s],
        ["sessions", "--status", "sleeping"],
        ["sessions", "--since", "last tuesday"],
        ["tail", "--from", "soon"],
        ["frobnicate"],
        ["replay", s, "--into", s],
    )
    missing, at_word, at_zero, fmt, resume_fmt, diff_one, status, since, tail_from, unknown_cmd, replay_self = results
    assert_error(missing, "cannot read", "missing.jsonl")
    assert_error(at_word, "'yesterday' is not an instant")
    assert_error(at_zero, "seqs start at 1")
    assert_error(fmt, "unknown context format 'xml'")
    assert_error(resume_fmt, "unknown context format 'xml'")
    assert_error(diff_one, "give a second session, or --vs-at")
    assert_error(status, "'sleeping' is not one of: active, ended, dropped")
    assert_error(since, "--since 'last tuesday' is not a time")
    assert_error(tail_from, "'soon' is not a feed position")
    assert_error(unknown_cmd, "no such command 'frobnicate'")
    assert_error(replay_self, "--into must name a new session")


def test_store_errors(cli: Cli, tmp_path: Path, session_id: str) -> None:
    s = session_id
    good = tmp_path / "good.jsonl"
    good.write_bytes(jsonl(barge_in_call(s)))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(
        jsonl([{"session": f"{s}-bad", "type": "user.text", "data": {"text": "fine"}}])
        + b"{not json\n\n"
        + jsonl([{"session": f"{s}-bad", "type": "agent.sing", "data": {}}])
        + jsonl([{"session": f"{s}-bad", "type": "tool.call", "data": {"call": "c", "name": "n"}}])
    )
    assert cli("db", "upgrade").code == 0  # the store exists (the failed import creates nothing)
    imp, show = cli.many(["import", str(good), str(bad)], ["show", f"{s}-nope"])
    assert_error(imp, "nothing was imported: 3 invalid lines")
    assert f"{bad}:2: not valid JSON" in imp.err
    assert f"{bad}:4: unknown event type 'agent.sing'" in imp.err
    assert f"{bad}:5: tool.call: 'data.arguments' is missing" in imp.err
    assert str(good) not in imp.err
    assert_error(show, f"there is no session '{s}-nope'")
    # nothing was written: neither the good file nor the bad file's valid first line
    listed = cli("sessions", "--json", "--limit", "0")
    assert {s, f"{s}-bad"}.isdisjoint(r["session"] for r in listed.json()), listed


async def _create_database(admin_url: str) -> str:
    import asyncpg

    name = f"calltape_cli_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(make_url(admin_url).set(drivername="postgresql").render_as_string(False))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


async def _drop_database(admin_url: str, url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(make_url(admin_url).set(drivername="postgresql").render_as_string(False))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.mark.postgres
def test_database_errors_and_upgrade(pg_admin_url: str, plain_cli: Cli, tmp_path: Path) -> None:
    fresh = asyncio.run(_create_database(pg_admin_url))
    try:
        unreachable, outdated, scheme = plain_cli.many(
            ["--db", "postgresql://postgres@127.0.0.1:1/x", "sessions"],
            ["--db", fresh, "context", "any", "--json"],
            ["--db", "mysql://db/x", "sessions"],
        )
        assert_error(unreachable, "cannot reach the PostgreSQL at 127.0.0.1:1/x")
        assert_error(outdated, "has no calltape schema; run `calltape db upgrade`")
        assert_error(scheme, "PostgreSQL or SQLite, not 'mysql'")
        up = plain_cli("--db", fresh, "db", "upgrade")
        assert up.code == 0 and "Upgraded the PostgreSQL" in up.out, up
        # $CALLTAPE_DATABASE_URL is used when --db is not given; the embedded default otherwise
        env_cli = Cli(tmp_path / "home2")
        env_cli.env["CALLTAPE_DATABASE_URL"] = fresh
        again, by_env = env_cli.many(["db", "upgrade"], ["db", "info"])
        assert again.code == 0 and "already at schema revision" in again.out, again
        assert by_env.code == 0 and "PostgreSQL" in by_env.out and "0 sessions" in by_env.out, by_env
        # the embedded default is named, and a read command does not create it
        by_default = Cli(tmp_path / "home3")("db", "info", "--json")
        assert_error(by_default, f"there is no calltape database yet at '{tmp_path / 'home3' / 'calltape.db'}'")
        assert not (tmp_path / "home3").exists()
    finally:
        asyncio.run(_drop_database(pg_admin_url, fresh))


def _read_until(stream: object, count: int, timeout: float = 20.0) -> list[bytes]:
    lines: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(lines) < count and time.monotonic() < deadline:
        line = stream.readline()  # type: ignore[attr-defined]
        if not line:
            break
        lines.append(line)
    return lines


def test_tail(cli: Cli, tmp_path: Path, session_id: str) -> None:
    s = session_id
    call = tmp_path / "call.jsonl"
    call.write_bytes(jsonl(barge_in_call(s)[:5]))
    assert cli("import", str(call)).code == 0
    history = cli.popen("tail", s, "--from", "0", "--json")
    live = cli.popen("tail", s)
    try:
        assert live.stderr is not None and b"Following session" in live.stderr.readline()
        replayed = [orjson.loads(line) for line in _read_until(history.stdout, 5)]
        assert [e["seq"] for e in replayed] == [1, 2, 3, 4, 5] and all("position" in e for e in replayed)
        call.write_bytes(jsonl(barge_in_call(s)[5:8]))
        assert cli("import", str(call)).code == 0
        new = _read_until(live.stdout, 3)
        assert [f"#{n} ".encode() in line for n, line in zip((6, 7, 8), new, strict=True)] == [True] * 3, new
        assert b"tool.call" in new[1] and s.encode() not in new[0], new
        assert [orjson.loads(line)["seq"] for line in _read_until(history.stdout, 3)] == [6, 7, 8]
        # resuming from a printed position neither misses nor repeats an event
        after = cli.popen("tail", s, "--from", replayed[-1]["position"], "--json")
        assert [orjson.loads(line)["seq"] for line in _read_until(after.stdout, 3)] == [6, 7, 8]
        after.send_signal(signal.SIGTERM)
        assert after.wait(10) == 0
    finally:
        history.send_signal(signal.SIGINT)
        live.send_signal(signal.SIGTERM)
        codes = history.wait(10), live.wait(10)
    assert codes == (0, 0)
    for proc in (history, live):
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()


def test_resume_and_stats(cli: Cli, tmp_path: Path, session_id: str) -> None:
    s = session_id
    call = tmp_path / "call.jsonl"
    call.write_bytes(jsonl(barge_in_call(s)))
    assert cli("import", str(call)).code == 0
    dry, dry_retry = cli.many(
        ["resume", s, "--agent", "booker", "--dry-run", "--format", "openai"],
        ["resume", s, "--agent", "booker", "--dry-run", "--idempotent", "update_booking"],
    )
    plan = dry.json()
    assert plan["checkpoint_seq"] == 15 and plan["epoch"] == 2 and plan["agent"] == "booker", dry
    assert plan["resumed_at_seq"] > N
    assert [(t["call_id"], t["decision"]) for t in plan["tools"]] == [("c2", "unknown")]
    assert plan["tools"][0]["progress"] == {"step": "requested"}
    assert plan["context"][0] == {"role": "system", "content": "You book tables."}  # openai format
    assert [(t["call_id"], t["decision"]) for t in dry_retry.json()["tools"]] == [("c2", "retry")]

    real = cli("resume", s, "--agent", "booker")
    assert real.code == 0 and real.json()["epoch"] == 2, real
    zombie = tmp_path / "zombie.jsonl"
    zombie.write_bytes(
        jsonl([{"session": s, "type": "tool.result", "epoch": 1, "data": {"call": "c2", "output": {"ok": True}}}])
    )
    fenced, stats, again, refused = cli.many(
        ["import", str(zombie)],
        ["stats", s, "--json"],
        ["resume", s, "--agent", "other", "--dry-run", "--take-over"],
        ["resume", s, "--agent", "other"],
    )
    assert_error(refused, f"session '{s}' was already resumed by agent 'booker' (epoch 2)", "--take-over")
    assert_error(
        fenced, f"{zombie}:1: the store refused this event", "is at epoch 2; a write with epoch 1 was rejected"
    )
    assert "nothing was imported" in fenced.err
    figures = stats.json()
    assert figures["resumes"] == 1 and figures["drops"] == 1 and figures["events"] == real.json()["resumed_at_seq"] + 1
    assert figures["tools"]["outcomes"] == {"completed": 1, "unknown": 1}
    assert again.json()["epoch"] == 3 and again.json()["tools"] == []


def test_demo(plain_cli: Cli) -> None:
    started = time.monotonic()
    demo = plain_cli("demo")
    assert demo.code == 0, demo
    assert time.monotonic() - started < 15
    for fragment in ("naive in-memory history", "calltape context", "decision 'unknown'", "fenced:", "BK-1042"):
        assert fragment in demo.out, (fragment, demo)
    commands = [line.split("  ")[0].split() for line in demo.out.splitlines() if line.startswith("calltape ")]
    assert [c[1] for c in commands] == ["show", "context", "diff", "stats"], demo.out
    show, context, diff, stats = plain_cli.many(*(c[1:] for c in commands))
    assert show.code == 0 and "LATE" in show.out and "resumed by concierge-v2" in show.out, show
    assert context.code == 0 and any(m.get("role") == "tool" for m in context.json()), context
    assert diff.code == 1 and "The contexts differ" in diff.out, diff
    assert stats.code == 0 and "late_result" in stats.out, stats


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_serve(plain_cli: Cli) -> None:
    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    port = _free_port()
    server = plain_cli.popen("serve", "--port", str(port), "--log-level", "warning")
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "calltape serve did not start"
                time.sleep(0.1)
    finally:
        server.send_signal(signal.SIGINT)
        code = server.wait(10)
    assert code == 0
