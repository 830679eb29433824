"""Snapshots of a live call, saved as it runs, so the first resume after a drop reads only the tail.

Without them, only :func:`~calltape.projections.build_context` saved snapshots, when something read
the session: the first resume of an hour-long call after a drop folded the whole call (issue 32 item 4).

**What is snapshotted is the log, not the live fold.** The recorder tells every committed batch to
its ``on_commit`` observers, with the seqs the store gave; one router per recorder hands each
session's committed events to its :class:`LiveSnapshots`, which only keeps a reference (the voice
loop's ``emit`` does nothing more than before). Once ``every`` events (the
:class:`~calltape.projections.SnapshotPolicy`) committed past the previous snapshot, a background
task folds them into a *shadow* fold, captures it at the first clean point past the threshold and
saves it in the segment form (:mod:`calltape.projections.segments`: only the new segments and a
small header). The shadow fold is the store's own order and seqs, so nothing the live fold may hold
and the log does not (an event an interceptor holds back, a write the store refused, a duplicate)
can reach a snapshot, and freezing it never thaws the live fold under the runtime's queries.

**Safety.** Events this process did not commit (another writer, a resume elsewhere, an
after-the-fact redaction's ``session.redacted``) show as a gap in the seqs: the shadow fold is
dropped and rebuilt from the store (from its newest snapshot) at the next save. Before saving, the
session's summary is read: an erased (or another tenant's) session stops the snapshots for good,
and a log longer than what this process was told it committed skips the save (someone else wrote:
the next commit shows the gap). A redaction
or erasure committed by this process since the shadow fold was built drops it too. The store keeps
the rest: a snapshot row is inserted from the session's own row (its tenant; nothing for an erased
session), and an existing row is never overwritten (a writer of an older epoch cannot replace a
newer snapshot; what it saves is the log's prefix it committed itself).

**Cost.** About one more fold of each event, in batches of at most :data:`SLICE` events between
which the loop runs, and a capture per ``every`` events. A failure is logged by its type and never
reaches the call.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from calltape.errors import SessionNotFound
from calltape.events import Event
from calltape.eventstore.store import _ErasuresHere
from calltape.projections import segments
from calltape.projections.context import DEFAULT_POLICY, SnapshotPolicy, _fold_with_snapshots, build_context
from calltape.projections.fold import ContextFold
from calltape.projections.instant import AtSeq
from calltape.projections.snapshot import Captured

if TYPE_CHECKING:
    from calltape.eventstore.recorder import Recorder

log = logging.getLogger(__name__)

SLICE: Final = 256
"""Events folded into the shadow fold between two turns of the event loop."""


class _Router:
    """The one ``on_commit`` observer of a recorder: hands each session's committed events to its
    :class:`LiveSnapshots` (one dict look-up per event, whatever the number of calls)."""

    def __init__(self) -> None:
        self.calls: weakref.WeakValueDictionary[str, LiveSnapshots] = weakref.WeakValueDictionary()

    def __call__(self, events: Sequence[Event]) -> None:
        calls = self.calls
        if not calls:
            return
        touched: list[LiveSnapshots] = []
        for event in events:
            snap = calls.get(event.session)
            if snap is not None:
                if snap.committed(event):
                    touched.append(snap)
        for snap in touched:
            snap.maybe_save()


def _router(recorder: Recorder) -> _Router:
    """The recorder's one router: found among its commit observers (it lives as long as the recorder,
    and no registry outside the recorder maps recorders to routers)."""
    for observer in recorder.on_commit:
        if isinstance(observer, _Router):
            return observer
    router = _Router()
    recorder.on_commit.append(router)
    return router


class LiveSnapshots:
    """Saves snapshots of one live call's session as its events commit (see the module docstring).

    Made by :class:`~calltape.runtime.CallSession` (``snapshots=`` its policy, None for none);
    :meth:`stop` ends it, :attr:`saved` and :attr:`folded` say what it did."""

    def __init__(
        self, recorder: Recorder, session: str, policy: SnapshotPolicy = DEFAULT_POLICY, *, base: int = 0
    ) -> None:
        self.store = recorder.store
        self._recorder = recorder
        self.session = session
        self.every = max(1, policy.every)
        self.saved = 0
        """Snapshots saved so far."""
        self.last_seq = base
        """The seq of the newest snapshot this call saved (at first: where the call's fold began)."""
        self.folded = 0
        """Events folded into the shadow fold (what the snapshots cost, in events)."""
        self._shadow: ContextFold | None = None
        self._pending: list[Event] = []
        self._next: int | None = None  # the seq the next committed event must have
        self._gen = 0  # moves whenever the shadow fold is dropped (a gap, a rewrite)
        self._erasures = _ErasuresHere.count
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._router = _router(recorder)
        self._router.calls[session] = self

    # -- told by the router (the writer task) ------------------------------------------------

    def committed(self, event: Event) -> bool:
        """Keeps a committed event of the session; True once a save may be due."""
        seq = event.seq
        if seq is None or self._stopped:
            return False
        if self._next is not None and seq != self._next:
            if seq < self._next:
                return False  # a duplicate the store kept at its first seq
            # someone else wrote in between: rebuild the shadow fold from the store
            self._drop()
        self._next = seq + 1
        self._pending.append(event)
        return True

    def maybe_save(self) -> None:
        """Starts the background save once ``every`` events committed past the last snapshot."""
        if self._stopped or (self._task is not None and not self._task.done()) or not self._pending:
            return
        if self._pending[-1].seq is not None and self._pending[-1].seq < self.last_seq + self.every:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = loop.create_task(self._run(), name="calltape-live-snapshot")

    # -- the background save ------------------------------------------------------------------

    def _drop(self) -> None:
        self._gen += 1
        self._shadow = None
        self._pending = []

    async def _run(self) -> None:
        try:
            await self._save_due()
        except SessionNotFound:
            self.stop()  # erased meanwhile
        except Exception as exc:  # a snapshot is a cache: never fail the call, never log content
            log.warning("calltape: a live snapshot of session %s was not saved (%s)", self.session, type(exc).__name__)

    async def _save_due(self) -> None:
        if _ErasuresHere.count != self._erasures:  # this process erased or rewrote something: rebuild
            self._erasures = _ErasuresHere.count
            self._shadow = None
        gen = self._gen
        shadow = self._shadow
        if shadow is None:
            if not self._pending:
                return
            shadow = await self._anchor(self._pending[0].seq or 1)
            if shadow is None or gen != self._gen:
                return
            self._shadow = shadow
        captured: Captured | None = None
        while self._pending and not self._stopped:
            events, self._pending = self._pending, []
            events = [e for e in events if (e.seq or 0) > shadow.seq]
            if events and events[0].seq != shadow.seq + 1:
                self._drop()  # not the events right after the shadow fold: rebuild it
                return
            for start in range(0, len(events), SLICE):
                part = events[start : start + SLICE]
                got = _fold_with_snapshots(shadow, part, captured.seq if captured else self.last_seq, self.every)
                shadow._seen.clear()  # committed events are unique by id: the shadow needs no set of the call
                self.folded += len(part)
                if got is not None:
                    captured = got
                await asyncio.sleep(0)  # let the voice loop run between slices
            if gen != self._gen:
                return  # dropped meanwhile
        if captured is None or self._stopped or gen != self._gen:
            return
        await self._save(captured)

    async def _anchor(self, first: int) -> ContextFold | None:
        """The shadow fold just before ``first``: empty at the start of the session, otherwise the
        store's (its newest snapshot and the tail after it)."""
        if first <= 1:
            return ContextFold(self.session)
        fold = await build_context(self.store, self.session, AtSeq(first - 1), snapshots=None)
        return fold if fold.seq == first - 1 else None  # else the store does not hold it: leave it

    async def _save(self, captured: Captured) -> None:
        gen = self._gen
        info = await self.store.session_info(self.session)
        if info is None:
            self.stop()  # erased, or not this store's to see: never again
            return
        if _ErasuresHere.count != self._erasures:
            self._drop()  # this process erased or rewrote something: rebuild from the store first
            return
        if self._next is not None and info.last_seq >= self._next:
            # A commit of this call not told yet, or someone else wrote: once the recorder is told of
            # everything, ask again. Still longer: someone else wrote (this call's next commit shows the
            # gap and the shadow fold is rebuilt from the store); not now.
            await self._recorder.flush()
            info = await self.store.session_info(self.session)
            if info is None:
                self.stop()
                return
        if self._next is None or info.last_seq >= self._next or gen != self._gen:
            return
        if not await segments.save(self.store, self.session, captured):
            self._drop()  # a segment it builds on was redacted or erased since: rebuild from the store
            self._task = None
            return
        self.saved += 1
        self.last_seq = captured.seq
        self._task = None
        self.maybe_save()  # what committed meanwhile may be due already

    # -- control ------------------------------------------------------------------------------

    def stop(self) -> None:
        """No more snapshots for this call (a save under way still finishes or is dropped)."""
        self._stopped = True
        self._pending = []
        self._shadow = None
        if self._router.calls.get(self.session) is self:
            del self._router.calls[self.session]

    async def settled(self) -> None:
        """Waits for the save under way, if any (tests; closing a call does not need it)."""
        while (task := self._task) is not None and not task.done():
            await asyncio.shield(task)
