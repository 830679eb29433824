"""The receiver under a connection flood (issue 26 items 7 and 8): a real uvicorn process on loopback.

7. At the usual open-file limit of 1,024, 1,100 slow clients used to exhaust the descriptors before the
   1,000-connection cap was reached: ``/healthz`` went down and asyncio logged a traceback per failed
   accept, tens of thousands. The receiver now raises its soft limit toward the hard one, or holds fewer
   connections when even the hard limit is lower, and summarizes accept failures in one line.
8. ``/healthz`` answers while the cap's connections are all held: a lane past the cap serves it.

Every flood targets 127.0.0.1, with a bounded number of connections, for a few seconds.
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from receiver_support import free_port, running_receiver

resource = pytest.importorskip("resource")

FLOOD = 1100


@pytest.fixture(autouse=True)
def enough_files_here() -> None:
    """The flood's clients need their own descriptors in this process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FLOOD + 400
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"this process may open only {hard} files; the flood needs {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


@contextlib.contextmanager
def receiver(
    tmp_path: Path, open_files: tuple[int, int], **options: object
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    url = f"sqlite:///{tmp_path}/serve.db"
    port = free_port()
    extra = "".join(f", {k}={v!r}" for k, v in options.items())
    code = (
        "import logging; logging.basicConfig(level=logging.WARNING);"
        "from calltape.server import run_server;"
        f"run_server({url!r}, '127.0.0.1', {port}, log_level='warning', allow_unsigned=True{extra})"
    )
    with running_receiver(code, port, open_files) as running:
        yield running


def _slow_client(base: str, timeout: float = 2.0) -> socket.socket | None:
    host, port = base.removeprefix("http://").split(":")
    try:
        s = socket.create_connection((host, int(port)), timeout=timeout)
        s.sendall(b"POST /vapi HTTP/1.1\r\nHost: x\r\n")  # headers never finish
    except OSError:
        return None
    return s


def _still_open(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def _healthz(base: str) -> int | str:
    try:
        return httpx.get(f"{base}/healthz", timeout=3).status_code
    except httpx.TransportError as exc:
        return type(exc).__name__


def _stopped_output(proc: subprocess.Popen[bytes]) -> str:
    proc.terminate()
    try:
        return proc.communicate(timeout=30)[0].decode()
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[0].decode()


def _flood(base: str, seconds: float) -> list[int | str]:
    """1,100 slow clients, reopened as the server drops them, for ``seconds``; /healthz probed meanwhile."""
    clients = [c for c in (_slow_client(base) for _ in range(FLOOD)) if c is not None]
    probes: list[int | str] = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            probes.append(_healthz(base))
            time.sleep(0.3)
            kept = [c for c in clients if _still_open(c)]
            for c in clients:
                if c not in kept:
                    c.close()
            clients = kept + [c for c in (_slow_client(base) for _ in range(FLOOD - len(kept))) if c is not None]
    finally:
        for c in clients:
            c.close()
    return probes


def _soft_limit(pid: int) -> int:
    limits = Path(f"/proc/{pid}/limits").read_text()
    found = re.search(r"Max open files\s+(\d+)", limits)
    assert found is not None, limits
    return int(found.group(1))


def test_at_a_1024_file_limit_the_receiver_raises_it_and_holds_the_cap(tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1400:
        pytest.skip("the hard open-file limit leaves nothing to raise toward")
    with receiver(tmp_path, (1024, hard), header_timeout=60.0) as (base, proc):
        if Path(f"/proc/{proc.pid}/limits").exists():
            assert _soft_limit(proc.pid) >= 1000 + 16 + 128 + 64
        held = [c for c in (_slow_client(base, 15.0) for _ in range(1000)) if c is not None]
        time.sleep(1.0)
        try:
            assert len(held) == 1000 and all(_still_open(c) for c in held)  # the cap itself is reached
            probes = _flood(base, 4.0)
        finally:
            for c in held:
                c.close()
        out = _stopped_output(proc)
    assert probes and all(p == 200 for p in probes), probes
    assert "Traceback" not in out and "Too many open files" not in out, out[-3000:]


def test_below_1024_files_the_cap_comes_down_and_healthz_stays_up(tmp_path: Path) -> None:
    with receiver(tmp_path, (1024, 1024)) as (base, proc):
        probes = _flood(base, 8.0)
        out = _stopped_output(proc)
    assert probes and all(p == 200 for p in probes), probes
    assert "Traceback" not in out, out[-3000:]
    lines = out.splitlines()
    assert [line for line in lines if "at most" in line and "connections are held" in line] == [
        next(line for line in lines if "the open-file limit is 1024" in line)
    ]
    assert len([line for line in lines if "could not accept" in line or "Too many open files" in line]) <= 2, out


def test_healthz_answers_while_the_cap_is_held_and_nothing_else_gets_past(tmp_path: Path) -> None:
    with receiver(tmp_path, resource.getrlimit(resource.RLIMIT_NOFILE), max_connections=1000, header_timeout=60.0) as (
        base,
        proc,
    ):
        held = [c for c in (_slow_client(base, 15.0) for _ in range(1000)) if c is not None]
        try:
            time.sleep(1.0)
            assert len(held) == 1000 and all(_still_open(c) for c in held)
            assert [_healthz(base) for _ in range(5)] == [200] * 5
            past = httpx.post(f"{base}/vapi", json={"message": {}}, timeout=3)
            assert past.status_code == 503 and "connection limit" in past.json()["error"]
            lane = [c for c in (_slow_client(base) for _ in range(40)) if c is not None]  # more than the lane holds
            time.sleep(0.5)
            assert sum(_still_open(c) for c in lane) <= 16  # the slowest in the lane make room for the next
            assert _healthz(base) == 200
            for c in lane:
                c.close()
            assert all(_still_open(c) for c in held)  # the lane never costs a held connection
        finally:
            for c in held:
                c.close()
        out = _stopped_output(proc)
    assert "Traceback" not in out, out[-3000:]
