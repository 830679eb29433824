"""The CLI is tested as users run it: the installed ``calltape`` console script, in a subprocess.

Start-up costs about a second per process, so independent invocations run concurrently
(:meth:`Cli.many`) and each test groups its assertions.
"""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

BIN = Path(sys.executable).parent
CALLTAPE = shutil.which("calltape", path=str(BIN)) or shutil.which("calltape")
T0 = "2025-01-31T09:30:00.000Z"


@dataclass
class Result:
    args: Sequence[str]
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return orjson.loads(self.out)

    def lines(self) -> list[Any]:
        return [orjson.loads(line) for line in self.out.splitlines() if line.strip()]

    def __repr__(self) -> str:
        return f"calltape {' '.join(self.args)} -> {self.code}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


class Cli:
    def __init__(self, home: Path, db: str | None = None) -> None:
        assert CALLTAPE, "the calltape console script is not installed in this environment"
        self.exe = CALLTAPE
        self.db = db
        skip = ("CALLTAPE_DATABASE_URL", "CALLTAPE_DEBUG", "CALLTAPE_TENANT")
        self.env = {k: v for k, v in os.environ.items() if k not in skip}
        self.env.update({"CALLTAPE_HOME": str(home), "COLUMNS": "200", "NO_COLOR": "1"})

    def argv(self, args: Sequence[str], db: str | bool | None = True) -> list[str]:
        chosen = self.db if db is True else (db or None)
        return [self.exe, *(["--db", chosen] if chosen else []), *args]

    def __call__(self, *args: str, input: bytes | None = None, db: str | bool | None = True) -> Result:
        proc = subprocess.run(self.argv(args, db), input=input, capture_output=True, env=self.env, timeout=180)
        return Result(args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())

    def many(self, *commands: Sequence[str], db: str | bool | None = True) -> list[Result]:
        with ThreadPoolExecutor(max_workers=len(commands)) as pool:
            return list(pool.map(lambda args: self(*args, db=db), commands))

    def on_terminal(
        self, *args: str, stdout: Any = subprocess.PIPE
    ) -> tuple[subprocess.CompletedProcess[bytes], bytes]:
        """Runs with stderr on a pseudo-terminal (where rich draws progress); returns what it drew there."""
        primary, secondary = pty.openpty()
        env = {**self.env, "TERM": "xterm", "COLUMNS": "100"}
        env.pop("NO_COLOR", None)
        proc = subprocess.run(self.argv(args), stdout=stdout, stderr=secondary, env=env, timeout=180)
        os.close(secondary)
        drawn = b""
        try:
            while chunk := os.read(primary, 65536):
                drawn += chunk
        except OSError:
            pass
        os.close(primary)
        return proc, drawn

    def popen(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env)


def assert_error(result: Result, *fragments: str) -> None:
    """One sentence on stderr, exit 2, no traceback."""
    assert result.code == 2, result
    assert "Traceback" not in result.err and "Traceback" not in result.out, result
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), result
    for fragment in fragments:
        assert fragment in result.err, (fragment, result)


@pytest.fixture
def cli(store_url: str, tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home", store_url)


@pytest.fixture
def plain_cli(tmp_path: Path) -> Cli:
    """No --db: the embedded default under a temporary CALLTAPE_HOME."""
    return Cli(tmp_path / "home")


def at(ms: int) -> str:
    from calltape.events import format_time, parse_time

    return format_time(parse_time(T0) + ms)


def barge_in_call(session: str) -> list[dict[str, Any]]:
    """A booking call: barge-in while the tool runs, a late result, a second tool cut by a drop."""
    rows: list[tuple[int, str, dict[str, Any]]] = [
        (0, "session.started", {"agent": "triage", "instructions": "You book tables."}),
        (1000, "user.speech.started", {}),
        (2000, "user.transcript", {"text": "Book a table for two at eight", "final": True}),
        (2100, "user.speech.stopped", {}),
        (2300, "agent.reply.started", {"reply": "r1"}),
        (2400, "agent.text", {"reply": "r1", "text": "Sure, let me book two at eight for you."}),
        (2500, "tool.call", {"reply": "r1", "call": "c1", "name": "book_table", "arguments": {"people": 2}}),
        (2600, "agent.reply.done", {"reply": "r1"}),
        (2700, "tool.started", {"call": "c1"}),
        (2800, "agent.speech.started", {"reply": "r1"}),
        (3500, "user.speech.started", {}),
        (3600, "interruption", {"reply": "r1", "cause": "user_speech", "heard": "Sure, let me book"}),
        (4500, "user.transcript", {"text": "actually make it three", "final": True}),
        (4600, "user.speech.stopped", {}),
        (5000, "tool.result", {"call": "c1", "output": {"confirmation": "BK-42", "people": 2}}),
        (5200, "agent.reply.started", {"reply": "r2"}),
        (5300, "agent.text", {"reply": "r2", "text": "Changing it to three."}),
        (5400, "tool.call", {"reply": "r2", "call": "c2", "name": "update_booking", "arguments": {"people": 3}}),
        (5500, "agent.reply.done", {"reply": "r2"}),
        (5600, "tool.started", {"call": "c2"}),
        (5700, "tool.progress", {"call": "c2", "state": {"step": "requested"}, "message": "asked for 3 seats"}),
        (5800, "agent.speech.started", {"reply": "r2"}),
        (6000, "session.dropped", {"reason": "agent crashed"}),
    ]
    return [
        {"id": f"{session}-e{i}", "session": session, "seq": 99, "type": t, "at": at(ms), "data": d}
        for i, (ms, t, d) in enumerate(rows, start=1)
    ]


def jsonl(events: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(e) + b"\n" for e in events)
