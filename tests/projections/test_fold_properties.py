"""Property tests over generated, protocol-shaped interleavings of a voice call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from projection_checks import check_all
from projection_timeline import Tape

from calltape.events import Event
from calltape.projections import ContextFold, fold_events, segments

N_OPS = 26
ops = st.lists(st.tuples(st.integers(0, N_OPS - 1), st.integers(0, 1_000)), min_size=1, max_size=45)
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WORDS = ["yes", "no", "book", "a table", "for two", "  ", "", "at seven"]


def build(plan: list[tuple[int, int]], modality: str) -> tuple[list[Event], list[Event], list[Event]]:
    """Interprets ``plan`` as events: (all with duplicates and x.*, without duplicates, core only)."""
    tape = Tape(modality=modality)
    core: list[Event] = list(tape.events)
    replies: list[str] = []
    calls: list[str] = []
    texts: dict[str, str] = {}
    agents = ["alice", "bob", "carol"]
    epoch = 1
    dups: list[tuple[int, Event]] = []

    def pick(items: list[str], r: int) -> str | None:
        return items[r % len(items)] if items else None

    for op, r in plan:
        word = WORDS[r % len(WORDS)]
        reply = pick(replies, r)
        call = pick(calls, r)
        event: Event | None = None
        if op == 0:
            event = tape.add("user.speech.started")
        elif op == 1:
            event = tape.add("user.speech.stopped")
        elif op == 2:
            event = tape.interim(word)
        elif op in (3, 4):
            event = tape.said(word)
        elif op == 5:
            event = tape.typed(word)
        elif op in (6, 7):
            rid = f"r{len(replies)}"
            replies.append(rid)
            event = tape.add("agent.reply.started", reply=rid)
        elif op in (8, 9) and reply:
            event = tape.add("agent.text", reply=reply, text=word)
            texts[reply] = texts.get(reply, "") + word
        elif op == 10 and reply:
            event = tape.add("agent.reply.done", reply=reply)
        elif op == 11 and reply:
            event = tape.add("agent.speech.started", reply=reply)
        elif op == 12 and reply:
            said = texts.get(reply, "")
            event = tape.add("agent.speech.progress", reply=reply, heard=said[: r % (len(said) + 1)])
        elif op == 13 and reply:
            data: dict[str, Any] = {"reply": reply, "interrupted": bool(r % 2)}
            if r % 3:
                data["heard"] = texts.get(reply, "")[: r % 7]
            event = tape.add("agent.speech.ended", **data)
        elif op in (14, 15):
            data = {"cause": "user_speech"}
            if reply and r % 2:
                data["reply"] = reply
            if r % 3 == 0:
                data["heard"] = word
            event = tape.add("interruption", **data)
        elif op in (16, 17):
            cid = f"c{len(calls)}" if r % 9 else (call or "c0")  # sometimes a repeated call id
            if cid not in calls:
                calls.append(cid)
            args: Any = {"n": r} if r % 4 else ("[1]" if r % 8 else '"x"')
            event = tape.call(cid, name=f"tool{r % 3}", arguments=args, reply=reply if r % 5 else None)
        elif op == 18 and call:
            event = tape.add("tool.started", call=call)
        elif op == 19 and call:
            event = tape.add("tool.progress", call=call, state={"step": r})
        elif op in (20, 21) and call:
            output: Any = [{"ok": r}, "text out", None, 3][r % 4]
            event = tape.result(call if r % 11 else "ghost", output, error=r % 5 == 0)
        elif op == 22 and call:
            reason = ["timeout", "interrupted", "dropped", "budget"][r % 4]
            cancel: dict[str, Any] = {"call": call, "reason": reason}
            if r % 3 == 1:
                cancel["outcome"] = "unknown"
            elif r % 3 == 2:
                cancel["outcome"] = "not_run"
            event = tape.add("tool.cancelled", **cancel)
        elif op == 23:
            if r % 4 == 0:
                event = tape.add("session.dropped")
            elif r % 4 == 1:
                epoch += 1
                event = tape.add("session.resumed", agent=agents[r % 3], epoch=epoch, from_seq=1)
            elif r % 4 == 2:
                to = agents[r % 3]
                extra = {"instructions": f"be {to}"} if r % 3 else {}
                event = tape.add("agent.handoff", **{"from": "x", "to": to, **extra})
            else:
                event = tape.add("agent.instructions", text=f"rules {r}")
        elif op == 24:
            tape.add(f"x.ext{r % 3}", value=r)  # extension: not a core event
            continue
        elif op == 25 and tape.events:
            dups.append((len(tape.events), tape.events[r % len(tape.events)]))
            continue
        if event is not None:
            core.append(event)
    unique = list(tape.events)
    with_dups = list(unique)
    for at, dup in reversed(dups):
        with_dups.insert(at, dup)
    return with_dups, unique, core


def renumbered(events: list[Event]) -> list[Event]:
    return [e.with_seq(i + 1) for i, e in enumerate(events)]


def without_numbers(native: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in native.items() if k not in ("seq", "last_clean_seq")}


@SETTINGS
@given(plan=ops, modality=st.sampled_from(["voice", "voice", "text"]))
def test_every_prefix_is_valid_deterministic_and_equals_incremental(plan: list[tuple[int, int]], modality: str) -> None:
    with_dups, unique, _ = build(plan, modality)
    live = ContextFold()
    last_clean = 0
    for n, event in enumerate(unique, start=1):
        live.apply(event)
        native = live.native()
        check_all(native)
        fresh = fold_events(unique[:n])
        assert fresh.to_snapshot() == live.to_snapshot()
        assert fresh.native() == native
        # to_snapshot froze the settled items of both folds: every query still sees them
        assert fresh.tool_calls() == live.tool_calls() and fresh.replies() == live.replies()
        # the clean bookkeeping kept incrementally equals the one a restore recomputes from scratch
        assert ContextFold.from_snapshot(live.to_snapshot()).native() == native
        if native["clean"]:
            last_clean = n
        assert native["last_clean_seq"] == last_clean
    # duplicates never change the result
    assert fold_events(with_dups).to_snapshot() == live.to_snapshot()


@SETTINGS
@given(plan=ops, modality=st.sampled_from(["voice", "text"]), cut=st.integers(0, 60))
def test_snapshot_plus_tail_equals_full_fold(plan: list[tuple[int, int]], modality: str, cut: int) -> None:
    _, unique, _ = build(plan, modality)
    cut = min(cut, len(unique))
    head = fold_events(unique[:cut], session="s1")
    restored = ContextFold.from_snapshot(head.to_snapshot())
    assert restored.to_snapshot() == head.to_snapshot()
    restored.apply_many(unique[cut:])
    full = fold_events(unique)
    assert restored.to_snapshot() == full.to_snapshot()
    assert restored.native() == full.native()


@SETTINGS
@given(plan=ops, modality=st.sampled_from(["voice", "text"]))
def test_extensions_change_nothing(plan: list[tuple[int, int]], modality: str) -> None:
    _, unique, core = build(plan, modality)
    with_ext = fold_events(unique).native()
    without = fold_events(renumbered(core)).native()
    assert without_numbers(with_ext) == without_numbers(without)


@SETTINGS
@given(plan=ops)
def test_apply_and_apply_many_agree(plan: list[tuple[int, int]]) -> None:
    with_dups, _, _ = build(plan, "voice")
    one = ContextFold()
    for event in with_dups:
        one.apply(event)
    many = ContextFold()
    many.apply_many(iter(with_dups))
    assert one.to_snapshot() == many.to_snapshot()
    assert (one.seq, one.last_clean_seq) == (many.seq, many.last_clean_seq)


def chained(unique: list[Event], cuts: list[int], again: Callable[[ContextFold], ContextFold]) -> ContextFold:
    """Folds ``unique`` piece by piece, the fold replaced by ``again(fold)`` at each cut."""
    fold = ContextFold("s1")
    at = 0
    for cut in sorted(min(c, len(unique)) for c in cuts):
        fold.apply_many(unique[at:cut])
        at = cut
        fold = again(fold)
    fold.apply_many(unique[at:])
    return fold


@SETTINGS
@given(
    plan=ops,
    modality=st.sampled_from(["voice", "text"]),
    cuts=st.lists(st.integers(0, 60), min_size=1, max_size=4),
)
def test_chained_snapshots_plus_tail_equal_full_fold(
    plan: list[tuple[int, int]], modality: str, cuts: list[int]
) -> None:
    """Snapshot, restore, fold a piece, snapshot again...: every query agrees with the full fold."""
    _, unique, _ = build(plan, modality)
    full = fold_events(unique, session="s1")

    def again(fold: ContextFold) -> ContextFold:
        blob = fold.to_snapshot()
        restored = ContextFold.from_snapshot(blob)
        assert restored.to_snapshot() == blob
        return restored

    fold = chained(unique, cuts, again)
    assert fold.native() == full.native()
    assert fold.to_snapshot() == full.to_snapshot()
    assert fold.tool_calls() == full.tool_calls()
    assert fold.replies() == full.replies()
    assert fold.open_replies() == full.open_replies()
    assert (fold.latest_reply(), fold.user_turn_seq, fold.pending_user_text) == (
        full.latest_reply(),
        full.user_turn_seq,
        full.pending_user_text,
    )
    assert (fold.clean, fold.last_clean_seq, fold.counters) == (full.clean, full.last_clean_seq, full.counters)


class SegmentRows:
    """A store's snapshot rows in memory, with the segment methods (what the SQL stores do)."""

    def __init__(self) -> None:
        self.rows: dict[int, bytes] = {}
        self.written: list[int] = []

    async def save_snapshot(self, session: str, seq: int, version: int, state: bytes) -> None:
        self.rows[seq] = state

    async def save_snapshot_segments(self, session: str, version: int, segments: Any) -> None:
        for slot, body in segments:
            self.written.append(slot)
            # content-addressed: a slot written again (the same items frozen again after a thaw) holds
            # the same bytes
            assert self.rows.setdefault(slot, body) == body

    async def load_snapshot_segments(self, session: str, version: int) -> list[tuple[int, bytes]]:
        return [(k, v) for k, v in self.rows.items() if k < 0]


@SETTINGS
@given(
    plan=ops,
    modality=st.sampled_from(["voice", "text"]),
    cuts=st.lists(st.integers(0, 60), min_size=1, max_size=4),
    cold=st.booleans(),
)
def test_chained_stored_snapshots_plus_tail_equal_full_fold(
    plan: list[tuple[int, int]], modality: str, cuts: list[int], cold: bool
) -> None:
    """The same through the stored form (a header beside segments), restored from the segment cache or,
    ``cold``, from the rows: a slot always holds the same bytes, and the state is the one of the blob."""
    _, unique, _ = build(plan, modality)
    full = fold_events(unique, session="s1")
    rows = SegmentRows()

    def again(fold: ContextFold) -> ContextFold:
        captured = fold.capture()
        asyncio.run(segments.save(rows, "s1", captured))
        if cold:
            segments.CACHE.clear()
        restored = asyncio.run(segments.restore(rows, "s1", rows.rows[captured.seq]))
        assert restored.to_snapshot() == captured.to_bytes()
        return restored

    fold = chained(unique, cuts, again)
    assert len(rows.written) <= len(unique)  # a segment per freeze at most, never the call again per save
    assert fold.native() == full.native()
    assert fold.to_snapshot() == full.to_snapshot()
    assert fold.tool_calls() == full.tool_calls()
    assert (fold.clean, fold.last_clean_seq, fold.counters) == (full.clean, full.last_clean_seq, full.counters)
