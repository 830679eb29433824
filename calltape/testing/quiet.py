"""Keeping an exploration's output free of the framework's noise, without hiding a real failure.

A barge-in or a drop that the harness lands on purpose makes the frameworks log what they log for
any barge-in: LiveKit warns that its false-interruption resume cannot pause the offline speaker, that
a tool reported an error (calltape's guarded tool telling the LLM it was not run), that speech took
long to stop; calltape's own tool runner logs a tool interrupted by the caller; asyncio reports an
async generator closed on a cancelled task. Passing or failing, an exploration of a LiveKit agent
used to print some twenty of those.

:func:`quieted` silences exactly those messages, and only:

* from the runs with a barge-in or a drop (the uninterrupted run logs everything: there, such a
  message is news), told apart by a context variable each run sets for its own tasks;
* for the length of the exploration: the filters come off the loggers afterwards, leaving the
  logging configuration as it was;
* counted: :attr:`calltape.testing.explore.Exploration.silenced` says what was kept quiet, and how
  often, so nothing disappears without a trace.

Any other record (an unexpected exception, a tool that raised something else) goes through.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["EXPECTED", "Expected", "in_harness_run", "quieted"]


@dataclass(frozen=True, slots=True)
class Expected:
    """A log message that is an expected consequence of the harness's own barge-ins and drops."""

    logger: str
    start: str
    """How the message begins."""
    exception: tuple[str, ...] = ()
    """When not empty, the record must carry an exception of one of these class names."""
    anywhere: bool = False
    """Also in the uninterrupted run and outside a run's own tasks (asyncio's shutdown of async
    generators runs on the loop's): a message about the harness itself, not about the agent."""


EXPECTED: tuple[Expected, ...] = (
    # the harness's offline speaker has no pause: LiveKit says so at every session start, in every run
    Expected(
        "livekit.agents", "resume_false_interruption is enabled but audio output does not support pause", anywhere=True
    ),
    # a guarded tool reports "not run, the caller cut in" to LiveKit as a ToolError
    Expected("livekit.agents", "ToolError while executing tool"),
    Expected("livekit.agents", "tools still running when the interrupted speech timed out"),
    Expected("livekit.agents", "speech not done in time after interruption"),
    # a guarded tool waiting for its announcement was released by the barge-in (or the drop)
    Expected("calltape.runtime.tools", "tool ", exception=("Interrupted",)),
    # a framework's async generator closed on a task cancelled by the barge-in or the drop
    Expected(
        "asyncio",
        "an error occurred during closing of asynchronous generator",
        exception=("CancelledError", "GeneratorExit", "RuntimeError"),
        anywhere=True,
    ),
)

_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("calltape_harness_run", default=False)


def in_harness_run(landed: bool) -> None:
    """Marks the current task (and the tasks it starts) as a run of the harness, one with a barge-in or
    a drop when ``landed``: its expected framework messages are kept quiet."""
    _RUN.set(landed)


class _Filter(logging.Filter):
    def __init__(self, expected: list[Expected], counts: dict[str, int], lock: threading.Lock) -> None:
        super().__init__()
        self.expected = expected
        self.counts = counts
        self.lock = lock

    def filter(self, record: logging.LogRecord) -> bool:
        for e in self.expected:
            if not (e.anywhere or _RUN.get()):
                continue
            if not str(record.msg).startswith(e.start):
                continue
            if e.exception:
                kind = record.exc_info[0] if record.exc_info else None
                if kind is None or kind.__name__ not in e.exception:
                    continue
            with self.lock:
                self.counts[e.start] = self.counts.get(e.start, 0) + 1
            return False
        return True


@contextlib.contextmanager
def quieted(expected: tuple[Expected, ...] = EXPECTED) -> Iterator[dict[str, int]]:
    """Silences the ``expected`` messages while the block runs; yields the counts of what was silenced
    (by how the message begins). The filters are removed on exit."""
    counts: dict[str, int] = {}
    lock = threading.Lock()
    by_logger: dict[str, list[Expected]] = {}
    for e in expected:
        by_logger.setdefault(e.logger, []).append(e)
    installed = [(logging.getLogger(name), _Filter(items, counts, lock)) for name, items in by_logger.items()]
    for logger, f in installed:
        logger.addFilter(f)
    try:
        yield counts
    finally:
        for logger, f in installed:
            logger.removeFilter(f)
