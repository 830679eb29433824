"""The voice latency figures as OpenTelemetry histograms (the ``otel`` extra), beside the recovery
counter of :mod:`calltape.runtime.recovery`.

One histogram per figure, in milliseconds: ``calltape.latency.user_stopped_to_agent_speech``,
``calltape.latency.interruption_to_agent_stopped``, ``calltape.latency.reply_to_first_text`` and
``calltape.tool.duration`` with the attribute ``tool`` (see :class:`~calltape.runtime.latency.ToolLabels`).
No other attribute: never a session id (unbounded) nor anything a caller said.
"""

from __future__ import annotations

from typing import Any

from calltape.runtime.latency import FIRST_TEXT, RESPONSE, TALK_OVER, TOOL, Sample, SampleSink, ToolLabels

BOUNDARIES_MS = (50, 100, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 10_000, 30_000, 60_000, 120_000)
"""Bucket edges for a voice call's waits: tens of milliseconds apart where a caller notices, wider above."""

INSTRUMENTS = {
    RESPONSE: ("calltape.latency.user_stopped_to_agent_speech", "user stopped speaking to agent speech started"),
    TALK_OVER: ("calltape.latency.interruption_to_agent_stopped", "interruption to agent speech ended"),
    FIRST_TEXT: ("calltape.latency.reply_to_first_text", "reply started to its first text"),
    TOOL: ("calltape.tool.duration", "tool started to its result or cancellation, by tool"),
}
"""Figure -> (instrument name, description)."""


def otel_latency_sink(meter_provider: Any = None) -> SampleSink | None:
    """A sink recording samples into OpenTelemetry histograms (of ``meter_provider``, default the
    global one), or None without the ``otel`` extra. Feed it from :func:`follow_latencies` or a
    :class:`LatencyTracker` of your own."""
    try:
        from opentelemetry import metrics
    except ImportError:
        return None
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    meter = provider.get_meter("calltape")
    histograms = {
        figure: meter.create_histogram(
            name, unit="ms", description=description, explicit_bucket_boundaries_advisory=BOUNDARIES_MS
        )
        for figure, (name, description) in INSTRUMENTS.items()
    }
    labels = ToolLabels()

    def sink(sample: Sample) -> None:
        attributes = {"tool": labels(sample.tool)} if sample.figure == TOOL else None
        histograms[sample.figure].record(sample.ms, attributes)

    return sink
