"""Recovery events: every time calltape saved a call from a known failure, with its figures.

Each recovery is reported to pluggable sinks (Python logging by default, an async stream, and
OpenTelemetry when the ``otel`` extra is installed) and, for a live session, written to its log as an
``x.recovery`` extension event, so ``calltape stats`` can summarize recoveries from the log alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from calltape.errors import CalltapeError, FencedWrite
from calltape.events import Event, make_event, now_ms
from calltape.eventstore.recorder import Recorder

RecoveryKind = Literal[
    "resume",
    "handoff",
    "timeout",
    "late_result",
    "duplicate_prevented",
    "fenced_write",
    "waiter_released",
    "not_started",
    "effect_reused",
    "effect_not_rerun",
    "effect_not_run",
]

RECOVERY_EVENT_TYPE = "x.recovery"

log = logging.getLogger("calltape.recovery")


@dataclass(frozen=True, slots=True)
class Recovery:
    """One thing calltape saved a call from (a resume, a timeout, a late result, a fenced write…), with its figures."""

    kind: RecoveryKind
    session: str
    figures: dict[str, Any] = field(default_factory=dict)
    at_ms: int = field(default_factory=now_ms)

    def as_data(self) -> dict[str, Any]:
        """The recovery as the data of its ``x.recovery`` event."""
        return {"kind": self.kind, **self.figures}


Sink = Callable[[Recovery], None]


def logging_sink(recovery: Recovery) -> None:
    """The default sink: one log line with the kind, the session and the figures (no content)."""
    figures = " ".join(f"{k}={v}" for k, v in recovery.figures.items())
    log.info("calltape recovery %s session=%s %s", recovery.kind, recovery.session, figures)


class RecoverySubscription:
    """One subscriber's queue; it has joined the stream as soon as it exists (not at its first
    ``__anext__``), so nothing reported between ``subscribe()`` and the first read is lost."""

    def __init__(self, stream: RecoveryStream, maxsize: int) -> None:
        self._queue: asyncio.Queue[Recovery] = asyncio.Queue(maxsize)
        self._stream: RecoveryStream | None = stream
        stream._subscribers.add(self)

    def _put(self, recovery: Recovery) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(recovery)

    def __aiter__(self) -> RecoverySubscription:
        return self

    async def __anext__(self) -> Recovery:
        if self._stream is None:
            raise StopAsyncIteration
        return await self._queue.get()

    def close(self) -> None:
        """Leaves the stream: no more recoveries arrive."""
        if self._stream is not None:
            self._stream._subscribers.discard(self)
            self._stream = None

    async def aclose(self) -> None:
        """Leaves the stream (async form, for ``contextlib.aclosing``)."""
        self.close()

    async def __aenter__(self) -> RecoverySubscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class RecoveryStream:
    """An async stream of recoveries; each subscriber gets every recovery reported after it joined
    (``subscribe()`` joins at once; a subscription that is dropped or closed leaves)."""

    def __init__(self, maxsize: int = 10_000) -> None:
        self._subscribers: weakref.WeakSet[RecoverySubscription] = weakref.WeakSet()
        self._maxsize = maxsize

    def __call__(self, recovery: Recovery) -> None:
        """Hands the recovery to every subscriber (a full subscriber misses it rather than blocking)."""
        for subscriber in list(self._subscribers):
            subscriber._put(recovery)

    def subscribe(self) -> RecoverySubscription:
        """``async for recovery in stream.subscribe(): ...``"""
        return RecoverySubscription(self, self._maxsize)


def otel_sink() -> Sink | None:
    """An OpenTelemetry sink (a span and a counter per recovery), or None without the ``otel`` extra."""
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return None
    tracer = trace.get_tracer("calltape")
    counter = metrics.get_meter("calltape").create_counter(
        "calltape.recoveries", description="recoveries calltape performed, by kind"
    )

    def sink(recovery: Recovery) -> None:
        attributes: dict[str, int | float | str] = {
            "calltape.kind": recovery.kind,
            "calltape.session": recovery.session,
        }
        attributes.update({f"calltape.{k}": v for k, v in recovery.figures.items() if isinstance(v, (int, float, str))})
        counter.add(1, {"kind": recovery.kind})
        with tracer.start_as_current_span(f"calltape.recovery.{recovery.kind}", attributes=attributes):
            pass

    return sink


class RecoveryBus:
    """Fans recoveries out to sinks; a failing sink never breaks the call."""

    def __init__(self, sinks: list[Sink] | None = None) -> None:
        self.sinks: list[Sink] = [logging_sink] if sinks is None else list(sinks)
        self.stream = RecoveryStream()
        self.sinks.append(self.stream)
        otel = otel_sink()
        if otel is not None:
            self.sinks.append(otel)

    def add_sink(self, sink: Sink) -> None:
        """Adds a sink that every later recovery is reported to."""
        self.sinks.append(sink)

    def report(self, recovery: Recovery) -> None:
        """Reports a recovery to every sink; a failing sink is logged, never raised into the call."""
        for sink in self.sinks:
            try:
                sink(recovery)
            except Exception:  # a sink is an observer: it must never fail the call
                log.exception("calltape recovery sink failed")


recoveries = RecoveryBus()
"""The process-wide bus; ``recoveries.add_sink(fn)`` or ``async for r in recoveries.stream.subscribe()``."""


def report_fenced_writes(recorder: Recorder, bus: RecoveryBus, events: Sequence[Event], error: CalltapeError) -> None:
    """Reports the writes a recorder had rejected for a stale epoch (a zombie agent after a resume).

    The zombie cannot write to the log at its old epoch, so the fact is recorded without an epoch (an
    ``x.recovery`` event, ignored by projections) for ``calltape stats`` to count. The live session
    calls it from its :meth:`Recorder.watch` handler."""
    if not isinstance(error, FencedWrite):
        return
    for event in events:
        if event.type == RECOVERY_EVENT_TYPE:
            continue  # the note of a refused write is not itself noted: that could go on forever
        figures = {"type": event.type, "epoch": error.epoch, "current_epoch": error.current}
        bus.report(Recovery("fenced_write", event.session, figures))
        with contextlib.suppress(CalltapeError):
            recorder.emit(
                make_event(event.session, RECOVERY_EVENT_TYPE, {"kind": "fenced_write", **figures}, agent=event.agent)
            )
