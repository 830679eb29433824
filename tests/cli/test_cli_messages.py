"""What the command line says back: user data printed as itself, one sentence per failure a user can
cause (naming the fix), read commands that create nothing, and the small conveniences (``--version``,
global options after the command, whole session ids, ``--at`` past the end, counts as JSON)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from sqlalchemy.engine import make_url

from calltape.extras import EXTRAS, MissingExtra, requires_extra
from tests.cli.conftest import Cli, assert_error, barge_in_call, jsonl
from tests.cli.test_cli import _create_database, _drop_database

N = 23  # events in barge_in_call


def test_user_data_is_never_markup(cli: Cli, tmp_path: Path) -> None:
    # rich would read "[/x]" as a closing tag (MarkupError) and "[bold]" as a style: neither may happen
    s = "call[/x][bold]"
    events = barge_in_call(s)
    events[0]["data"]["agent"] = "[red]agent[/x]"
    call = tmp_path / "call.jsonl"
    call.write_bytes(jsonl(events))
    assert cli("import", str(call)).code == 0
    results = cli.many(  # --limit 0: the PostgreSQL test database holds every other test's sessions too
        ["sessions", "--limit", "0"],
        ["sessions", "--json", "--limit", "0"],
        ["stats"],
        ["stats", s],
        ["show", s],
        ["diff", s, "--at", "8", "--vs-at", "15"],
        ["export", "nosuch[/x]"],
        ["show", "[bold]nosuch"],
        ["context", s, "--format", "[/x]"],
    )
    table, listed, totals, one, show, diff, export, show_missing, bad_format = results
    for result in (table, totals, one, show):
        assert result.code == 0 and "Traceback" not in result.err, result
    assert s in table.out and "[red]agent[/x]" in table.out, table
    assert [r["agent"] for r in listed.json() if r["session"] == s] == ["[red]agent[/x]"], listed
    assert "sessions" in totals.out and s in one.out, (totals, one)
    assert s in show.out and "[red]agent[/x]" in show.out, show
    assert diff.code == 1 and s in diff.out, diff
    assert_error(export, "there is no session 'nosuch[/x]'")
    assert_error(show_missing, "there is no session '[bold]nosuch'")
    assert_error(bad_format, "unknown context format '[/x]'")
    assert len(export.err.strip().splitlines()) == 1


def _blocker(tmp_path: Path, *modules: str) -> Path:
    """A directory that, first on PYTHONPATH, makes ``modules`` look uninstalled."""
    root = tmp_path / "blocked"
    for module in modules:
        package = root / module
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n"
        )
    return root


def test_missing_extra_is_one_literal_sentence(plain_cli: Cli, tmp_path: Path) -> None:
    plain_cli.env["PYTHONPATH"] = str(_blocker(tmp_path, "uvicorn"))
    serve = plain_cli("serve", "--port", "1")
    assert_error(serve, "calltape serve", "needs the 'serve' extra (uvicorn is not installed)")
    assert "pip install 'calltape[serve]'" in serve.err, serve  # "[serve]" is not eaten as markup


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_every_extra_gets_the_same_sentence(extra: str) -> None:
    with pytest.raises(MissingExtra) as caught, requires_extra(extra):
        raise ModuleNotFoundError("No module named 'somelib.sub'", name="somelib.sub")
    assert str(caught.value) == (
        f"{EXTRAS[extra]} needs the '{extra}' extra (somelib is not installed): pip install 'calltape[{extra}]'"
    )
    assert isinstance(caught.value, ImportError)
    # an import error inside calltape itself is a bug, not a missing extra: it stays as it is
    with pytest.raises(ModuleNotFoundError) as own, requires_extra(extra):
        raise ModuleNotFoundError("No module named 'calltape.nothing'", name="calltape.nothing")
    assert not isinstance(own.value, MissingExtra)


def test_version_and_global_options_after_the_command(cli: Cli, store_url: str, tmp_path: Path) -> None:
    call = tmp_path / "call.jsonl"
    call.write_bytes(jsonl(barge_in_call("call-global")))
    version, imported = cli.many(["--version"], ["import", str(call), "--json"])
    from importlib.metadata import version as installed

    assert version.code == 0 and version.out.strip() == f"calltape {installed('calltape')}", version
    assert imported.code == 0 and imported.json()["imported"] == N, imported
    after, equals, middle = cli.many(
        ["sessions", "--json", "--db", store_url, "--limit", "0"],
        ["sessions", f"--db={store_url}", "--json", "--limit", "0"],
        ["context", "--db", store_url, "call-global", "--at", "3"],
        db=False,
    )
    for result in (after, equals):
        assert result.code == 0 and "call-global" in {r["session"] for r in result.json()}, result
    assert middle.code == 0 and middle.json()["seq"] == 3, middle


def test_whole_session_ids_on_a_narrow_terminal(plain_cli: Cli, tmp_path: Path) -> None:
    long_id = "call-" + "0123456789abcdef" * 5
    call = tmp_path / "call.jsonl"
    call.write_bytes(jsonl(barge_in_call(long_id)))
    assert plain_cli("import", str(call)).code == 0
    plain_cli.env["COLUMNS"] = "40"
    narrow = plain_cli("sessions")
    assert narrow.code == 0, narrow
    assert any(line.startswith(long_id + " ") for line in narrow.out.splitlines()), narrow
    del plain_cli.env["COLUMNS"]
    piped = plain_cli("sessions")
    assert any(line.startswith(long_id + " ") for line in piped.out.splitlines()), piped


def test_seq_past_the_end_says_so(cli: Cli, tmp_path: Path, session_id: str) -> None:
    s = session_id
    call = tmp_path / "call.jsonl"
    call.write_bytes(jsonl(barge_in_call(s)))
    assert cli("import", str(call)).code == 0
    at, vs_at, show_to, replay_to, last, replay = cli.many(
        ["context", s, "--at", "999"],
        ["diff", s, "--at", "3", "--vs-at", "24"],
        ["show", s, "--to", "30"],
        ["replay", s, "--into", f"{s}-x", "--to", "24"],
        ["context", s, "--at", str(N)],
        ["replay", s, "--into", f"{s}-y", "--to", "5", "--json"],
    )
    assert_error(at, f"--at 999 is past the end of session '{s}', which has {N} events (seqs 1 to {N})")
    assert_error(vs_at, "--vs-at 24 is past the end")
    assert_error(show_to, "--to 30 is past the end")
    assert_error(replay_to, "--to 24 is past the end")
    assert last.code == 0 and last.json()["seq"] == N, last
    assert replay.code == 0 and replay.json() == {"session": s, "into": f"{s}-y", "events": 5}, replay
    assert cli("sessions", "--json", "--limit", "0").json()[0]["session"] != f"{s}-x"


def test_read_commands_create_nothing(plain_cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "nested" / "calltape.db"
    url = f"sqlite:///{missing}"
    reads = [
        ["sessions"],
        ["show", "s"],
        ["context", "s"],
        ["export", "s"],
        ["db", "info"],
        ["resume", "s", "--agent", "b", "--dry-run"],
    ]
    results = plain_cli.many(*(["--db", url, *args] for args in reads))
    for result in results:
        assert_error(result, f"there is no calltape database at '{missing}'")
    assert not (tmp_path / "typo").exists()
    # the embedded default: named as such, and not created either
    default = plain_cli("sessions")
    assert_error(default, "there is no calltape database yet at", "(the embedded default)", "calltape import FILE")
    assert not (tmp_path / "home").exists()
    # a file that is not a database, and a directory
    not_db = tmp_path / "notes.txt"
    not_db.write_text("hello\n")
    text_file, directory = plain_cli.many(
        ["--db", f"sqlite:///{not_db}", "sessions"], ["--db", f"sqlite:///{tmp_path}", "sessions"]
    )
    assert_error(text_file, f"'{not_db}' is not an SQLite database")
    assert_error(directory, f"'{tmp_path}' is a directory, not an SQLite database")
    assert not_db.read_text() == "hello\n"


@contextlib.contextmanager
def _refusing_postgres(sqlstate: str, message: str) -> Iterator[int]:
    """A TCP server that speaks just enough of the PostgreSQL protocol to refuse a login with
    ``sqlstate`` (no PostgreSQL here accepts passwords: the test cluster trusts local connections)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def read_message(conn: socket.socket) -> bytes:
        (length,) = struct.unpack("!I", conn.recv(4, socket.MSG_WAITALL))
        return conn.recv(length - 4, socket.MSG_WAITALL)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    body = read_message(conn)
                    if struct.unpack("!I", body[:4])[0] == 80877103:  # SSLRequest: no SSL here
                        conn.sendall(b"N")
                        read_message(conn)  # the startup message
                    fields = b"".join(
                        tag + value.encode() + b"\0"
                        for tag, value in ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", sqlstate), (b"M", message))
                    )
                    payload = fields + b"\0"
                    conn.sendall(b"E" + struct.pack("!I", len(payload) + 4) + payload)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


@pytest.mark.postgres
def test_every_database_failure_is_one_sentence_naming_the_fix(pg_admin_url: str, plain_cli: Cli) -> None:
    admin = make_url(pg_admin_url)
    host = admin.host or "127.0.0.1"
    port = admin.port or 5432
    fresh = asyncio.run(_create_database(pg_admin_url))
    try:
        no_db = admin.set(database="calltape_no_such_db").render_as_string(hide_password=False)
        no_role = admin.set(username="calltape_no_such_role").render_as_string(hide_password=False)
        with _refusing_postgres("28P01", 'password authentication failed for user "ann"') as fake:
            wrong_password = f"postgresql://ann:secret-pw@127.0.0.1:{fake}/calls"
            results = plain_cli.many(
                ["--db", no_db, "sessions"],
                ["--db", no_role, "sessions"],
                ["--db", wrong_password, "sessions"],
                ["--db", "postgresql://postgres@127.0.0.1:1/x", "sessions"],
                ["--db", "postgresql://postgres@no-such-host.invalid/x", "sessions"],
                ["--db", fresh, "sessions"],
            )
        # (after them: run beside the others, it could upgrade the fresh database before `sessions` looked)
        upgrade = plain_cli("--db", fresh, "db", "upgrade", "--json", db=False)
        database, role, password, refused, unknown_host, outdated = results
        assert_error(
            database,
            f"there is no database 'calltape_no_such_db' on the PostgreSQL server at {host}:{port}",
            "createdb calltape_no_such_db",
            "calltape db upgrade",
        )
        assert_error(role, "has no role 'calltape_no_such_role'", "createuser calltape_no_such_role")
        assert_error(password, f"the PostgreSQL server at 127.0.0.1:{fake} refused the password for user 'ann'")
        assert "secret-pw" not in password.err
        assert_error(refused, "cannot reach the PostgreSQL at 127.0.0.1:1/x (connection refused)")
        assert_error(unknown_host, "host 'no-such-host.invalid' not found")
        assert_error(outdated, "has no calltape schema; run `calltape db upgrade`")
        assert upgrade.code == 0 and upgrade.json()["upgraded"] is True and upgrade.json()["before"] is None, upgrade
        for result in results:
            assert len([line for line in result.err.splitlines() if line.strip()]) == 1, result
            assert "unexpected" not in result.err
    finally:
        asyncio.run(_drop_database(pg_admin_url, fresh))


def test_json_counts_on_write_commands(cli: Cli, tmp_path: Path, session_id: str) -> None:
    call = tmp_path / "call.jsonl"
    call.write_bytes(jsonl(barge_in_call(session_id)))
    first = cli("import", str(call), "--json")
    again = cli("import", str(call), "--json")
    assert first.code == 0 and first.json() == {"imported": N, "skipped": 0, "sessions": 1, "lines": N}, first
    assert again.code == 0 and again.json() == {"imported": 0, "skipped": N, "sessions": 1, "lines": N}, again
    assert orjson.loads(first.out)  # nothing but the JSON on stdout


def test_a_shard_count_without_citus_is_one_sentence(plain_cli: Cli, tmp_path: Path) -> None:
    # --shards sets how a Citus cluster's tables are distributed: on the embedded SQLite file, or with
    # --no-citus, it is refused before anything is written.
    db = f"sqlite:///{tmp_path}/shards.db"
    assert_error(plain_cli("db", "upgrade", "--shards", "4", db=db), "--shards", "an SQLite file is not one")
    assert_error(plain_cli("db", "upgrade", "--shards", "0", db=db), "a count of 1 or more, not 0")
    assert not (tmp_path / "shards.db").exists()
