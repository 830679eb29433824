"""calltape's virtual-time loop (calltape.testing.virtualtime) and settle (calltape.loopclock): work off
the loop holds the clock, and the idle loop waits for it instead of spinning."""

from __future__ import annotations

import asyncio
import time

from calltape.loopclock import settle
from calltape.testing.virtualtime import JumpingClockLoop, _JumpingSelector


def test_work_off_the_loop_holds_the_clock_and_the_loop_waits_without_spinning() -> None:
    loop = JumpingClockLoop()
    selects = 0
    real_select = _JumpingSelector.select

    def counted(self: _JumpingSelector, timeout: float | None = None) -> list:  # type: ignore[type-arg]
        nonlocal selects
        selects += 1
        return real_select(self, timeout)

    _JumpingSelector.select = counted  # type: ignore[method-assign]
    fired: list[float] = []

    def database_work() -> str:
        # a thread that needs the interpreter lock again and again, as aiosqlite's does
        for _ in range(200):
            time.sleep(0.0005)
        return "committed"

    async def scenario() -> tuple[str, float]:
        loop.call_later(5.0, lambda: fired.append(loop.time()))  # a harness timeout, pending throughout
        t0 = loop.time()
        done = await settle(asyncio.to_thread(database_work))
        return done, loop.time() - t0

    try:
        done, elapsed = loop.run_until_complete(scenario())
        assert (done, elapsed, fired) == ("committed", 0.0, [])  # the clock stood still meanwhile
        loop.run_until_complete(asyncio.sleep(10))  # and jumps again once nothing is under way
        assert fired == [5.0]
    finally:
        _JumpingSelector.select = real_select  # type: ignore[method-assign]
        loop.close()
    # about 0.1 s of work: the loop looked a few times per wakeup, not millions of times (spinning
    # starved the working thread of the interpreter lock: an exploration took 55 s instead of 1)
    assert selects < 1000, selects
