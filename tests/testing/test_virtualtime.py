"""calltape's virtual-time loop (calltape.testing.virtualtime) and settle (calltape.loopclock): work off
the loop holds the clock, and the idle loop waits for it instead of spinning."""

from __future__ import annotations

import asyncio
import time
from typing import Any

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


def test_an_effects_log_reads_hold_the_clock(tmp_path: Any) -> None:
    """``calltape.effect`` decides from the log (a database read off the loop): on a virtual clock that
    read must not let the clock jump to the scenario's next timer (a scripted barge-in, a tool's timeout),
    or a heard-first effect's run would land at another instant from run to run."""
    import calltape

    loop = JumpingClockLoop()
    fired: list[float] = []

    async def scenario() -> tuple[Any, float]:
        async with calltape.connect(f"sqlite:///{tmp_path}/vt.db") as tape:
            call = await tape.start_call("vt-effect", agent="a")
            call.emit("agent.reply.started", {"reply": "r1"})
            call.emit("tool.call", {"reply": "r1", "call": "c1", "name": "charge", "arguments": {}})
            call.emit("agent.reply.done", {"reply": "r1"})
            loop.call_later(5.0, lambda: fired.append(loop.time()))  # the scenario's next timer

            async def charge() -> Any:
                async def action() -> dict[str, int]:
                    return {"charged": 40}

                return await calltape.effect("charge", "order-7", action, heard=True)

            t0 = loop.time()
            outcome = await call.run_tool("c1", "charge", {}, charge)
            elapsed = loop.time() - t0
            await call.end()
            return outcome.output, elapsed

    try:
        output, elapsed = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert output == {"charged": 40}
    assert (elapsed, fired) == (0.0, [])  # the clock stood still while the effect read the log
