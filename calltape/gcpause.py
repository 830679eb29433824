"""Pausing the cyclic garbage collector around bulk work on acyclic records.

Replaying a log builds hundreds of thousands of small acyclic objects (rows, events, dicts); each
collection they trigger rescans everything already built, which costs a third of a 100k-event read.
Reference counting still frees everything; only the cycle detector waits until the batch is done.

What the batch built is kept by its caller (a read's events, a fold's state): when the pause ends it
is handed to the oldest generation unscanned. Left young, the first collection after the pause scanned
all of it at once, cold in the cache (40 ms after a 100k-event read, more than the raw fetch's every
collection together), only to move it on to where it ends up anyway.
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
    """Pauses the cyclic GC while ``count`` objects are built in bulk (they are not garbage), then
    moves every young object to the oldest generation without scanning it (see the module's docstring).

    ``gc.freeze()`` then ``gc.unfreeze()`` is that move (two list splices); it is skipped when the
    process has frozen objects of its own (a pre-fork server's), which ``unfreeze`` would release. A
    cycle that became garbage while young waits for the next full collection instead of a young one."""
    pause = count >= BULK and gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
