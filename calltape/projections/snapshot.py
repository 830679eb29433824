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

**Layout** (version 2). Five lines, each one compact JSON document (JSON never holds a raw newline):

1. the header: ``{"v": 2, ...named scalars..., "live": [records], "frozen": {"items", "bytes"}}``;
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
"""

from __future__ import annotations

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


FOLD_VERSION: Final = 2
"""Bump whenever a rule of the fold or this layout changes: snapshots of another version are
refused and rebuilt. 1 was v0.1's positional layout."""


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

    __slots__ = ("call_chunks", "calls", "items", "native_chunks", "record_chunks", "replies", "reply_chunks")

    def __init__(self) -> None:
        self.items = 0
        self.native_chunks: list[bytes | memoryview] = []
        self.record_chunks: list[bytes | memoryview] = []
        self.reply_chunks: list[bytes | memoryview] = []
        self.call_chunks: list[bytes | memoryview] = []
        self.replies: set[str] = set()
        self.calls: set[str] = set()

    def native(self) -> list[NativeItem]:
        """The frozen items rendered (fresh objects on every call)."""
        return _load_array(self.native_chunks, merge=True)

    def names(self, data: Any) -> bool:
        """Whether an event's ``data`` names a frozen reply or call (then the fold must thaw)."""
        try:
            return data.get("reply") in self.replies or data.get("call") in self.calls
        except (AttributeError, TypeError):  # malformed data: thaw, and let the handler judge it
            return True


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
    if rendered:
        frozen.native_chunks.append(_inner(rendered))
    frozen.record_chunks.append(_inner([_record(item) for item in settled]))
    if reply_ids:
        frozen.reply_chunks.append(_inner(reply_ids))
        frozen.replies.update(reply_ids)
    if call_ids:
        frozen.call_chunks.append(_inner(call_ids))
        frozen.calls.update(call_ids)
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

    __slots__ = ("chunks", "header", "seq")

    def __init__(self, seq: int, header: bytes, chunks: list[list[bytes | memoryview]]) -> None:
        self.seq = seq
        self.header = header
        self.chunks = chunks

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
    lengths = [2 + sum(len(c) for c in line) + max(0, len(line) - 1) for line in chunks]
    header["frozen"] = {"items": frozen.items, "bytes": lengths}
    # encoded now: the live records share lists (a reply's parts) that later events extend
    return Captured(f.seq, orjson.dumps(header), chunks)


def encode(f: ContextFold) -> bytes:
    """The fold state (but the seen ids) as bytes."""
    return capture(f).to_bytes()


def decode(f: ContextFold, blob: bytes) -> None:
    """Restores :func:`encode` output into the fresh fold ``f``; refuses another version."""
    view = memoryview(blob)
    end = blob.find(b"\n")
    try:
        header = orjson.loads(view[: end if end >= 0 else len(blob)])
        version = header.get("v") if isinstance(header, dict) else None
    except orjson.JSONDecodeError:
        version = None
    if version != FOLD_VERSION:
        raise SnapshotMismatch(
            f"the snapshot was written by fold version {version}, this calltape folds version {FOLD_VERSION}"
        )
    try:
        _restore(f, header, view, end)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, orjson.JSONDecodeError) as exc:
        raise SnapshotMismatch(f"the snapshot is damaged ({type(exc).__name__})") from None


def _restore(f: ContextFold, s: dict[str, Any], view: memoryview, end: int) -> None:
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
        for chunks, line in zip(
            (frozen.native_chunks, frozen.record_chunks, frozen.reply_chunks, frozen.call_chunks), lines, strict=True
        ):
            if len(line) > 2:
                chunks.append(line[1:-1])
        frozen.replies.update(orjson.loads(lines[2]))
        frozen.calls.update(orjson.loads(lines[3]))
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
