"""Effects (SPEC section 8): the state of each real-world action ``(name, key)`` of a session, read
from its ``tool.effect`` events in log order.

One fold for every reader: the runtime's effect API decides from it whether an action may run, resume
settles what it leaves ``started``, ``calltape check`` applies the effect rules to it and ``calltape
stats`` counts its outcomes. Pure: no store, no clock. The context fold ignores ``tool.effect``
(effects change no context), so this is a fold of its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from calltape.events import Event

__all__ = ["PHASES", "EffectLog", "EffectRun", "EffectState", "effect_event_id"]

Phase = Literal["started", "done", "failed", "unknown"]
PHASES: tuple[str, ...] = ("started", "done", "failed", "unknown")


@dataclass(slots=True)
class EffectRun:
    """One ``started`` of an effect and what became of it."""

    seq: int
    call: str
    heard: bool
    phase: str = "started"
    """The run's latest phase: ``started``, ``done``, ``failed`` or ``unknown``."""
    settled_seq: int | None = None


@dataclass(slots=True)
class EffectState:
    """An effect ``(name, key)`` as the log has it so far."""

    name: str
    key: str
    phase: str | None = None
    """The latest phase of any of its events (None: none yet)."""
    runs: list[EffectRun] = field(default_factory=list)
    output: Any = None
    """The output of its latest ``done`` (what answers a new call asking for it)."""
    has_output: bool = False
    failures: int = 0
    """How many ``failed`` phases it has: the number of the next claim (see :func:`effect_event_id`)."""

    @property
    def may_run(self) -> bool:
        """Whether a new run is allowed: never run, or its latest phase is ``failed``."""
        return self.phase is None or self.phase == "failed"

    @property
    def running(self) -> EffectRun | None:
        """The run whose latest phase is ``started`` (its outcome not yet known), if any."""
        return self.runs[-1] if self.runs and self.phase == "started" else None


class EffectLog:
    """The effects of one session, folded from its events (any other event type is ignored)."""

    __slots__ = ("_count", "_seen", "effects")

    def __init__(self) -> None:
        self.effects: dict[tuple[str, str], EffectState] = {}
        self._seen: set[str] = set()
        self._count = 0

    @classmethod
    def of(cls, events: Iterable[Event]) -> EffectLog:
        """The effects of ``events`` (one session, in log order)."""
        log = cls()
        for event in events:
            log.apply(event)
        return log

    def apply(self, event: Event) -> EffectState | None:
        """Folds one event; returns the effect a ``tool.effect`` changed (None for anything else or a
        duplicate id). A ``started`` is recorded as a new run whatever came before: the rules judge it."""
        if event.id in self._seen:
            return None
        self._seen.add(event.id)
        self._count = event.seq if event.seq is not None else self._count + 1
        if event.type != "tool.effect":
            return None
        data = event.data
        name, key, phase = data.get("name"), data.get("key"), data.get("phase")
        if not isinstance(name, str) or not isinstance(key, str) or phase not in PHASES:
            return None
        state = self.effects.get((name, key))
        if state is None:
            state = self.effects[(name, key)] = EffectState(name, key)
        if phase == "started":
            state.runs.append(EffectRun(self._count, str(data.get("call")), data.get("heard") is True))
        elif state.runs:
            run = state.runs[-1]
            run.phase = phase
            run.settled_seq = self._count
        if phase == "done":
            state.output, state.has_output = data.get("output"), "output" in data
        elif phase == "failed":
            state.failures += 1
        state.phase = phase
        return state

    def get(self, name: str, key: str) -> EffectState | None:
        """The effect ``(name, key)``, or None when the log has none of its events."""
        return self.effects.get((name, key))

    def __iter__(self) -> Iterator[EffectState]:
        return iter(self.effects.values())

    def started(self) -> list[EffectState]:
        """The effects whose latest phase is ``started`` (running, or cut off by a drop)."""
        return [s for s in self.effects.values() if s.phase == "started"]


def effect_event_id(name: str, key: str, claim: int, slot: str) -> str:
    """The id of a phase the runtime writes: the same for every writer of the same claim, so the store's
    idempotency on ``(session, id)`` lets exactly one of two racing writers record it (SPEC section 1:
    appending an id the session has returns the stored event).

    ``claim`` is the effect's number of ``failed`` phases when the run starts (a run after a failure is
    a new claim); ``slot`` is ``started``, ``unknown`` or ``settled`` (``done`` and ``failed`` share one:
    a run has one outcome, whoever records it first). The name and key are hashed: they may be long."""
    digest = hashlib.sha256(f"{name}\x00{key}".encode()).hexdigest()[:32]
    return f"fx-{digest}-{claim}-{slot}"
