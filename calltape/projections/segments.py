"""Snapshots as a small header beside append-only segments, in the store and in a process cache.

A one-blob snapshot is the whole frozen prefix of a call: saving one every 1,000 events rewrote the
call so far, and restoring one read and copied it all, so both grew with the call (issue 32 item
4). Here a snapshot is stored as two things:

* **segments**, one per freeze (:class:`~calltape.projections.snapshot.Segment`): immutable,
  content-addressed by a digest of their bytes, each written once, in the snapshot table under a
  negative ``seq`` derived from the digest (:func:`slot`), so erasure, redaction, tenancy and the
  Citus placement treat them as the snapshots they are;
* **the header row** at the snapshot's seq: the fold's scalars and live records (a handful of
  items, whatever the call's length), then a line ``{"segments": [[slot, key], ...]}``.

Saving writes the segments the store does not hold yet and the header, in one transaction under the
session's row lock, and only while the segments saved before are still stored: a redaction or an
erasure drops every snapshot row of the session under that lock, so a capture held across one (it
names segments the store lost) is refused, and a stored header always names segments the store holds
(what the cache adds is what the store has). Restoring reads the header
and takes each segment from a process-wide cache by key (:data:`CACHE`; content-addressed, so a
cached segment can never be stale), reading from the store only the ones it lacks, in one query.
A process that restores a call again (a resume, a handoff, a rebuild) so reads the header and the
tail, not the call. Any doubt (a missing segment, a key that does not match, lengths that do not
add up) is :class:`~calltape.errors.SnapshotMismatch`, and the caller folds from seq 1.

Saving writes the new segments and the header in one transaction where the store can
(``save_snapshot_over``: under the session's row lock, and only while the segments it builds on are
still stored). A store without the two segment methods (a test double that only
has ``save_snapshot`` and ``load_snapshot``) gets the inline blob (:meth:`Captured.to_bytes`), as before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final, Protocol, runtime_checkable

import orjson

from calltape.errors import SnapshotMismatch
from calltape.projections.fold import FOLD_VERSION, ContextFold
from calltape.projections.snapshot import Captured, Segment, SegmentIds, decode_segments, read_header

_REFS: Final = b'{"segments":'


@runtime_checkable
class SegmentStore(Protocol):
    """What saving segments needs of a store (:class:`~calltape.eventstore.queries.SqlEventStore` has it)."""

    async def load_snapshot_segments(self, session: str, version: int) -> Sequence[tuple[int, bytes]]:
        """Every stored segment of the session and fold version, as ``(slot, body)``."""

    async def save_snapshot_over(
        self, session: str, version: int, rows: Sequence[tuple[int, bytes]], kept: set[int]
    ) -> bool:
        """Stores a header and its new segments (``rows``) at once, only while the segment slots in
        ``kept`` are stored (False: the session was rewritten or erased since; nothing written)."""


def slot(key: str) -> int:
    """The ``seq`` a segment is stored under: negative (headers are at positive seqs), from its key."""
    return -1 - (int(key[:8], 16) & 0x7FFFFFFF)


class SegmentCache:
    """Segments by key, least recently used dropped first past ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._held = 0
        self._segments: OrderedDict[str, Segment] = OrderedDict()

    def get(self, key: str) -> Segment | None:
        """The cached segment with this key, or None."""
        segment = self._segments.get(key)
        if segment is not None:
            self._segments.move_to_end(key)
        return segment

    def put(self, segment: Segment) -> None:
        """Keeps a segment (a store holds it)."""
        key = segment.key
        if key in self._segments:
            self._segments.move_to_end(key)
            return
        self._segments[key] = segment
        self._held += segment.nbytes()
        while self._held > self.max_bytes and len(self._segments) > 1:
            _, old = self._segments.popitem(last=False)
            self._held -= old.nbytes()

    def clear(self) -> None:
        """Forgets every segment (the benchmarks measure a cold restore with it)."""
        self._segments.clear()
        self._held = 0
        _IDS.clear()


CACHE = SegmentCache(64 << 20)
"""The process's segment cache (64 MiB: about two 200k-event calls' frozen parts)."""

_IDS: OrderedDict[tuple[str, ...], SegmentIds] = OrderedDict()
"""The reply and call ids of a list of segments (by their keys), for the last few lists restored:
a restore of the same snapshot again builds no set of the whole call."""
_IDS_KEPT: Final = 32


def _ids(keys: tuple[str, ...], segments: list[Segment]) -> SegmentIds:
    found = _IDS.get(keys)
    if found is None:
        replies: set[str] = set()
        calls: set[str] = set()
        for segment in segments:
            r, c = segment.ids()
            replies.update(r)
            calls.update(c)
        found = _IDS[keys] = (frozenset(replies), frozenset(calls))
        if len(_IDS) > _IDS_KEPT:
            _IDS.popitem(last=False)
    else:
        _IDS.move_to_end(keys)
    return found


def header_bytes(captured: Captured) -> bytes:
    """The stored header: the capture's header line, then the keys of its segments."""
    refs = [[slot(s.key), s.key] for s in captured.segments]
    return captured.header + b"\n" + _REFS + orjson.dumps(refs) + b"}"


async def save(store: Any, session: str, captured: Captured) -> bool:
    """Saves a capture: its new segments and its header, or the inline blob for a store without segments.

    False when the store refused it: a segment saved before is no longer stored, so a redaction or an
    erasure removed it since the capture, which then holds what they removed (a live fold held across
    them). Its header is never written: this process's :data:`CACHE` would complete it with the old
    content (SPEC: a redacted value never comes back)."""
    if not isinstance(store, SegmentStore):
        await store.save_snapshot(session, captured.seq, FOLD_VERSION, captured.to_bytes())
        return True
    new = [s for s in captured.segments if not s.saved]
    kept = {slot(s.key) for s in captured.segments if s.saved}
    rows = [*((slot(s.key), s.body()) for s in new), (captured.seq, header_bytes(captured))]
    if not await store.save_snapshot_over(session, FOLD_VERSION, rows, kept):
        return False
    for segment in new:
        segment.saved = True
        CACHE.put(segment)
    return True


async def restore(store: Any, session: str, blob: bytes) -> ContextFold:
    """The fold a stored snapshot holds (a header with segments, or an inline blob).

    Raises :class:`SnapshotMismatch` for another fold version, damaged bytes or a missing segment."""
    end = blob.find(b"\n")
    if end < 0 or not blob.startswith(_REFS, end + 1):
        return ContextFold.from_snapshot(blob)
    header = read_header(memoryview(blob)[:end])
    try:
        refs = orjson.loads(memoryview(blob)[end + 1 + len(_REFS) : -1])
        keys = [str(key) for _, key in refs]
    except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
        raise SnapshotMismatch(f"the snapshot is damaged ({type(exc).__name__})") from None
    segments = [CACHE.get(key) for key in keys]
    if any(s is None for s in segments):
        if not isinstance(store, SegmentStore):
            raise SnapshotMismatch("the snapshot's segments are not in this store")
        bodies = dict(await store.load_snapshot_segments(session, FOLD_VERSION))
        for i, key in enumerate(keys):
            if segments[i] is None:
                body = bodies.get(slot(key))
                if body is None:
                    raise SnapshotMismatch("the snapshot is damaged (a segment is missing)")
                found = Segment.from_body(body, key)
                found.saved = True
                CACHE.put(found)
                segments[i] = found
    held = [s for s in segments if s is not None]
    fold = ContextFold()
    decode_segments(fold, header, held, _ids(tuple(keys), held))
    return fold
