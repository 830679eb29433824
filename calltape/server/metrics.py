"""``GET /metrics`` on ``calltape serve``: what the store's calls do, in the Prometheus text format.

The server follows the store's global feed from the moment it starts (every writer's calls, not only
the webhooks it receives) and counts what it reads (see ``docs/observability.md`` for the list):

* the voice latency figures as histograms in seconds, ``calltape_user_stopped_to_agent_speech_seconds``,
  ``calltape_interruption_to_agent_stopped_seconds``, ``calltape_reply_to_first_text_seconds`` and
  ``calltape_tool_duration_seconds{tool="…"}``; percentiles come from the buckets
  (``histogram_quantile(0.95, rate(calltape_reply_to_first_text_seconds_bucket[5m]))``);
* events appended by type, sessions started, ended, dropped and resumed, tool outcomes by tool,
  effects by tool and phase (:class:`CallCounters`);
* the ``calltape check`` findings by rule of every call that ends while the server runs
  (:class:`FindingsCounter`: the rules run over the whole call once its ``session.ended`` is read);
* the server's own recorder (the Retell custom-LLM sockets write through it): queue depth, commit lag,
  committed, retried, rejected and spilled events (:class:`RecorderCollector`).

Like any Prometheus counter, they start at zero with the process: they count what happened since the
server started, never what the store held before (``calltape stats`` reads that from the log). Labels
carry only bounded identifiers: event types, rule ids, outcomes, phases and tool names (kept to
identifiers, :class:`~calltape.runtime.latency.ToolLabels`); never a session id or anything said.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from calltape.checks import RULES, CheckOptions, check_events
from calltape.events import EVENT_TYPES, Event
from calltape.eventstore.recorder import Recorder
from calltape.runtime.latency import FIRST_TEXT, RESPONSE, TALK_OVER, TOOL, Sample, ToolLabels, recent_state

log = logging.getLogger("calltape.server.metrics")

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

EFFECT = "tool.effect"
"""SPEC section 8's event type, counted by phase (read from the data: a store that predates it has none)."""
EFFECT_PHASES = ("started", "done", "failed", "unknown")
TYPE_LABELS = frozenset(EVENT_TYPES | {EFFECT})
"""Event types that label ``calltape_events_appended_total`` as themselves; ``x.*`` extensions are
``x`` (their names are unbounded), a type of a newer version ``other``."""
SESSION_COUNTERS = {
    "session.started": "started",
    "session.ended": "ended",
    "session.dropped": "dropped",
    "session.resumed": "resumed",
}
"""Event type -> the ``calltape_sessions_<what>_total`` counter it adds one to."""


class PrometheusLatency:
    """A sample sink that keeps the figures as Prometheus histograms (in ``registry``, default a new one)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
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


def type_label(kind: str) -> str:
    """An event type as a label value: bounded whatever writers invent."""
    if kind in TYPE_LABELS:
        return kind
    return "x" if kind.startswith("x.") else "other"


def tool_outcome(event: Event) -> str | None:
    """The outcome a settling event gives its call, in the projection's words (``completed``, ``error``,
    ``timeout``, ``unknown``, ``cancelled``); None for any other event."""
    if event.type == "tool.result":
        return "error" if event.data.get("error") is True else "completed"
    if event.type == "tool.cancelled":
        if event.data.get("reason") == "timeout":
            return "timeout"
        return "unknown" if event.data.get("outcome") == "unknown" else "cancelled"
    return None


@dataclass(slots=True)
class _Calls:
    """One session's tool calls as far as the counters need them: names, and how each was settled."""

    names: dict[str, str] = field(default_factory=dict)
    settled: dict[str, bool] = field(default_factory=dict)
    """call -> settled by a ``tool.result`` (True) or only by a cancel so far (False)."""


class CallCounters:
    """Counts events as the feed brings them: by type, session lifecycle, tool outcomes, effects.

    Tool outcomes follow the projection's rule for a call's one output: the first ``tool.result``
    counts, even after a cancel (a call cancelled by a drop as ``unknown`` and completed once resumed
    counts once in each); a second result, or a cancel after a cancel or a result, counts nothing.
    ``max_sessions`` bounds the per-session state (the least recently heard session is forgotten).
    """

    def __init__(self, registry: CollectorRegistry, *, max_sessions: int = 10_000) -> None:
        self._sessions: OrderedDict[str, _Calls] = OrderedDict()
        self._max_sessions = max_sessions
        self._labels = ToolLabels()
        self.events = Counter(
            "calltape_events_appended",
            "Events appended to the store since the server started, by type.",
            labelnames=("type",),
            registry=registry,
        )
        for kind in sorted(TYPE_LABELS):
            self.events.labels(type=kind)
        self.sessions = {
            kind: Counter(
                f"calltape_sessions_{what}",
                f"Sessions {what} (their {kind} appended) since the server started.",
                registry=registry,
            )
            for kind, what in SESSION_COUNTERS.items()
        }
        self.tool_outcomes = Counter(
            "calltape_tool_outcomes",
            "Tool calls settled since the server started, by tool and outcome (completed, error, timeout, "
            "unknown, cancelled).",
            labelnames=("tool", "outcome"),
            registry=registry,
        )
        self.effects = Counter(
            "calltape_effects",
            "tool.effect events since the server started, by tool and phase (started, done, failed, unknown).",
            labelnames=("tool", "phase"),
            registry=registry,
        )
        self.on_ended: list[Callable[[str], None]] = []
        """Told each session whose ``session.ended`` was counted (the findings counter listens)."""

    def __call__(self, event: Event) -> None:
        """Counts one event of the feed."""
        kind = event.type
        self.events.labels(type=type_label(kind)).inc()
        lifecycle = self.sessions.get(kind)
        if lifecycle is not None:
            lifecycle.inc()
        if kind == "session.ended":
            self._sessions.pop(event.session, None)
            for listener in self.on_ended:
                listener(event.session)
            return
        if not kind.startswith("tool."):
            return
        call = event.data.get("call")
        if not isinstance(call, str):
            return
        calls = recent_state(self._sessions, event.session, _Calls, self._max_sessions)
        if kind == "tool.call":
            name = event.data.get("name")
            if isinstance(name, str):
                calls.names.setdefault(call, name)
        elif kind == EFFECT:
            phase = event.data.get("phase")
            name = event.data.get("name")
            tool = name if isinstance(name, str) else calls.names.get(call)
            self.effects.labels(tool=self._labels(tool), phase=phase if phase in EFFECT_PHASES else "other").inc()
        else:
            outcome = tool_outcome(event)
            if outcome is None:
                return
            by_result = kind == "tool.result"
            before = calls.settled.get(call)
            if before is True or (before is False and not by_result):
                return  # the call's output is already decided
            calls.settled[call] = by_result
            self.tool_outcomes.labels(tool=self._labels(calls.names.get(call)), outcome=outcome).inc()


class FindingsCounter:
    """Runs ``calltape check``'s rules over each call that ends while the server runs, and counts the
    findings by rule. The whole call is read from the store after its ``session.ended``, and checked in
    a worker thread so the receiver's loop keeps answering. At most ``max_waiting`` ended calls wait to
    be checked; past that they are counted in ``calltape_check_skipped_sessions_total`` instead."""

    def __init__(
        self, store: Any, registry: CollectorRegistry, *, options: CheckOptions | None = None, max_waiting: int = 1000
    ) -> None:
        self.store = store
        self.options = options or CheckOptions()
        self._waiting: asyncio.Queue[str] = asyncio.Queue(max_waiting)
        self.findings = Counter(
            "calltape_check_findings",
            "calltape check findings, by rule, of the calls that ended since the server started.",
            labelnames=("rule",),
            registry=registry,
        )
        for rule_id in RULES:
            self.findings.labels(rule=rule_id)
        self.checked = Counter(
            "calltape_checked_sessions", "Ended calls checked since the server started.", registry=registry
        )
        self.with_findings = Counter(
            "calltape_sessions_with_findings",
            "Ended calls with at least one calltape check finding, since the server started.",
            registry=registry,
        )
        self.skipped = Counter(
            "calltape_check_skipped_sessions",
            "Ended calls not checked (too many waiting, or the store could not be read).",
            registry=registry,
        )

    def ended(self, session: str) -> None:
        """Queues an ended call for checking (never waits)."""
        try:
            self._waiting.put_nowait(session)
        except asyncio.QueueFull:
            self.skipped.inc()

    async def run(self) -> None:
        """Checks queued calls until cancelled."""
        while True:
            session = await self._waiting.get()
            try:
                await self.check(session)
            except Exception as exc:  # an unreadable call is skipped, never the end of the counting
                self.skipped.inc()
                log.warning("calltape metrics: could not check an ended call (%s)", type(exc).__name__)

    async def check(self, session: str) -> None:
        """Reads and checks one call, and counts its findings."""
        events = await self.store.read(session)
        found = await asyncio.to_thread(check_events, events, self.options, None, session)
        self.checked.inc()
        if found:
            self.with_findings.inc()
        for violation in found:
            self.findings.labels(rule=violation.rule).inc()


class RecorderCollector(Collector):
    """Reads recorders' figures at each scrape: queue depth and commit lag (gauges), and the writer's
    counters. ``recorders`` returns the recorders to add up (a server's recorder is opened lazily)."""

    def __init__(self, recorders: Callable[[], Iterable[Recorder]]) -> None:
        self.recorders = recorders

    def collect(self) -> Iterator[Any]:
        """The families, summed over the recorders (the lag is the largest)."""
        found = list(self.recorders())
        stats = [r.stats for r in found]
        yield GaugeMetricFamily(
            "calltape_recorder_queue_depth",
            "Events the recorder accepted and has not committed yet.",
            value=sum(r.pending for r in found),
        )
        yield GaugeMetricFamily(
            "calltape_recorder_commit_lag_seconds",
            "Seconds the oldest event not yet committed has waited since emit (0 when none waits).",
            value=max((r.commit_lag for r in found), default=0.0),
        )
        yield GaugeMetricFamily(
            "calltape_recorder_last_batch_lag_seconds",
            "Seconds from emit to commit of the oldest event of the latest committed batch.",
            value=max((s.last_commit_lag_seconds for s in stats), default=0.0),
        )
        for name, help_text, value in (
            ("committed_events", "Events the recorder committed.", sum(s.committed for s in stats)),
            ("batches", "Batches (transactions) the recorder committed.", sum(s.batches for s in stats)),
            ("retries", "Writes the recorder retried (database unreachable or busy).", sum(s.retries for s in stats)),
            ("rejected_events", "Events the store refused (fenced, invalid).", sum(s.rejected for s in stats)),
            ("spilled_events", "Events saved to a spill file at close.", sum(s.spilled for s in stats)),
            ("outage_seconds", "Seconds the recorder waited for an unreachable database.", _outage(stats)),
        ):
            yield CounterMetricFamily(f"calltape_recorder_{name}", help_text, value=value)


def _outage(stats: Iterable[Any]) -> float:
    return float(sum(s.outage_seconds for s in stats))


class ServerMetrics:
    """Everything ``GET /metrics`` serves, in one registry of its own: feed them with :meth:`observe`
    (each event of the feed) and :attr:`latency` (each latency sample); :meth:`run` checks ended calls."""

    def __init__(self, store: Any, *, recorders: Callable[[], Iterable[Recorder]] = tuple) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = PrometheusLatency(self.registry)
        self.counters = CallCounters(self.registry)
        self.findings = FindingsCounter(store, self.registry)
        self.counters.on_ended.append(self.findings.ended)
        self.registry.register(RecorderCollector(recorders))

    def observe(self, event: Event) -> None:
        """Counts one event of the feed."""
        self.counters(event)

    async def run(self) -> None:
        """Checks the calls that end, until cancelled."""
        await self.findings.run()

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return exposition.generate_latest(self.registry)
