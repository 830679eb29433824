"""The exploration keeps the framework's expected noise quiet, only in the runs with a barge-in or a
drop, only while it runs, counted; anything else still reaches the logs."""

from __future__ import annotations

import asyncio
import logging

import pytest

from calltape.errors import Interrupted
from calltape.testing.quiet import in_harness_run, quieted


def _log_expected_and_real() -> None:
    tools = logging.getLogger("calltape.runtime.tools")
    try:
        raise Interrupted("reply 'r1' was interrupted")
    except Interrupted as exc:
        tools.error("tool %s (call %s) raised %s", "charge", "c1", "Interrupted", exc_info=exc)
    try:
        raise ValueError("card declined")
    except ValueError as exc:
        tools.error("tool %s (call %s) raised %s", "charge", "c2", "ValueError", exc_info=exc)  # a real failure
    logging.getLogger("livekit.agents").warning("ToolError while executing tool")
    logging.getLogger("livekit.agents").warning("something else entirely")


async def test_only_expected_messages_of_landed_runs_are_silenced_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    filters_before = {n: list(logging.getLogger(n).filters) for n in ("livekit.agents", "calltape.runtime.tools")}

    async def run(landed: bool) -> None:
        in_harness_run(landed)
        _log_expected_and_real()

    with quieted() as silenced:
        await asyncio.create_task(run(False))  # the uninterrupted run: everything is news
        baseline = [r.getMessage() for r in caplog.records]
        caplog.clear()
        await asyncio.create_task(run(True))  # a run with a barge-in: the expected messages are quiet
        landed = [r.getMessage() for r in caplog.records]
    assert len(baseline) == 4
    assert landed == ["tool charge (call c2) raised ValueError", "something else entirely"]
    assert silenced == {"tool ": 1, "ToolError while executing tool": 1}
    # the filters came off: the logging configuration is as it was
    assert {n: list(logging.getLogger(n).filters) for n in filters_before} == filters_before
    caplog.clear()
    in_harness_run(True)
    _log_expected_and_real()
    assert len(caplog.records) == 4  # outside an exploration nothing is silenced
    in_harness_run(False)
