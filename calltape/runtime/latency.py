"""Voice latency figures, read from the log: how long a caller waits, and how long the agent talks over them.

Four figures (SPEC section 7), each a set of millisecond samples taken from the events' ``at``:

* ``user_stopped_to_agent_speech``: the user's last ``user.speech.stopped`` of a turn to the next
  ``agent.speech.started`` (a ``user.speech.started`` in between means the user went on: the turn's
  end moves to the next stop). Playout that begins with no user turn waiting (a greeting, the second
  sentence after a tool) is not a response and takes no sample.
* ``interruption_to_agent_stopped``: an ``interruption`` that lands while its reply is playing to that
  reply's ``agent.speech.ended``: how long the agent talked over the user. The interval is
  :class:`~calltape.projections.callrecord.Playouts`'s, the one ``calltape check``'s ``talk-over`` reads.
* ``reply_to_first_text``: ``agent.reply.started`` to the reply's first ``agent.text``.
* ``tool_duration``, by tool name: ``tool.started`` to its ``tool.result`` or ``tool.cancelled``.

A drop or the end of the call forgets what was waiting (a wait across a drop measures the outage, which
``calltape stats`` counts as a drop, not as latency). A negative interval (writers' clocks disagreeing) is
not a measurement and is skipped. :class:`LatencyTracker` reads events one at a time, for several
sessions at once (the global feed), so the same code serves ``calltape stats`` and the live metrics.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from calltape.errors import StoreUnavailable
from calltape.events import Event
from calltape.projections.callrecord import Playouts

if TYPE_CHECKING:
    from calltape.eventstore import EventStore, FeedPosition

log = logging.getLogger("calltape.latency")

RESPONSE = "user_stopped_to_agent_speech"
TALK_OVER = "interruption_to_agent_stopped"
FIRST_TEXT = "reply_to_first_text"
TOOL = "tool_duration"
FIGURES = (RESPONSE, TALK_OVER, FIRST_TEXT, TOOL)
"""The figures' names, as ``calltape stats --json`` prints them (and the metrics are named)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured interval: the figure, its length, and the tool's name for ``tool_duration``."""

    figure: str
    ms: int
    tool: str | None = None


@dataclass(slots=True)
class _Session:
    """What one session's figures wait on: a few times and ids, never text."""

    stopped_at: int | None = None
    latest_reply: str | None = None
    replies: set[str] = field(default_factory=set)
    awaiting_text: dict[str, int] = field(default_factory=dict)
    playouts: Playouts = field(default_factory=Playouts)
    """Playing replies and open barge-ins: the talk-over rule ``calltape check`` reads too."""
    tool_names: dict[str, str] = field(default_factory=dict)
    tool_started: dict[str, int] = field(default_factory=dict)

    def forget_waits(self, at_ms: int) -> None:
        """A drop: nothing that was waiting will end in a measurement (a playout it stopped included)."""
        self.stopped_at = None
        self.awaiting_text.clear()
        self.playouts.stop_all(at_ms, "session.dropped")
        self.tool_started.clear()


def _reply_of(data: dict[str, Any]) -> str | None:
    rid = data.get("reply")
    return rid if isinstance(rid, str) else None


S = TypeVar("S")


def recent_state(states: OrderedDict[str, S], session: str, new: Callable[[], S], limit: int) -> S:
    """``session``'s state in ``states``, made by ``new`` when missing, kept most recent; past ``limit``
    sessions the one heard from least recently is forgotten (followers of the global feed stay bounded)."""
    state = states.get(session)
    if state is None:
        state = states[session] = new()
        if len(states) > limit:
            states.popitem(last=False)
    else:
        states.move_to_end(session)
    return state


class LatencyTracker:
    """Turns events into :class:`Sample` s as they come; several sessions at once.

    ``max_sessions`` bounds memory when following the global feed: the session heard from least
    recently is forgotten first (a session's state is dropped anyway when it ends).
    """

    def __init__(self, max_sessions: int = 10_000) -> None:
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._max_sessions = max_sessions

    def _state(self, session: str) -> _Session:
        return recent_state(self._sessions, session, _Session, self._max_sessions)

    @property
    def open_sessions(self) -> int:
        """Sessions whose state is kept (not yet ended)."""
        return len(self._sessions)

    def observe(self, event: Event) -> list[Sample]:
        """The samples this event completes (usually none)."""
        kind = event.type
        if kind.startswith("x."):
            return []
        if kind == "session.ended":
            self._sessions.pop(event.session, None)
            return []
        st = self._state(event.session)
        data = event.data
        at = event.at_ms
        rid = _reply_of(data)
        if rid is not None and rid not in st.replies:
            st.replies.add(rid)
            st.latest_reply = rid  # as the projection: a reply id seen for the first time is the latest
        samples: list[Sample] = []

        def take(figure: str, since: int | None, tool: str | None = None) -> None:
            if since is not None and at >= since:
                samples.append(Sample(figure, at - since, tool))

        if kind == "user.speech.started":
            st.stopped_at = None
        elif kind == "user.speech.stopped":
            st.stopped_at = at
        elif kind == "agent.reply.started":
            if rid is not None:
                st.awaiting_text.setdefault(rid, at)
        elif kind == "agent.text":
            if rid is not None:
                take(FIRST_TEXT, st.awaiting_text.pop(rid, None))
        elif kind == "agent.speech.started":
            take(RESPONSE, st.stopped_at)
            st.stopped_at = None
            if rid is not None:
                st.playouts.start(rid)
        elif kind == "agent.speech.progress":
            if rid is not None:
                st.playouts.start(rid)  # progress implies the playout started
        elif kind == "agent.speech.ended":
            if rid is not None:
                barge = st.playouts.end(rid, at)
                take(TALK_OVER, barge.at_ms if barge is not None else None)
        elif kind == "interruption":
            target = rid if rid is not None else st.latest_reply
            if target is not None:
                st.playouts.barge(target, event.seq or 0, at, st.playouts.playing(target))
        elif kind == "tool.call":
            call, name = data.get("call"), data.get("name")
            if isinstance(call, str) and isinstance(name, str):
                st.tool_names.setdefault(call, name)
        elif kind == "tool.started":
            call = data.get("call")
            if isinstance(call, str):
                st.tool_started.setdefault(call, at)
        elif kind in ("tool.result", "tool.cancelled"):
            call = data.get("call")
            if isinstance(call, str):
                take(TOOL, st.tool_started.pop(call, None), st.tool_names.get(call, "?"))
        elif kind == "session.dropped":
            st.forget_waits(at)
        return samples


def percentile(values: list[int], q: float) -> int | None:
    """The nearest-rank percentile (``q`` in 0..1): always a measured value; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(values: list[int]) -> dict[str, int | None]:
    """``count``, ``p50``, ``p95``, ``p99`` and ``max`` of a figure's samples, in ms."""
    return {
        "count": len(values),
        "p50": percentile(values, 0.50),
        "p95": percentile(values, 0.95),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else None,
    }


class Latencies:
    """The samples of one session or of many, kept to summarize them (percentiles need every sample)."""

    def __init__(self) -> None:
        self.samples: dict[str, list[int]] = {figure: [] for figure in FIGURES if figure != TOOL}
        self.tools: dict[str, list[int]] = {}

    def add(self, sample: Sample) -> None:
        """Keeps one sample."""
        if sample.figure == TOOL:
            self.tools.setdefault(sample.tool or "?", []).append(sample.ms)
        else:
            self.samples[sample.figure].append(sample.ms)

    def update(self, other: Latencies) -> None:
        """Adds another set's samples (a session's, into the totals)."""
        for figure, values in other.samples.items():
            self.samples[figure].extend(values)
        for name, values in other.tools.items():
            self.tools.setdefault(name, []).extend(values)

    def summary(self) -> dict[str, Any]:
        """The figures as ``calltape stats --json`` prints them under ``latency_ms``."""
        figures: dict[str, Any] = {figure: summarize(values) for figure, values in self.samples.items()}
        figures[TOOL] = {name: summarize(self.tools[name]) for name in sorted(self.tools)}
        return figures


def samples(events: Iterable[Event]) -> Iterator[Sample]:
    """Every sample a sequence of events yields."""
    tracker = LatencyTracker()
    for event in events:
        yield from tracker.observe(event)


def session_latencies(events: Iterable[Event]) -> Latencies:
    """The figures of one session's events (or of several sessions' interleaved)."""
    found = Latencies()
    for sample in samples(events):
        found.add(sample)
    return found


SampleSink = Callable[[Sample], None]
"""Where live samples go: OpenTelemetry histograms, the Prometheus exposition of ``calltape serve``."""

_TOOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
OTHER_TOOL = "other"


class ToolLabels:
    """Tool names as metric labels: a name is a function identifier the agent declared, not what the
    caller said, so it may label a metric; anything that does not look like an identifier (an LLM
    inventing a name out of the conversation) and every name past ``limit`` distinct ones is
    ``"other"``, so neither content nor unbounded cardinality reaches a metrics backend."""

    def __init__(self, limit: int = 100) -> None:
        self._known: set[str] = set()
        self._limit = limit

    def __call__(self, name: str | None) -> str:
        """The label for a tool name."""
        if name is None or not _TOOL_NAME.fullmatch(name):
            return OTHER_TOOL
        if name not in self._known:
            if len(self._known) >= self._limit:
                return OTHER_TOOL
            self._known.add(name)
        return name


async def follow_latencies(
    store: EventStore,
    sinks: Sequence[SampleSink],
    *,
    after: FeedPosition | None = None,
    poll_interval: float = 0.5,
    observers: Sequence[Callable[[Event], None]] = (),
) -> None:
    """Follows the store's global feed (every writer's events, from ``after``, default: from now) and
    hands each sample to the sinks, and each event to the ``observers`` (the server's counters), until
    cancelled. A failing sink or observer is logged, never raised."""
    tracker = LatencyTracker()
    start = after
    delay = 0.05
    while start is None:
        try:
            start = await store.head()
        except StoreUnavailable as exc:  # the database is down at start: wait for it, as the feed does
            log.warning("latency figures: %s; retrying in %.2fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
    async for _, event in store.subscribe(start, poll_interval=poll_interval):
        for observer in observers:
            try:
                observer(event)
            except Exception:
                log.exception("calltape feed observer failed")
        for sample in tracker.observe(event):
            for sink in sinks:
                try:
                    sink(sample)
                except Exception:  # an observer: it must never stop the others
                    log.exception("calltape latency sink failed")
