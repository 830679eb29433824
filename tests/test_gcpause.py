"""The GC pause around bulk builds: what it built leaves young, unscanned, and nothing is frozen."""

from __future__ import annotations

import gc

from calltape.gcpause import BULK, gc_paused


class Node:
    """A tracked object that can sit in a cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


def test_pause_hands_what_it_built_to_the_oldest_generation_and_collects_cycles_later() -> None:
    assert gc.isenabled()
    gc.collect()
    with gc_paused(BULK):
        assert not gc.isenabled()
        built = [{"n": [i]} for i in range(BULK)]
        a, b = Node(), Node()
        a.other, b.other = b, a
        del a, b  # a cycle that became garbage during the pause
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    young = {id(o) for o in gc.get_objects(generation=0)} | {id(o) for o in gc.get_objects(generation=1)}
    assert id(built) not in young and id(built[0]) not in young  # not left for a young scan
    assert gc.collect() >= 2  # the cycle is still found by a full collection


def test_pause_keeps_a_process_freeze_and_skips_small_batches() -> None:
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_paused(BULK):
            pass
        assert gc.get_freeze_count() == frozen  # a pre-fork server's frozen objects stay frozen
    finally:
        gc.unfreeze()
    with gc_paused(BULK - 1):
        assert gc.isenabled()
