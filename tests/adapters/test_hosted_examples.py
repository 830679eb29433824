"""The hosted-platform examples run offline as scripts: exit 0, in bounded time, saying what they show."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {
    # script: a line its output must contain (the thing the example demonstrates)
    "realtime_inworld.py": "'content': 'Hello!'",
    "vapi_tool_server.py": "bookings made: 1",
    "retell_custom_llm.py": "bookings made: 1",
    "bland_post_call.py": "(reconstructed: True)",
    "elevenlabs_live.py": "'content': 'Booked for two, your code'}",  # the heard part of the cut reply
}
TIMEOUT = 60


def test_every_hosted_example_is_listed() -> None:
    platforms = {"realtime", "vapi", "retell", "bland", "elevenlabs"}
    hosted = {p.name for p in (ROOT / "examples").glob("*.py") if p.name.split("_")[0] in platforms}
    assert hosted == set(EXAMPLES)


def test_examples_run_offline() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLTAPE_")}
    env.update({"OPENAI_API_KEY": "", "HTTP_PROXY": "http://0.0.0.0:1", "HTTPS_PROXY": "http://0.0.0.0:1"})
    env["NO_PROXY"] = "127.0.0.1,localhost"
    started = time.monotonic()
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / name)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in EXAMPLES
    }
    failures: list[str] = []
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=max(1.0, TIMEOUT - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failures.append(f"{name}: still running after {TIMEOUT} s")
            continue
        if proc.returncode != 0:
            failures.append(f"{name}: exit {proc.returncode}\n{err[-2000:]}")
        elif EXAMPLES[name] not in out:
            failures.append(f"{name}: output lacks {EXAMPLES[name]!r}\n{out[-2000:]}")
        elif "Traceback" in err:
            failures.append(f"{name}: printed a traceback\n{err[-2000:]}")
    if failures:
        pytest.fail("\n\n".join(failures))
