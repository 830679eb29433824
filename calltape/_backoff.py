"""Exponential backoff: the one schedule for waiting out an outage (the recorder's writer, a feed
subscription), doubling from a first delay up to a ceiling and starting over after a success."""

from __future__ import annotations


class Backoff:
    """Delays that double from ``initial`` up to ``maximum``; :meth:`reset` after a success."""

    __slots__ = ("_delay", "initial", "maximum")

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self._delay = initial

    def next(self) -> float:
        """The delay to wait now; the following one doubles (up to ``maximum``)."""
        delay = self._delay
        self._delay = min(delay * 2, self.maximum)
        return delay

    def reset(self) -> None:
        """Back to the first delay (the operation succeeded)."""
        self._delay = self.initial
