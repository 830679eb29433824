"""``calltape export --otlp``: a stored call sent as OpenTelemetry traces to an OTLP/HTTP endpoint (a
local receiver here, decoding the protobuf a Collector, Langfuse or Phoenix would receive)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.cli.conftest import Cli, assert_error, barge_in_call, jsonl


class Receiver:
    """An OTLP/HTTP traces endpoint on a loopback port: keeps what it is sent."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], ExportTraceServiceRequest]] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                received.append(({k.lower(): v for k, v in self.headers.items()}, request))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def spans(self) -> list[Any]:
        return [
            span
            for _, request in self.requests
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    thread = threading.Thread(target=r.server.serve_forever, daemon=True)
    thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def test_export_otlp_sends_the_calls_ledger(cli: Cli, receiver: Receiver) -> None:
    assert cli("import", "-", input=jsonl(barge_in_call("otlp-1"))).code == 0
    cli.env["OTEL_EXPORTER_OTLP_HEADERS"] = "Authorization=Basic cGs6c2s="
    cli.env["OTEL_SERVICE_NAME"] = "booking-agent"
    result = cli("export", "otlp-1", "--otlp", "--otlp-endpoint", receiver.url)
    assert result.code == 0, result
    assert result.out == ""  # no JSONL: the calls went to the endpoint
    spans = receiver.spans()
    assert f"Sent {len(spans)} spans of 1 call(s) to {receiver.url}" in result.err
    headers, request = receiver.requests[0]
    assert headers["authorization"] == "Basic cGs6c2s="  # Langfuse's credentials travel as a header
    resource = {kv.key: kv.value.string_value for kv in request.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "booking-agent"
    names = sorted(s.name for s in spans)
    assert names == sorted(
        [
            "invoke_agent triage",
            "turn",
            "turn",
            "chat",
            "chat",
            "agent.speech",
            "agent.speech",
            "execute_tool book_table",
            "execute_tool update_booking",
            "session.dropped",
        ]
    )
    assert len({s.trace_id for s in spans}) == 1
    by_name = {s.name: s for s in spans}
    r1 = min((s for s in spans if s.name == "chat"), key=lambda s: s.start_time_unix_nano)
    assert attributes(r1)["calltape.reply.interrupted"] is True
    assert attributes(r1)["calltape.reply.heard_chars"] == len("Sure, let me book")
    assert [e.name for e in r1.events] == ["interruption"]
    root = by_name["invoke_agent triage"]
    assert attributes(root)["calltape.unfinished"] is True  # dropped and never resumed
    assert attributes(root)["session.id"] == "otlp-1"
    # nothing said by default
    everything = str([attributes(s) for s in spans])
    assert "book two at eight" not in everything and "BK-42" not in everything


def test_export_otlp_content_when_asked_redacted(cli: Cli, receiver: Receiver) -> None:
    events = barge_in_call("otlp-2")
    events[2]["data"]["text"] = "Book a table for two at eight, my email is ann@example.com"
    assert cli("import", "-", input=jsonl(events)).code == 0
    result = cli("export", "otlp-2", "--otlp", "--otlp-endpoint", receiver.url, "--content")
    assert result.code == 0, result
    everything = str([attributes(s) for s in receiver.spans()])
    assert "Sure, let me book" in everything and "BK-42" in everything
    assert "ann@example.com" not in everything and "[email]" in everything


def test_export_otlp_errors(cli: Cli, receiver: Receiver) -> None:
    assert cli("import", "-", input=jsonl(barge_in_call("otlp-3"))).code == 0
    receiver.server.shutdown()
    receiver.server.server_close()
    cli.env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1"
    down, content_alone, bad_kind = cli.many(
        ("export", "otlp-3", "--otlp", "--otlp-endpoint", receiver.url),
        ("export", "otlp-3", "--content"),
        ("export", "otlp-3", "--otlp", "--content", "--redact", "cards"),
    )
    assert down.code != 0 and "Traceback" not in down.err
    assert f"the OTLP endpoint {receiver.url} did not accept the traces" in down.err
    assert_error(content_alone, "--otlp-endpoint and --content go with --otlp")
    assert_error(bad_kind, "unknown redaction kind 'cards'")
