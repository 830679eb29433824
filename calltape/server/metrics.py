"""``GET /metrics`` on ``calltape serve``: the voice latency figures in the Prometheus text format.

The server follows the store's global feed from the moment it starts (every writer's calls, not only
the webhooks it receives) and observes each sample into a histogram of its own registry, in seconds as
Prometheus names them: ``calltape_user_stopped_to_agent_speech_seconds``,
``calltape_interruption_to_agent_stopped_seconds``, ``calltape_reply_to_first_text_seconds`` and
``calltape_tool_duration_seconds{tool="…"}``. Percentiles come from the buckets
(``histogram_quantile(0.95, rate(calltape_reply_to_first_text_seconds_bucket[5m]))``). Like any Prometheus
counter, the histograms start empty with the process. The only label is the tool's name, kept to
identifiers (:class:`~calltape.runtime.latency.ToolLabels`): never a session id or anything said.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, exposition

from calltape.runtime.latency import FIRST_TEXT, RESPONSE, TALK_OVER, TOOL, Sample, ToolLabels

CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)
"""The classic text format (0.0.4), which every Prometheus version scrapes."""

BUCKETS_S = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0)
"""The same edges as the OpenTelemetry histograms (:data:`calltape.runtime.latency_otel.BOUNDARIES_MS`)."""

_HELP = {
    RESPONSE: "Seconds from the user's last speech.stopped of a turn to the agent's speech started.",
    TALK_OVER: "Seconds from an interruption of a playing reply to that reply's speech ended.",
    FIRST_TEXT: "Seconds from a reply started to its first text.",
    TOOL: "Seconds from tool.started to its tool.result or tool.cancelled, by tool.",
}


class PrometheusLatency:
    """A sample sink that keeps the figures as Prometheus histograms in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labels = ToolLabels()
        self._histograms = {
            figure: Histogram(
                f"calltape_{figure}_seconds",
                help_text,
                labelnames=("tool",) if figure == TOOL else (),
                buckets=BUCKETS_S,
                registry=self.registry,
            )
            for figure, help_text in _HELP.items()
        }

    def __call__(self, sample: Sample) -> None:
        """Observes one sample."""
        histogram = self._histograms[sample.figure]
        if sample.figure == TOOL:
            histogram = histogram.labels(tool=self._labels(sample.tool))
        histogram.observe(sample.ms / 1000)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return exposition.generate_latest(self.registry)
