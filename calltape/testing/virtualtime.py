"""A virtual-time event loop for tests: its clock stands still while it works and, when nothing is
ready, jumps straight to its next timer, so a scripted call that waits on timers (playout, endpointing,
quiet periods) runs in no wall time. Work done off the loop (a database thread) does not move the
clock: calltape's own waits on such work hold it (:meth:`JumpingClockLoop.hold_clock`), and the idle loop
then waits for that work for real, instead of spinning (:mod:`calltape.loopclock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

__all__ = ["JumpingClockLoop", "run_in_virtual_time"]

T = TypeVar("T")

_HELD_WAIT = 0.05
"""Seconds of real time a held, idle loop waits for a wakeup before looking again."""


class JumpingClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock stands still while it works and, when it has nothing ready, jumps
    straight to its next timer, unless the clock is held (:meth:`hold_clock`)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.held = 0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        """The virtual clock (seconds since the loop was made, plus every jump)."""
        return self.now

    @contextlib.contextmanager
    def hold_clock(self) -> Iterator[None]:
        """While held, an idle loop waits for real instead of jumping: work off the loop (a database
        thread) is under way, and its completion wakes the loop (:func:`calltape.loopclock.settle`)."""
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1


class _JumpingSelector(selectors.BaseSelector):
    def __init__(self, loop: JumpingClockLoop) -> None:
        self._loop = loop
        self._real = selectors.DefaultSelector()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            return self._real.select(None)  # nothing scheduled: wait for a wakeup from a thread
        if self._loop.held:
            # work off the loop is under way: wait for its wakeup, the clock standing still (bounded,
            # so a wakeup that never comes only slows the loop)
            return self._real.select(_HELD_WAIT)
        self._loop.now += timeout  # idle: jump to the next timer
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


async def run_in_virtual_time(work: Callable[[], Awaitable[T]]) -> T:
    """Runs ``work()`` to completion on a :class:`JumpingClockLoop` of its own, in a thread, and
    returns its result (the calling loop stays free meanwhile)."""

    def run() -> T:
        loop = JumpingClockLoop()
        try:
            return loop.run_until_complete(_awaited(work))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    return await asyncio.to_thread(run)


async def _awaited(work: Callable[[], Awaitable[T]]) -> T:
    return await work()
