"""The instant a context is taken at: a seq, a wall-clock time, or an offset from the session start.

Parsing is separate from resolving because only the store knows the session's times; the pure
:func:`seq_for_instant` mirrors ``store.seq_at_time`` for events already in memory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from calltape.errors import InvalidEvent, InvalidInstant
from calltape.events import Event, parse_time


@dataclass(frozen=True, slots=True)
class AtSeq:
    """An instant given as a seq: the fold of events 1..seq."""

    seq: int


@dataclass(frozen=True, slots=True)
class AtTime:
    """An instant given as a time: the events that happened at or before it."""

    at_ms: int


@dataclass(frozen=True, slots=True)
class AtOffset:
    """Seconds after the session's first event."""

    seconds: float


Instant = AtSeq | AtTime | AtOffset

_HINT = "use a seq number (e.g. 42), an RFC 3339 time (e.g. 2025-01-31T09:30:00Z) or +SECONDS (e.g. +12.5)"
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_OFFSET = re.compile(r"\+(\d+(\.\d*)?|\.\d+)")


def parse_instant(value: str | int) -> Instant:
    """Parses an ``--at`` value; raises :class:`InvalidInstant` with one sentence."""
    if isinstance(value, bool):
        raise InvalidInstant(f"'{value}' is not an instant: {_HINT}")
    if isinstance(value, int):
        if value < 1:
            raise InvalidInstant(f"seq {value} is not an instant: seqs start at 1")
        return AtSeq(value)
    text = value.strip()
    if text.isdigit():
        seq = int(text)
        if seq < 1:
            raise InvalidInstant(f"seq {seq} is not an instant: seqs start at 1")
        return AtSeq(seq)
    if text.startswith("+"):
        if not _OFFSET.fullmatch(text):
            raise InvalidInstant(f"'{value}' is not an offset: {_HINT}")
        seconds = float(text[1:])
        return AtOffset(seconds)
    if _DATE.match(text):
        try:
            return AtTime(parse_time(text))
        except InvalidEvent:
            pass
    raise InvalidInstant(f"'{value}' is not an instant: {_HINT}")


def seq_for_instant(events: Sequence[Event], instant: Instant) -> int:
    """N for ``instant`` over a session's events in seq order (same rule as ``store.seq_at_time``).

    A time selects the longest prefix whose events all happened at or before it.
    """
    if isinstance(instant, AtSeq):
        return min(instant.seq, len(events))
    if not events:
        return 0
    at_ms = instant.at_ms if isinstance(instant, AtTime) else events[0].at_ms + round(instant.seconds * 1000)
    n = 0
    for event in events:
        if event.at_ms > at_ms:
            break
        n += 1
    return n
