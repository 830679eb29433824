"""`calltape serve` as a real process for the receiver tests: started, awaited on /healthz, stopped."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(base: str, proc: subprocess.Popen[bytes]) -> None:
    """Waits up to a minute for ``base``/healthz (a loaded CI machine starts Python slowly)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise RuntimeError(f"the receiver did not start: {out}")
        time.sleep(0.05)


@contextlib.contextmanager
def running_receiver(
    code: str, port: int, open_files: tuple[int, int] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Runs ``code`` (a Python program that serves on ``port``) until the block ends; yields its base URL.
    ``open_files``: the process's (soft, hard) limit on open files.

    Waits up to a minute for /healthz: a loaded CI machine starts Python slowly."""

    def limit() -> None:
        if open_files is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, open_files)

    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=limit
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
