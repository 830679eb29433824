"""``calltape serve`` stopped with Ctrl-C (issue 26 item 9): a clean exit, no traceback, on both backends.

The console script runs in its own process group and gets SIGINT as a terminal's Ctrl-C sends it (to the
whole group), after it has served a request and recorded a webhook."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from receiver_support import free_port, wait_healthy

CALLTAPE = shutil.which("calltape", path=str(Path(sys.executable).parent)) or "calltape"


def test_ctrl_c_stops_the_receiver_without_a_traceback(store_url: str, session_id: str) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("CALLTAPE_DATABASE_URL", "CALLTAPE_DEBUG")}
    proc = subprocess.Popen(
        [CALLTAPE, "--db", store_url, "serve", "--port", str(port), "--allow-unsigned"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        report = {"message": {"type": "status-update", "status": "in-progress", "call": {"id": session_id}}}
        assert httpx.post(f"{base}/vapi", json=report, timeout=10).status_code == 200
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "CancelledError" not in out, out
    assert "Shutting down" in out
