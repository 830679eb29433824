"""The receiver bounded (issue 17, items 8 and 9): trickling clients, connection floods, aborted uploads,
and a webhook whose values the store would refuse. A real uvicorn process on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from receiver_support import free_port, running_receiver

VAPI_SECRET = "vapi-shared-secret"


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], str]]:
    url = f"sqlite:///{tmp_path}/serve.db"
    port = free_port()
    code = (
        "import logging; logging.basicConfig(level=logging.WARNING);"
        "from calltape.server import run_server;"
        f"run_server({url!r}, '127.0.0.1', {port}, log_level='warning', vapi_secret={VAPI_SECRET!r},"
        " header_timeout=1.0, body_timeout=1.0, max_connections=50)"
    )
    with running_receiver(code, port) as (base, proc):
        yield base, proc, url


def _connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def test_trickling_clients_are_dropped_and_healthz_keeps_answering(receiver) -> None:
    base, _, _ = receiver
    tricklers = []
    for _ in range(40):
        s = _connect(base)
        s.sendall(b"POST /vapi HTTP/1.1\r\nHost: x\r\n")  # headers never finish
        tricklers.append(s)
    assert httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    time.sleep(2.0)  # past header_timeout: the server has hung up on every one of them
    for s in tricklers:
        s.settimeout(2)
        try:
            assert s.recv(1) == b""
        except ConnectionResetError:
            pass
        s.close()
    assert httpx.get(f"{base}/healthz", timeout=2).status_code == 200


def _until_closed(s: socket.socket) -> bytes:
    """Everything the server sends before it closes the connection (the lane closes after one answer)."""
    reply = b""
    while chunk := s.recv(4096):
        reply += chunk
    return reply


def test_connections_past_the_cap_get_only_healthz_then_are_served_again(receiver) -> None:
    base, _, _ = receiver
    held = [_connect(base) for _ in range(50)]
    time.sleep(0.2)
    extra = _connect(base)
    extra.settimeout(2)
    extra.sendall(b"POST /vapi HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    reply = _until_closed(extra)
    assert reply.startswith(b"HTTP/1.1 503") and b"connection limit" in reply  # past the cap: not served
    extra.close()
    probe = _connect(base)
    probe.settimeout(2)
    probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _until_closed(probe).startswith(b"HTTP/1.1 200")  # the health lane answers it (issue 26 item 8)
    probe.close()
    for s in held:
        s.close()
    time.sleep(0.3)
    assert httpx.get(f"{base}/healthz", timeout=2).status_code == 200


def test_a_body_that_never_arrives_gets_408(receiver) -> None:
    base, _, _ = receiver
    s = _connect(base)
    s.sendall(
        b"POST /vapi HTTP/1.1\r\nHost: x\r\nX-Vapi-Secret: " + VAPI_SECRET.encode() + b"\r\n"
        b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"mess'
    )
    s.settimeout(5)
    reply = s.recv(4096)
    s.close()
    assert reply.startswith(b"HTTP/1.1 408")


def test_aborted_uploads_log_no_traceback(receiver) -> None:
    base, proc, _ = receiver
    for _ in range(20):
        s = _connect(base)
        s.sendall(
            b"POST /vapi HTTP/1.1\r\nHost: x\r\nX-Vapi-Secret: " + VAPI_SECRET.encode() + b"\r\n"
            b'Content-Length: 1000\r\n\r\n{"message": '
        )
        s.close()
    time.sleep(0.5)
    assert httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    proc.terminate()
    out = proc.communicate(timeout=10)[0].decode()
    assert "Traceback" not in out
    assert out.count("aborted") <= 1


def test_a_webhook_value_the_store_would_refuse_gets_422_once(receiver) -> None:
    """A NUL in a transcript: one 4xx (the platform stops retrying), nothing written, no 500."""
    base, _, _ = receiver
    body = {
        "message": {
            "type": "transcript",
            "transcriptType": "final",
            "role": "user",
            "transcript": "my card is 4242\u0000",
            "call": {"id": "call-nul"},
        }
    }
    r = httpx.post(f"{base}/vapi", content=json.dumps(body), headers={"X-Vapi-Secret": VAPI_SECRET}, timeout=5)
    assert r.status_code == 422, r.text
    assert "4242" not in r.text
