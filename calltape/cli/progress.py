"""Progress for long commands: a rich bar on a terminal, nothing at all when stderr is piped.

``import``, ``export`` and ``stats`` over many sessions can run for minutes; a person at a terminal
should see that they move (and how fast), while a script that captures stderr gets no escape codes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from calltape.cli.common import err


class Meter:
    """What a command reports as it goes; a no-op when progress is not shown."""

    def __init__(self, progress: Progress | None = None, task: TaskID | None = None) -> None:
        self._progress = progress
        self._task = task

    @property
    def shown(self) -> bool:
        """Whether a bar is on screen (a terminal)."""
        return self._progress is not None

    def update(
        self,
        *,
        completed: float | None = None,
        advance: float | None = None,
        total: float | None = None,
        note: str | None = None,
    ) -> None:
        """Moves the bar: to ``completed``, or by ``advance``; ``total`` once it is known; ``note``
        replaces the trailing text."""
        if self._progress is None or self._task is None:
            return
        fields: dict[str, Any] = {"note": note} if note is not None else {}  # (rich takes extra fields)
        self._progress.update(
            self._task,
            completed=completed,
            advance=advance,
            total=total,
            **fields,
        )


def shows_progress() -> bool:
    """A bar only for a person: stderr is a terminal and ``CALLTAPE_NO_PROGRESS`` is not set."""
    return err().is_terminal and not os.environ.get("CALLTAPE_NO_PROGRESS")


@contextlib.contextmanager
def meter(description: str, total: float | None, *, count: bool = False) -> Iterator[Meter]:
    """A progress bar on stderr for the duration of the block (``count``: show "12/40" items)."""
    if not shows_progress():
        yield Meter()
        return
    columns = [
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn() if count else TaskProgressColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"),
    ]
    with Progress(*columns, console=err(), transient=True) as progress:
        task = progress.add_task(description, total=total, note="")
        yield Meter(progress, task)
