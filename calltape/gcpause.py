"""Pausing the cyclic garbage collector around bulk work on acyclic records.

Replaying a log builds hundreds of thousands of small acyclic objects (rows, events, dicts); each
collection they trigger rescans everything already built, which costs a third of a 100k-event read.
Reference counting still frees everything; only the cycle detector waits until the batch is done.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Final

BULK: Final = 4096
"""Below this many objects a pause is not worth it."""


@contextlib.contextmanager
def gc_paused(count: int) -> Iterator[None]:
    """Pauses the cyclic GC while ``count`` objects are built in bulk (they are not garbage)."""
    pause = count >= BULK and gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            gc.enable()
