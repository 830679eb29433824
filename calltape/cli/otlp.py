"""``calltape export --otlp``: stored calls sent as OpenTelemetry traces to an OTLP/HTTP endpoint
(Langfuse, Arize Phoenix, an OpenTelemetry Collector), with the spans of :mod:`calltape.runtime.traces`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from calltape.errors import CliError
from calltape.events import Event
from calltape.extras import requires_extra
from calltape.redaction import Redactor
from calltape.runtime.traces import trace_events


def send_calls(
    calls: Iterable[list[Event]],
    *,
    endpoint: str | None,
    content: bool,
    redactor: Redactor | None,
    timeout: float | None = None,
) -> tuple[int, str]:
    """Builds every call's spans, then sends them in one OTLP export; returns (spans, endpoint).

    ``endpoint`` is the traces URL (``…/v1/traces``); None takes the OpenTelemetry environment
    (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``),
    as do the headers (``OTEL_EXPORTER_OTLP_HEADERS``) and the service name (``OTEL_SERVICE_NAME``).
    """
    with requires_extra("otel", "calltape export --otlp"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    collected = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "calltape"}).merge(Resource.create()))
    provider.add_span_processor(SimpleSpanProcessor(collected))
    for events in calls:
        trace_events(events, provider, content=content, redactor=redactor)
    spans = collected.get_finished_spans()
    exporter: Any = OTLPSpanExporter(endpoint=endpoint, timeout=timeout)
    target = str(getattr(exporter, "_endpoint", endpoint or "the OTLP endpoint"))
    try:
        result = exporter.export(spans) if spans else SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        provider.shutdown()
    if result is not SpanExportResult.SUCCESS:
        raise CliError(
            f"the OTLP endpoint {target} did not accept the traces (is it running, and are the headers right?)"
        )
    return len(spans), target
