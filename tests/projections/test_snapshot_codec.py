"""The snapshot codec (version 3): settled items stored rendered, restored without decoding them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from projection_timeline import Tape

from calltape.events import Event
from calltape.projections import FOLD_VERSION, ContextFold, SnapshotMismatch, fold_events
from calltape.projections import native as native_module
from calltape.projections import snapshot as snapshot_module

V0_1 = Path(__file__).parent / "data" / "snapshot_v0_1.json"


def long_call(turns: int, *, modality: str = "voice") -> Tape:
    """Turns of user speech, a spoken reply with a tool call and its result: clean after each turn."""
    tape = Tape(modality=modality)
    for i in range(turns):
        tape.said(f"question {i}")
        rid = f"r{i}"
        tape.add("agent.reply.started", reply=rid)
        tape.add("agent.text", reply=rid, text=f"answer {i}")
        tape.call(f"c{i}", reply=rid, arguments={"i": i})
        tape.add("agent.reply.done", reply=rid)
        tape.add("agent.speech.started", reply=rid)
        tape.add("agent.speech.ended", reply=rid, interrupted=False)
        tape.add("tool.started", call=f"c{i}")
        tape.result(f"c{i}", {"i": i})
    return tape


def queries(f: ContextFold) -> dict[str, Any]:
    """Everything a caller can read from a fold."""
    return {
        "native": f.native(),
        "tool_calls": f.tool_calls(),
        "replies": f.replies(),
        "open_replies": f.open_replies(),
        "latest_reply": f.latest_reply(),
        "user_turn_seq": f.user_turn_seq,
        "scalars": (f.session, f.seq, f.last_clean_seq, f.agent, f.epoch, f.modality, f.clean, f.dropped),
        "counters": dict(f.counters),
    }


def counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[Any]:
    seen: list[Any] = []
    real = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen


def test_restore_and_tail_decode_and_render_only_the_live_items(monkeypatch: pytest.MonkeyPatch) -> None:
    tape = long_call(200)
    head = len(tape.events)
    tape.said("one more")
    tape.add("agent.reply.started", reply="last")
    tape.add("agent.text", reply="last", text="Sure.")
    tape.add("agent.reply.done", reply="last")
    full = fold_events(tape.events)
    expected_native, expected_blob = full.native(), full.to_snapshot()
    blob = fold_events(tape.events[:head]).to_snapshot()

    decoded = counting(monkeypatch, snapshot_module, "_from_record")
    rendered = counting(monkeypatch, native_module, "reply_items")
    restored = ContextFold.from_snapshot(blob)
    restored.apply_many(tape.events[head:])
    assert restored.native() == expected_native
    again = restored.to_snapshot()
    # 200 settled turns came back as rendered bytes: only the live turn was decoded or rendered
    assert len(decoded) <= 2
    assert {r.id for r in rendered} <= {"r199", "last"}
    assert again == expected_blob


def test_a_late_event_for_a_frozen_item_thaws_the_fold() -> None:
    tape = long_call(3)
    tape.call("slow", reply="r0")  # a call joins an old reply, is cancelled, then its result lands
    tape.add("tool.started", call="slow")
    tape.add("tool.cancelled", call="slow", reason="timeout")
    mid = len(tape.events)
    tape.result("slow", "late but real")  # the first result wins over an earlier cancel (rule 5)
    tape.add("interruption", reply="r1", heard="answ")  # a late truncate: its heard still applies (rule 3)
    tape.add("agent.text", reply="r2", text=" more")  # late text of a complete reply
    full = fold_events(tape.events)
    restored = ContextFold.from_snapshot(fold_events(tape.events[:mid]).to_snapshot())
    restored.apply_many(tape.events[mid:])
    assert queries(restored) == queries(full)
    assert restored.to_snapshot() == full.to_snapshot()


def test_queries_over_every_call_see_the_frozen_ones() -> None:
    tape = long_call(5)
    restored = ContextFold.from_snapshot(tape.fold().to_snapshot())
    assert restored.tool_call("c0") == tape.fold().tool_call("c0")
    assert restored.reply_state("r1") == tape.fold().reply_state("r1")
    assert [c.call_id for c in restored.tool_calls()] == [f"c{i}" for i in range(5)]
    assert queries(restored) == queries(tape.fold())


def test_the_snapshot_names_its_version_and_fields() -> None:
    blob = long_call(3).fold().to_snapshot()
    header = orjson.loads(blob.split(b"\n", 1)[0])
    assert header["v"] == FOLD_VERSION == 3
    assert {"session", "seq", "last_clean_seq", "agent", "epoch", "modality", "live", "frozen"} <= set(header)
    records = orjson.loads(blob.split(b"\n")[2])
    assert [r["kind"] for r in records][:2] == ["user", "reply"]
    assert {"id", "seq", "heard", "interrupted", "calls"} <= set(records[1])


def test_damaged_and_foreign_snapshots_are_refused() -> None:
    blob = long_call(3).fold().to_snapshot()
    with pytest.raises(SnapshotMismatch, match="damaged"):
        ContextFold.from_snapshot(blob[:-5])  # truncated
    with pytest.raises(SnapshotMismatch, match="damaged"):
        ContextFold.from_snapshot(blob.split(b"\n", 1)[0])  # the header alone
    with pytest.raises(SnapshotMismatch, match="fold version 1,"):
        ContextFold.from_snapshot(V0_1.read_bytes())  # v0.1's positional layout: never misread


def test_text_session_and_interleaved_calls_keep_their_order() -> None:
    tape = long_call(2, modality="text")
    tape.add("agent.reply.started", reply="x")
    tape.call("cx", reply="x")
    tape.call("c-late", reply="r0")  # joins an old reply after a newer call: tool.call order is kept
    tape.result("cx", 1)
    tape.result("c-late", 2)
    tape.add("agent.reply.done", reply="x")
    for cut in range(1, len(tape.events) + 1):
        restored = ContextFold.from_snapshot(tape.fold(cut).to_snapshot())
        restored.apply_many(tape.events[cut:])
        assert queries(restored) == queries(tape.fold())


def test_a_fold_can_be_snapshotted_again_and_again() -> None:
    tape = long_call(6)
    f = ContextFold()
    for event in tape.events:
        f.apply(event)
        f = ContextFold.from_snapshot(f.to_snapshot())
    assert queries(f) == queries(tape.fold())
    assert isinstance(tape.events[0], Event)


def test_a_capture_is_the_state_when_it_was_taken() -> None:
    tape = long_call(2)
    tape.add("agent.reply.started", reply="x")
    tape.add("agent.text", reply="x", text="a")
    tape.said("and")  # a user message the reply x does not close
    n = len(tape.events)
    f = tape.fold()
    captured = f.capture()
    for event in (tape.add("agent.text", reply="x", text="b"), tape.said("more")):
        f.apply(event)  # both extend lists the capture's live records were made from
    assert captured.seq == n
    assert captured.to_bytes() == tape.fold(n).to_snapshot()
