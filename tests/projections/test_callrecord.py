"""The read model of a recorded call: every reader gets the same answer from one pass."""

from __future__ import annotations

from typing import Any

from calltape.adapters.replies import ReplyTracker
from calltape.checks import CheckOptions, check_events
from calltape.cli.timeline import build_timeline, late_text
from calltape.events import Event, format_time, parse_event
from calltape.picture import build_picture
from calltape.projections.callrecord import read_call
from calltape.runtime.latency import TALK_OVER, samples

T0 = 1_738_315_800_000


def events(timeline: list[tuple[int, str, dict[str, Any]]], session: str = "rec") -> list[Event]:
    """The timeline as stored events, numbered as the store would."""
    return [
        parse_event(
            {"id": f"{session}-{i}", "session": session, "type": t, "at": format_time(T0 + ms), "data": d}
        ).with_seq(i)
        for i, (ms, t, d) in enumerate(timeline, start=1)
    ]


BARGE_IN = events(
    [
        (0, "session.started", {"agent": "a"}),
        (100, "agent.reply.started", {"reply": "r1"}),
        (150, "agent.text", {"reply": "r1", "text": "Booking a table now."}),
        (160, "tool.call", {"reply": "r1", "call": "c1", "name": "book", "arguments": {}}),
        (170, "tool.started", {"call": "c1"}),
        (200, "agent.reply.done", {"reply": "r1"}),
        (300, "agent.speech.started", {"reply": "r1"}),
        (1000, "interruption", {"heard": "Booking"}),  # no reply named: the latest
        (1100, "agent.text", {"reply": "r1", "text": " late"}),
        (1900, "agent.speech.ended", {"reply": "r1", "interrupted": False, "heard": "Booking"}),
        (2500, "tool.result", {"call": "c1", "output": {"ok": True}}),
    ]
)


def test_the_talk_over_interval_is_one_interval_for_check_and_the_latency_figure() -> None:
    record = read_call(BARGE_IN)
    (barge,) = record.barge_ins
    assert (barge.seq, barge.reply, barge.talk_over_ms, barge.measured) == (8, "r1", 900, True)
    assert [s.ms for s in samples(BARGE_IN) if s.figure == TALK_OVER] == [900]
    (finding,) = check_events(BARGE_IN, CheckOptions(talk_over_ms=899), rules=["talk-over"])
    assert (finding.seq, "900 ms" in finding.message) == (8, True)
    assert check_events(BARGE_IN, CheckOptions(talk_over_ms=900), rules=["talk-over"]) == []


def test_a_cut_reply_its_late_tokens_and_its_late_result_are_the_same_for_every_reader() -> None:
    record = read_call(BARGE_IN)
    span = record.replies["r1"]
    assert (span.interrupted_seq, span.late_text_seqs, span.speech_ended_at_ms) == (8, [9], T0 + 1900)
    call = record.calls["c1"]
    assert (call.reply, call.late, call.status, call.duration_ms()) == ("r1", ("barge-in", 8), "completed", 2330)
    timeline = build_timeline(BARGE_IN)
    assert timeline.replies["r1"].interrupted_seq == 8 and timeline.replies["r1"].late_tokens == 1
    assert late_text(timeline.calls["c1"]) == "after the barge-in at seq 8"
    assert [r.reply for r in timeline.rows if r.kind == "interruption"] == ["r1"]
    assert [f.rule for f in check_events(BARGE_IN)] == ["talk-over", "late-tokens"]
    (reply,) = [i for i in build_picture(BARGE_IN).items if i.lane == "reply"]
    assert (reply.status, reply.end_ms, 8 in reply.seqs) == ("interrupted", 1900, True)


def test_an_interruption_without_reply_aims_at_the_folds_latest_reply_even_one_a_tool_call_began() -> None:
    evs = events(
        [
            (0, "session.started", {"agent": "a"}),
            (100, "agent.reply.started", {"reply": "r1"}),
            (150, "agent.reply.done", {"reply": "r1"}),
            (200, "tool.call", {"reply": "r2", "call": "c1", "name": "book", "arguments": {}}),
            (300, "interruption", {}),
        ]
    )
    record = read_call(evs)
    assert record.replies["r2"].interrupted_seq == 5 and record.replies["r1"].interrupted_seq is None
    (row,) = [r for r in build_timeline(evs).rows if r.kind == "interruption"]
    assert row.reply == "r2" and "barge-in" in row.text
    assert record.calls["c1"].status == "cancelled"  # its reply was cut before it started


def test_a_result_after_the_user_spoke_again_is_late_and_a_retried_call_lasts_from_its_first_start() -> None:
    evs = events(
        [
            (0, "session.started", {"agent": "a"}),
            (100, "agent.reply.started", {"reply": "r1"}),
            (110, "tool.call", {"reply": "r1", "call": "c1", "name": "book", "arguments": {}}),
            (120, "agent.reply.done", {"reply": "r1"}),
            (200, "tool.started", {"call": "c1"}),
            (400, "session.dropped", {"reason": "crash"}),
            (900, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 6}),
            (950, "tool.cancelled", {"call": "c1", "reason": "dropped", "outcome": "unknown"}),
            (1000, "user.text", {"text": "are you there?"}),
            (1200, "tool.started", {"call": "c1"}),
            (1500, "tool.result", {"call": "c1", "output": {"ok": True}}),
        ]
    )
    call = read_call(evs).calls["c1"]
    assert [s.epoch for s in call.starts] == [1, 2] and call.late is None  # its first settle was the cancel
    assert call.duration_ms() == 750  # the first run, start to its settle: never negative
    assert "→ completed in 750ms" in next(r.text for r in build_timeline(evs).rows if r.kind == "tool.result")
    no_cancel = read_call([*evs[:7], *evs[8:]]).calls["c1"]
    assert no_cancel.late == ("user", 9)  # the result came after the user's seq-9 turn


def test_active_is_the_folds_one_test_for_the_reply_tracker_too() -> None:
    evs = events(
        [
            (0, "session.started", {"agent": "a", "modality": "text"}),
            (100, "agent.reply.started", {"reply": "r1"}),
            (110, "tool.call", {"reply": "r1", "call": "c1", "name": "book", "arguments": {}}),
            (120, "agent.reply.done", {"reply": "r1"}),
            (130, "tool.started", {"call": "c1"}),
        ]
    )
    record = read_call(evs)
    state = record.reply_state("r1")
    assert state is not None and state.played and record.active("r1")  # a running call keeps it active
    tracker = ReplyTracker(_Sink(), fold=record.fold)
    assert tracker.active("r1") and not tracker.active("never-began")
    record.apply(Event("tool.result", {"call": "c1", "output": {}}, "rec", id="rec-6", at_ms=T0 + 200, seq=6))
    assert not record.active("r1") and not tracker.active("r1")


class _Sink:
    def emit(self, type: str, data: Any) -> Event:
        raise AssertionError("nothing is written here")
