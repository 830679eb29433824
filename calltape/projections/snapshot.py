"""The snapshot codec: a :class:`~calltape.projections.fold.ContextFold` to bytes and back.

The store keeps the bytes under :data:`FOLD_VERSION`; a snapshot of another version is refused
(:class:`SnapshotMismatch`) and the caller folds from seq 1 instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import orjson

from calltape.errors import CalltapeError
from calltape.gcpause import gc_paused
from calltape.projections.records import Call, Handoff, Reply, User

if TYPE_CHECKING:
    from calltape.projections.fold import ContextFold

FOLD_VERSION: Final = 1
"""Bump whenever a rule of the fold or the codec's layout changes: snapshots of another version are
refused and rebuilt."""


class SnapshotMismatch(CalltapeError):
    """A snapshot written by other fold rules (or damaged) cannot be restored."""


def encode(f: ContextFold) -> bytes:
    """The whole fold state (but the seen ids) as bytes."""
    items: list[list[Any]] = []
    index: dict[int, int] = {}
    for i, item in enumerate(f._items):
        index[id(item)] = i
        if isinstance(item, User):
            items.append(["u", item.seq, item.parts])
        elif isinstance(item, Reply):
            items.append(
                [
                    "r",
                    item.id,
                    item.seq,
                    item.started,
                    item.done,
                    item.parts,
                    item.has_text,
                    item.interrupted,
                    item.heard,
                    item.speech_started,
                    item.speech_ended,
                ]
            )
        else:
            items.append(["h", item.seq, item.from_, item.to])
    calls = [
        [
            c.id,
            c.name,
            c.arguments,
            c.reply.id,
            c.seq,
            c.included,
            c.started,
            c.has_result,
            c.output,
            c.error,
            c.cancel_reason,
            c.cancel_outcome,
            c.has_progress,
            c.progress,
        ]
        for c in f._calls.values()
    ]
    state = {
        "v": FOLD_VERSION,
        "session": f.session,
        "seq": f.seq,
        "count": f._count,
        "last_clean_seq": f.last_clean_seq,
        "agent": f.agent,
        "epoch": f.epoch,
        "modality": f.modality,
        "instructions": f.instructions,
        "counters": f.counters,
        "interim": f._interim,
        "flags": sorted(f._flags),
        "cur_user": -1 if f._cur_user is None else index[id(f._cur_user)],
        "last_reply": None if f._last_reply is None else f._last_reply.id,
        "items": items,
        "calls": calls,
    }
    return orjson.dumps(state)


def decode(f: ContextFold, blob: bytes) -> None:
    """Restores :func:`encode` output into the fresh fold ``f``; refuses another version."""
    try:
        with gc_paused(len(blob) // 64):  # tens of thousands of small acyclic objects
            state = orjson.loads(blob)
        version = state.get("v") if isinstance(state, dict) else None
    except orjson.JSONDecodeError:
        version = None
    if version != FOLD_VERSION:
        raise SnapshotMismatch(
            f"the snapshot was written by fold version {version}, this calltape folds version {FOLD_VERSION}"
        )
    try:
        with gc_paused(len(state.get("items", ()))):
            _restore(f, state)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise SnapshotMismatch(f"the snapshot is damaged ({type(exc).__name__})") from None


def _restore(f: ContextFold, s: dict[str, Any]) -> None:
    f.session = s["session"]
    f.seq, f._count, f.last_clean_seq = s["seq"], s["count"], s["last_clean_seq"]
    f.agent, f.epoch, f.modality, f.instructions = (
        s["agent"],
        s["epoch"],
        s["modality"],
        s["instructions"],
    )
    f.counters = dict(s["counters"])
    f._interim = s["interim"]
    f._flags = set(s["flags"])
    for row in s["items"]:
        kind = row[0]
        if kind == "u":
            f._items.append(User(row[1], list(row[2])))
        elif kind == "r":
            r = Reply(row[1], row[2])
            (r.started, r.done, r.parts, r.has_text, r.interrupted, r.heard) = row[3:9]
            r.speech_started, r.speech_ended = row[9], row[10]
            f._replies[r.id] = r
            f._items.append(r)
        elif kind == "h":
            f._items.append(Handoff(row[1], row[2], row[3]))
        else:
            raise ValueError(kind)
    for row in s["calls"]:
        r = f._replies[row[3]]
        c = Call(row[0], row[1], row[2], r, row[4], row[5], len(f._calls))
        (c.started, c.has_result, c.output, c.error, c.cancel_reason, c.cancel_outcome) = row[6:12]
        c.has_progress, c.progress = row[12], row[13]
        f._calls[c.id] = c
        r.calls.append(c)
    if s["cur_user"] >= 0:
        user = f._items[s["cur_user"]]
        if not isinstance(user, User):
            raise ValueError("cur_user")
        f._cur_user = user
    if s["last_reply"] is not None:
        f._last_reply = f._replies[s["last_reply"]]
    f._refresh_all()
