"""Waiting for work done off the event loop without letting a virtual clock skip ahead.

Test harnesses such as LiveKit's virtual-time loop run a scripted call in no wall time: their loop's
clock stands still while it has work and, when it has nothing ready, jumps straight to its next
timer. A coroutine awaiting a database commit (a SQLite thread, a socket) leaves such a loop idle,
so its clock jumps, possibly to the test's own timeout, while the commit is still on its way.
:func:`settle` keeps such a loop busy until the awaited work is done. On a loop whose clock is the
real monotonic clock it is a plain ``await``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["settle", "virtual_clock"]

T = TypeVar("T")

_TOLERANCE = 1.0
"""A real loop's ``time()`` is ``time.monotonic()``; a virtual clock is far from it."""


def virtual_clock(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """Whether the (running) loop keeps a clock of its own instead of the monotonic clock."""
    loop = loop or asyncio.get_running_loop()
    return abs(loop.time() - time.monotonic()) > _TOLERANCE


async def settle(aw: Awaitable[T]) -> T:
    """``await aw``; on a virtual-clock loop, without letting its clock jump while the work happens off
    the loop. A loop that can hold its clock (``hold_clock()``, as calltape's own
    :class:`~calltape.testing.virtualtime.JumpingClockLoop` can) waits for the work for real meanwhile;
    any other is kept busy, yielding until the work is done (which spins: the thread doing the work then
    waits for the interpreter lock behind this one)."""
    loop = asyncio.get_running_loop()
    if not virtual_clock(loop):
        return await aw
    hold = getattr(loop, "hold_clock", None)
    if hold is not None:
        with hold():
            return await aw
    future = asyncio.ensure_future(aw)
    try:
        # yielding is the point: waiting on an Event would leave the loop idle
        while not future.done():  # noqa: ASYNC110
            await asyncio.sleep(0)
    except asyncio.CancelledError:
        future.cancel()
        raise
    return future.result()
