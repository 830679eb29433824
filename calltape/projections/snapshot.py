"""The snapshot codec: a :class:`~calltape.projections.fold.ContextFold` to bytes and back.

**Settled items are stored already rendered.** An item is *settled* when nothing but an event that
names it could change it: a user message a later reply closed, a handoff, a reply that is not the
latest one and has nothing generating, waiting to be heard or in progress. The longest settled
prefix of the items is *frozen*: kept as bytes, twice -- its native items (what :meth:`native`
returns) and its records (named fields, to rebuild the objects) -- plus the ids of its replies and
calls. A restore parses only the header (the live items, a handful) and those ids; the frozen bytes
are used as they are: :meth:`ContextFold.native` decodes the rendered items with one
``orjson.loads``, and a later snapshot reuses them without encoding anything again. Restoring and
folding a tail so cost the tail, not the call.

An event that names a frozen reply or call (a late ``heard``, a result that lands after a
cancellation, a call joining an old reply), a ``session.started`` (it can change the modality), or
a query over every call or reply, *thaws* the fold first: the records are decoded back into objects
and the fold continues exactly as if it had never been frozen. That is rare, and costs the call's
length once.

**Layout** (version 3; the lines of version 2). Five lines, each one compact JSON document (JSON never
holds a raw newline):

1. the header: ``{"v": 3, ...named scalars..., "live": [records], "frozen": {"items", "bytes"}}``;
2. the frozen native items, a JSON array;
3. the frozen records, a JSON array of ``{"kind": "user"|"reply"|"handoff", ...}`` objects (a reply
   record holds its calls);
4. the frozen reply ids, 5. the frozen call ids.

The header names every field, and records every field they carry: there is no positional decoding.
``frozen.bytes`` gives the length of lines 2-5, so a truncated snapshot is refused at restore. A
snapshot of another :data:`FOLD_VERSION` (the v0.1 layout was version 1) is refused with
:class:`SnapshotMismatch`; the store keys snapshots by version, so callers fold from seq 1 instead.

Encoding is deterministic: a fold restored from a snapshot and fed the tail encodes to the same
bytes as the full fold (the property tests check it), because frozen lines are concatenations of
per-item encodings and the settled prefix depends on the state alone.

**Segments.** Each freeze adds one :class:`Segment`: the four parts it appended to the frozen lines.
Segments never change once made, so a store keeps them once, content-addressed, and a snapshot
stores only its header and the keys of its segments (:mod:`calltape.projections.segments`); the
blob above is the same state with the segments written inline. :func:`decode_segments` restores
from the header and the segments.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final, Protocol

import orjson

from calltape.errors import SnapshotMismatch
from calltape.gcpause import gc_paused
from calltape.projections.native import NativeItem, items_json
from calltape.projections.records import Call, Handoff, Item, Reply, User


class ContextFold(Protocol):
    """The fold's state this codec reads and writes: :class:`~calltape.projections.fold.ContextFold`
    matches it, and naming the shape here keeps the codec from importing the fold that uses it."""

    session: str | None
    seq: int
    last_clean_seq: int
    agent: str | None
    epoch: int
    modality: str
    instructions: str
    counters: dict[str, int]
    _count: int
    _items: list[Item]
    _replies: dict[str, Reply]
    _calls: dict[str, Call]
    _cur_user: User | None
    _last_reply: Reply | None
    _interim: str | None
    _flags: set[str]
    _generating: set[str]
    _unheard: set[str]
    _open_calls: set[str]
    _ncalls: int
    _frozen: Frozen | None

    def _refresh_all(self) -> None: ...


FOLD_VERSION: Final = 3
"""Bump whenever a rule of the fold or this layout changes: snapshots of another version are
refused and rebuilt. 1 was v0.1's positional layout; 3 stores the frozen part as segments."""


_REPLY_FIELDS: Final = (
    "started",
    "done",
    "parts",
    "has_text",
    "interrupted",
    "heard",
    "speech_started",
    "speech_ended",
)
_CALL_FIELDS: Final = (
    "started",
    "has_result",
    "output",
    "error",
    "cancel_reason",
    "cancel_outcome",
    "has_progress",
    "progress",
)
_LINES: Final = 5


class Frozen:
    """The settled prefix of a fold, as bytes (see the module docstring).

    Each ``*_chunks`` list holds the inner parts (no brackets, never empty) of JSON arrays whose
    concatenation with commas is the whole array. Chunks are only ever appended or merged, never
    changed: a :class:`Captured` snapshot keeps a copy of the lists it saw.
    """

    __slots__ = (
        "call_chunks",
        "calls",
        "items",
        "native_chunks",
        "record_chunks",
        "replies",
        "reply_chunks",
        "segments",
    )

    def __init__(self) -> None:
        self.items = 0
        self.native_chunks: list[bytes | memoryview] = []
        self.record_chunks: list[bytes | memoryview] = []
        self.reply_chunks: list[bytes | memoryview] = []
        self.call_chunks: list[bytes | memoryview] = []
        self.replies = Ids()
        self.calls = Ids()
        self.segments: list[Segment] = []

    def add(self, segment: Segment, *, ids: bool = True) -> None:
        """Appends a segment's parts to the frozen lines (the segment's items are already counted);
        ``ids=False``: its ids are in the bases already."""
        for chunks, part in zip(
            (self.native_chunks, self.record_chunks, self.reply_chunks, self.call_chunks), segment.parts, strict=True
        ):
            if len(part):
                chunks.append(part)
        if ids:
            replies, calls = segment.ids()
            self.replies.update(replies)
            self.calls.update(calls)
        self.segments.append(segment)

    def native(self) -> list[NativeItem]:
        """The frozen items rendered (fresh objects on every call)."""
        return _load_array(self.native_chunks, merge=True)

    def names(self, data: Any) -> bool:
        """Whether an event's ``data`` names a frozen reply or call (then the fold must thaw)."""
        try:
            return data.get("reply") in self.replies or data.get("call") in self.calls
        except (AttributeError, TypeError):  # malformed data: thaw, and let the handler judge it
            return True


class Ids:
    """The ids of frozen replies (or calls): an immutable base shared by every fold restored from the
    same segments (built once per process, see :mod:`calltape.projections.segments`), and the ids
    this fold froze since. Restoring so costs no set of the whole call."""

    __slots__ = ("base", "own")

    def __init__(self, base: frozenset[str] = frozenset()) -> None:
        self.base = base
        self.own: set[str] = set()

    def __contains__(self, value: object) -> bool:
        return value in self.own or value in self.base

    def update(self, ids: list[str]) -> None:
        """Adds ids frozen by this fold."""
        self.own.update(ids)


SegmentIds = tuple[frozenset[str], frozenset[str]]
"""The reply ids and the call ids a list of segments froze, as sets (what a restore checks against)."""


class Segment:
    """What one freeze added to the frozen lines: four inner parts (native items, records, reply ids,
    call ids; each may be empty), identified by a digest of their bytes. Never changed once made."""

    __slots__ = ("_ids", "_key", "items", "parts", "saved")

    def __init__(
        self,
        items: int,
        parts: tuple[bytes | memoryview, ...],
        ids: tuple[list[str], list[str]] | None = None,
        key: str | None = None,
    ) -> None:
        self.items = items
        self.parts = parts
        self._ids = ids
        self._key = key
        self.saved = False
        """Whether a store holds it (set by whoever saved it or loaded it)."""

    def lines(self) -> bytes:
        """The items count, then each part as a whole JSON array, one per line."""
        return b"\n".join([str(self.items).encode(), *(b"[" + bytes(p) + b"]" for p in self.parts)])

    @property
    def key(self) -> str:
        """A digest of :meth:`lines` (hex): the segment's identity, in the store and in a cache."""
        if self._key is None:
            self._key = hashlib.blake2b(self.lines(), digest_size=16).hexdigest()
        return self._key

    def body(self) -> bytes:
        """The stored form: the key, then :meth:`lines`."""
        return self.key.encode() + b"\n" + self.lines()

    def nbytes(self) -> int:
        """Bytes held (what a cache counts)."""
        return sum(len(p) for p in self.parts)

    def ids(self) -> tuple[list[str], list[str]]:
        """The reply and call ids it froze (decoded once)."""
        if self._ids is None:
            replies = orjson.loads(b"[" + bytes(self.parts[2]) + b"]")
            calls = orjson.loads(b"[" + bytes(self.parts[3]) + b"]")
            if not isinstance(replies, list) or not isinstance(calls, list):
                raise SnapshotMismatch("the snapshot is damaged (segment ids)")
            self._ids = (replies, calls)
        return self._ids

    @classmethod
    def from_body(cls, body: bytes, key: str) -> Segment:
        """Reads :meth:`body` output; refuses another key or a damaged body."""
        view = memoryview(body)
        lines = body.split(b"\n")
        if len(lines) != _LINES + 1 or lines[0].decode(errors="replace") != key:
            raise SnapshotMismatch("the snapshot is damaged (segment)")
        try:
            items = int(lines[1])
        except ValueError:
            raise SnapshotMismatch("the snapshot is damaged (segment)") from None
        parts: list[memoryview] = []
        pos = len(lines[0]) + len(lines[1]) + 2
        for line in lines[2:]:
            if line[:1] != b"[" or line[-1:] != b"]":
                raise SnapshotMismatch("the snapshot is damaged (segment)")
            parts.append(view[pos + 1 : pos + len(line) - 1])
            pos += len(line) + 1
        return cls(items, tuple(parts), key=key)


def _inner(value: list[Any]) -> bytes:
    return orjson.dumps(value)[1:-1]


def _joined(chunks: list[bytes | memoryview]) -> bytes:
    return b"[" + b",".join(chunks) + b"]"


def _load_array(chunks: list[bytes | memoryview], *, merge: bool = False) -> list[Any]:
    blob = _joined(chunks)
    if merge and len(chunks) > 1:
        chunks[:] = [blob[1:-1]]
    try:
        with gc_paused(len(blob) // 64):
            value = orjson.loads(blob)
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, list):
        raise SnapshotMismatch("the snapshot is damaged (frozen items)")
    return value


def frozen_native_chunks(f: ContextFold) -> list[bytes | memoryview]:
    """The frozen items rendered, as chunks whose comma-joined concatenation is the inner part of a
    JSON array (a copy of the list; chunks never change)."""
    return [] if f._frozen is None else list(f._frozen.native_chunks)


# -- records ----------------------------------------------------------------------------------


def _call_record(c: Call) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": c.id,
        "name": c.name,
        "arguments": c.arguments,
        "seq": c.seq,
        "order": c.order,
        "included": c.included,
    }
    for name in _CALL_FIELDS:
        rec[name] = getattr(c, name)
    return rec


def _record(item: Item) -> dict[str, Any]:
    if isinstance(item, Reply):
        rec: dict[str, Any] = {"kind": "reply", "id": item.id, "seq": item.seq}
        for name in _REPLY_FIELDS:
            rec[name] = getattr(item, name)
        rec["calls"] = [_call_record(c) for c in item.calls]
        return rec
    if isinstance(item, User):
        return {"kind": "user", "seq": item.seq, "parts": item.parts}
    return {"kind": "handoff", "seq": item.seq, "from": item.from_, "to": item.to}


def _from_record(rec: dict[str, Any]) -> Item:
    kind = rec["kind"]
    if kind == "user":
        return User(rec["seq"], list(rec["parts"]))
    if kind == "handoff":
        return Handoff(rec["seq"], rec["from"], rec["to"])
    if kind != "reply":
        raise ValueError(kind)
    r = Reply(rec["id"], rec["seq"])
    for name in _REPLY_FIELDS:
        setattr(r, name, rec[name])
    for crec in rec["calls"]:
        c = Call(crec["id"], crec["name"], crec["arguments"], r, crec["seq"], crec["included"], crec["order"])
        for name in _CALL_FIELDS:
            setattr(c, name, crec[name])
        r.calls.append(c)
    return r


# -- freezing and thawing ---------------------------------------------------------------------


def _settled(f: ContextFold, item: Item) -> bool:
    if isinstance(item, Reply):
        if item is f._last_reply or item.id in f._generating or item.id in f._unheard:
            return False
        open_calls = f._open_calls
        return not any(c.id in open_calls for c in item.calls)
    if isinstance(item, User) and item is f._cur_user:
        last = f._last_reply
        return last is not None and last.seq > item.seq  # a later reply closed it: it cannot grow
    return True


def freeze(f: ContextFold) -> None:
    """Moves the settled prefix of the live items into the frozen bytes."""
    items = f._items
    k = 0
    for item in items:
        if not _settled(f, item):
            break
        k += 1
    if k == 0:
        return
    frozen = f._frozen
    if frozen is None:
        frozen = f._frozen = Frozen()
    settled = items[:k]
    rendered: list[NativeItem] = []
    items_json(settled, rendered)
    reply_ids: list[str] = []
    call_ids: list[str] = []
    for item in settled:
        if isinstance(item, Reply):
            reply_ids.append(item.id)
            del f._replies[item.id]
            for c in item.calls:
                call_ids.append(c.id)
                del f._calls[c.id]
    parts = (
        _inner(rendered) if rendered else b"",
        _inner([_record(item) for item in settled]),
        _inner(reply_ids) if reply_ids else b"",
        _inner(call_ids) if call_ids else b"",
    )
    frozen.add(Segment(k, parts, (reply_ids, call_ids)))
    frozen.items += k
    del items[:k]


def thaw(f: ContextFold) -> None:
    """Decodes the frozen records back into objects: the fold is whole again."""
    frozen = f._frozen
    if frozen is None:
        return
    records = _load_array(frozen.record_chunks)
    try:
        with gc_paused(len(records) * 4):
            items = [_from_record(rec) for rec in records]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SnapshotMismatch(f"the snapshot is damaged ({type(exc).__name__})") from None
    replies: dict[str, Reply] = {}
    calls: list[Call] = []
    cur = f._cur_user
    for item in items:
        if isinstance(item, Reply):
            replies[item.id] = item
            calls.extend(item.calls)
        elif isinstance(item, User) and cur is not None and item.seq == cur.seq:
            f._cur_user = item  # the restored stand-in of a closed user message gives way to the real one
    calls.extend(f._calls.values())
    calls.sort(key=lambda c: c.order)
    replies.update(f._replies)
    f._replies = replies
    f._calls = {c.id: c for c in calls}
    f._items[:0] = items
    f._frozen = None
    f._refresh_all()


# -- the bytes ---------------------------------------------------------------------------------


class Captured:
    """A snapshot taken at one instant, turned into bytes only when needed.

    Capturing costs the live items and the newly settled ones; :meth:`to_bytes` joins the frozen
    chunks (a copy, no encoding). The build of a context captures at every clean point ``every``
    events apart but saves only the last one.
    """

    __slots__ = ("chunks", "header", "segments", "seq")

    def __init__(
        self, seq: int, header: bytes, chunks: list[list[bytes | memoryview]], segments: list[Segment]
    ) -> None:
        self.seq = seq
        self.header = header
        self.chunks = chunks
        self.segments = segments

    def to_bytes(self) -> bytes:
        """The snapshot bytes (see the module docstring for the layout)."""
        return b"\n".join([self.header, *(_joined(chunks) for chunks in self.chunks)])


def capture(f: ContextFold) -> Captured:
    """Freezes the settled prefix and captures the fold's state as it is now."""
    freeze(f)
    frozen = f._frozen or Frozen()
    cur = f._cur_user
    last = f._last_reply
    header: dict[str, Any] = {
        "v": FOLD_VERSION,
        "session": f.session,
        "seq": f.seq,
        "count": f._count,
        "last_clean_seq": f.last_clean_seq,
        "agent": f.agent,
        "epoch": f.epoch,
        "modality": f.modality,
        "instructions": f.instructions,
        "counters": dict(f.counters),
        "interim": f._interim,
        "flags": sorted(f._flags),
        "calls_seen": f._ncalls,
        "cur_user_seq": None if cur is None else cur.seq,
        "last_reply": None if last is None else last.id,
        "live": [_record(item) for item in f._items],
    }
    chunks = [
        list(frozen.native_chunks),
        list(frozen.record_chunks),
        list(frozen.reply_chunks),
        list(frozen.call_chunks),
    ]
    # the length of each joined line: brackets, chunks, commas between them
    header["frozen"] = {"items": frozen.items, "bytes": _lengths(chunks)}
    # encoded now: the live records share lists (a reply's parts) that later events extend
    return Captured(f.seq, orjson.dumps(header), chunks, list(frozen.segments))


def _lengths(lines: list[list[bytes | memoryview]]) -> list[int]:
    """The length of each joined line: brackets, chunks, commas between them."""
    return [2 + sum(len(c) for c in line) + max(0, len(line) - 1) for line in lines]


def encode(f: ContextFold) -> bytes:
    """The fold state (but the seen ids) as bytes."""
    return capture(f).to_bytes()


def decode(f: ContextFold, blob: bytes) -> None:
    """Restores :func:`encode` output into the fresh fold ``f``; refuses another version."""
    view = memoryview(blob)
    end = blob.find(b"\n")
    header = read_header(view[: end if end >= 0 else len(blob)])
    try:
        segments = _inline_segment(header, view, end)
        _restore(f, header, segments)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, orjson.JSONDecodeError) as exc:
        raise SnapshotMismatch(f"the snapshot is damaged ({type(exc).__name__})") from None


def read_header(line: bytes | memoryview) -> dict[str, Any]:
    """The header line, parsed; refuses another version."""
    try:
        header = orjson.loads(line)
        version = header.get("v") if isinstance(header, dict) else None
    except orjson.JSONDecodeError:
        version = None
    if version != FOLD_VERSION:
        raise SnapshotMismatch(
            f"the snapshot was written by fold version {version}, this calltape folds version {FOLD_VERSION}"
        )
    assert isinstance(header, dict)
    return header


def decode_segments(
    f: ContextFold, header: dict[str, Any], segments: list[Segment], ids: SegmentIds | None = None
) -> None:
    """Restores a header (:func:`read_header`) and the segments it names into the fresh fold ``f``;
    ``ids``: the segments' reply and call ids, when the caller holds them as sets already."""
    try:
        frozen = header["frozen"]
        lines: list[list[bytes | memoryview]] = [[], [], [], []]
        for segment in segments:
            for line, part in zip(lines, segment.parts, strict=True):
                if len(part):
                    line.append(part)
        if sum(s.items for s in segments) != int(frozen["items"] or 0) or _lengths(lines) != frozen["bytes"]:
            raise ValueError("segments")
        _restore(f, header, segments, ids)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, orjson.JSONDecodeError) as exc:
        raise SnapshotMismatch(f"the snapshot is damaged ({type(exc).__name__})") from None


def _inline_segment(s: dict[str, Any], view: memoryview, end: int) -> list[Segment]:
    """The frozen lines of an inline blob, as one segment (none when nothing is frozen)."""
    lengths = s["frozen"]["bytes"]
    if len(lengths) != _LINES - 1 or end < 0:
        raise ValueError("lines")
    lines: list[memoryview] = []
    pos = end + 1
    for length in lengths:
        line = view[pos : pos + int(length)]
        if len(line) != length or bytes(line[:1]) != b"[" or bytes(line[-1:]) != b"]":
            raise ValueError("frozen line")
        lines.append(line)
        pos += length + 1
    if pos != len(view) + 1:
        raise ValueError("length")
    items = 0 if s["frozen"]["items"] is None else int(s["frozen"]["items"])
    if not items:
        return []
    return [Segment(items, tuple(line[1:-1] for line in lines))]


def _restore(f: ContextFold, s: dict[str, Any], segments: list[Segment], ids: SegmentIds | None = None) -> None:
    f.session = s["session"]
    f.seq, f._count, f.last_clean_seq = int(s["seq"]), int(s["count"]), int(s["last_clean_seq"])
    f.agent, f.epoch, f.modality, f.instructions = s["agent"], int(s["epoch"]), s["modality"], s["instructions"]
    f.counters = {str(k): int(v) for k, v in s["counters"].items()}
    f._interim = s["interim"]
    f._flags = set(s["flags"])
    f._ncalls = int(s["calls_seen"])
    items = 0 if s["frozen"]["items"] is None else int(s["frozen"]["items"])
    if items:
        frozen = f._frozen = Frozen()
        frozen.items = items
        if ids is not None:
            frozen.replies, frozen.calls = Ids(ids[0]), Ids(ids[1])
        for segment in segments:
            frozen.add(segment, ids=ids is None)
    cur_seq = s["cur_user_seq"]
    for rec in s["live"]:
        item = _from_record(rec)
        f._items.append(item)
        if isinstance(item, Reply):
            f._replies[item.id] = item
            for c in item.calls:
                f._calls[c.id] = c
        elif isinstance(item, User) and item.seq == cur_seq:
            f._cur_user = item
    if f._calls:
        f._calls = dict(sorted(f._calls.items(), key=lambda kv: kv[1].order))
    if cur_seq is not None and f._cur_user is None:
        f._cur_user = User(int(cur_seq), [])  # frozen and closed: only its seq is ever read again
    if s["last_reply"] is not None:
        f._last_reply = f._replies[s["last_reply"]]
    f._refresh_all()
