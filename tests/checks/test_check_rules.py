"""Every rule of SPEC section 7: a violating timeline triggers it (with the contract's seq), a clean
one passes. Timelines are wire-format dicts, as a JSONL file holds them."""

from __future__ import annotations

from typing import Any

import pytest

from calltape.checks import RULES, CheckOptions, Violation, check_events, to_events
from calltape.events import format_time, parse_time

T0 = parse_time("2025-01-31T09:30:00.000Z")
NOW = T0 + 3_600_000


def tape(*rows: tuple[Any, ...], session: str = "s") -> list[dict[str, Any]]:
    """``(ms, type, data)`` or ``(ms, type, data, epoch)`` rows as wire events."""
    events = []
    for i, row in enumerate(rows, start=1):
        ms, kind, data = row[:3]
        event: dict[str, Any] = {"id": f"{session}-{i}", "session": session, "type": kind, "at": format_time(T0 + ms)}
        if len(row) > 3:
            event["epoch"] = row[3]
        event["data"] = data
        events.append(event)
    return events


def check(events: list[dict[str, Any]], **options: Any) -> list[Violation]:
    return check_events(to_events(events), CheckOptions(now_ms=NOW, **options))


def found(events: list[dict[str, Any]], rule: str, **options: Any) -> list[tuple[int, str]]:
    return [(v.seq, v.message) for v in check(events, **options) if v.rule == rule]


START = (0, "session.started", {"agent": "a"})
END = (9_000, "session.ended", {})


def reply(ms: int, rid: str, text: str = "Okay.") -> list[tuple[Any, ...]]:
    return [(ms, "agent.reply.started", {"reply": rid}), (ms + 10, "agent.text", {"reply": rid, "text": text})]


def test_the_registry_holds_exactly_the_contract_ids() -> None:
    assert list(RULES) == [
        "orphan-call",
        "late-start",
        "double-run",
        "stale-epoch",
        "talk-over",
        "late-tokens",
        "unsettled-drop",
        "slow-tool",
        "double-effect",
        "unheard-effect",
        "unsettled-effect",
    ]


# -- orphan-call -------------------------------------------------------------------------------

CALL = (100, "tool.call", {"reply": "r1", "call": "c1", "name": "book", "arguments": {}})


def test_orphan_call_when_the_session_ends_with_a_call_open() -> None:
    events = tape(START, *reply(50, "r1"), CALL, (200, "tool.started", {"call": "c1"}), END)
    assert [s for s, _ in found(events, "orphan-call")] == [4]
    assert "book" in found(events, "orphan-call")[0][1]


def test_orphan_call_when_a_resume_left_the_call_open() -> None:
    events = tape(
        START,
        *reply(50, "r1"),
        CALL,
        (200, "tool.started", {"call": "c1"}),
        (300, "session.dropped", {}),
        (400, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 1}, 2),
    )
    assert [s for s, _ in found(events, "orphan-call")] == [4]


def test_no_orphan_when_settled_or_still_live() -> None:
    settled = tape(
        START,
        *reply(50, "r1"),
        CALL,
        (200, "tool.started", {"call": "c1"}),
        (300, "tool.result", {"call": "c1", "output": 1}),
        END,
    )
    cancelled = tape(
        START,
        *reply(50, "r1"),
        CALL,
        (200, "tool.started", {"call": "c1"}),
        (300, "session.dropped", {}),
        (301, "tool.cancelled", {"call": "c1", "reason": "dropped", "outcome": "unknown"}, 2),
        (302, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 1}, 2),
        END,
    )
    live = tape(START, *reply(50, "r1"), CALL, (200, "tool.started", {"call": "c1"}))
    # a call of an interrupted reply that never started is settled by the projection (cancelled)
    never_started = tape(START, *reply(50, "r1"), CALL, (150, "interruption", {"reply": "r1"}), END)
    for events in (settled, cancelled, live, never_started):
        assert found(events, "orphan-call") == []


# -- late-start --------------------------------------------------------------------------------


def test_late_start_when_a_call_of_a_cancelled_generation_runs() -> None:
    # pipecat#4997: the call was queued before the barge-in and executed after it
    events = tape(
        START,
        *reply(50, "r1"),
        CALL,
        (150, "interruption", {"reply": "r1"}),
        (200, "tool.started", {"call": "c1"}),
        (300, "tool.result", {"call": "c1", "output": 1}),
        END,
    )
    assert [s for s, _ in found(events, "late-start")] == [6]


def test_late_start_for_a_call_that_arrives_after_the_interruption() -> None:
    events = tape(
        START,
        *reply(50, "r1"),
        (150, "interruption", {"reply": "r1"}),
        CALL,
        (200, "tool.started", {"call": "c1"}),
        (300, "tool.result", {"call": "c1", "output": 1}),
        END,
    )
    assert [s for s, _ in found(events, "late-start")] == [6]


def test_no_late_start_when_the_call_started_before_the_barge_in() -> None:
    events = tape(
        START,
        *reply(50, "r1"),
        CALL,
        (120, "tool.started", {"call": "c1"}),
        (150, "interruption", {"reply": "r1"}),
        (300, "tool.result", {"call": "c1", "output": 1}),
        END,
    )
    assert found(events, "late-start") == []


def test_an_interruption_of_a_finished_reply_cancels_nothing() -> None:
    # the reply was done and heard: the fold ignores the interruption, so the later start is legal
    events = tape(
        START,
        (50, "agent.reply.started", {"reply": "r1"}),
        CALL,
        (60, "agent.reply.done", {"reply": "r1"}),
        (70, "tool.started", {"call": "c1"}),
        (80, "tool.result", {"call": "c1", "output": 1}),
        (90, "interruption", {"reply": "r1"}),
        END,
    )
    assert found(events, "late-start") == []


# -- double-run --------------------------------------------------------------------------------


def test_double_run_within_one_epoch() -> None:
    events = tape(
        START,
        *reply(50, "r1"),
        CALL,
        (200, "tool.started", {"call": "c1"}),
        (210, "tool.started", {"call": "c1"}),
        (300, "tool.result", {"call": "c1", "output": 1}),
        END,
    )
    assert [s for s, _ in found(events, "double-run")] == [6]


def test_double_run_after_the_result() -> None:
    events = tape(
        START,
        *reply(50, "r1"),
        CALL,
        (200, "tool.started", {"call": "c1"}),
        (300, "tool.result", {"call": "c1", "output": 1}),
        (310, "session.dropped", {}),
        (320, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 7}, 2),
        (330, "tool.started", {"call": "c1"}, 2),
        END,
    )
    assert [s for s, m in found(events, "double-run")] == [9]


def test_a_retry_in_the_new_epoch_is_not_a_double_run() -> None:
    events = tape(
        START,
        *reply(50, "r1"),
        CALL,
        (60, "agent.reply.done", {"reply": "r1"}),
        (200, "tool.started", {"call": "c1"}, 1),
        (310, "session.dropped", {}),
        (320, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 1}, 2),
        (330, "tool.started", {"call": "c1"}, 2),
        (340, "tool.result", {"call": "c1", "output": 1}, 2),
        END,
    )
    assert found(events, "double-run") == []
    assert found(events, "late-start") == []
    assert check(events) == []


# -- stale-epoch -------------------------------------------------------------------------------


def test_stale_epoch_for_a_zombie_write() -> None:
    events = tape(
        START,
        (100, "session.dropped", {}),
        (200, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 1}, 2),
        (300, "user.text", {"text": "hi"}, 1),
        (400, "user.text", {"text": "hi again"}, 2),
        END,
    )
    violations = found(events, "stale-epoch")
    assert [s for s, _ in violations] == [4]
    assert "epoch 1" in violations[0][1] and "epoch 2" in violations[0][1]


def test_no_stale_epoch_without_epochs_or_at_the_current_one() -> None:
    events = tape(
        START,
        (50, "user.text", {"text": "hi"}, 1),
        (100, "session.dropped", {}),
        (200, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 1}, 2),
        (300, "user.text", {"text": "hi"}),
        (400, "user.text", {"text": "hi again"}, 2),
        END,
    )
    assert found(events, "stale-epoch") == []


# -- talk-over ---------------------------------------------------------------------------------


def playing(ms_end: int | None, interrupted: bool = True) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = [
        *reply(50, "r1", "A long answer."),
        (70, "agent.reply.done", {"reply": "r1"}),
        (100, "agent.speech.started", {"reply": "r1"}),
        (1_000, "interruption", {"reply": "r1", "cause": "user_speech"}),
    ]
    if ms_end is not None:
        rows.append((ms_end, "agent.speech.ended", {"reply": "r1", "interrupted": interrupted}))
    return rows


def test_talk_over_when_the_playout_ends_late() -> None:
    events = tape(START, *playing(1_800), END)
    violations = found(events, "talk-over")
    assert [s for s, _ in violations] == [6]
    assert "800 ms" in violations[0][1]
    assert found(events, "talk-over", talk_over_ms=1_000) == []


def test_talk_over_when_the_playout_never_ends() -> None:
    events = tape(START, *playing(None))
    assert [s for s, _ in found(events, "talk-over")] == [6]


def test_no_talk_over_when_the_playout_stops_in_time_or_was_not_playing() -> None:
    in_time = tape(START, *playing(1_300), END)
    not_playing = tape(START, *reply(50, "r1"), (100, "interruption", {"reply": "r1"}), END)
    for events in (in_time, not_playing):
        assert found(events, "talk-over") == []


def test_a_drop_stops_the_playout() -> None:
    events = tape(START, *playing(None), (1_100, "session.dropped", {}))
    assert found(events, "talk-over") == []


# -- late-tokens -------------------------------------------------------------------------------


def test_late_tokens_one_violation_per_reply_with_the_count() -> None:
    events = tape(
        START,
        *reply(50, "r1", "Let me "),
        (100, "interruption", {"reply": "r1"}),
        (110, "agent.text", {"reply": "r1", "text": "check "}),
        (120, "agent.text", {"reply": "r1", "text": "that."}),
        *reply(200, "r2", "Sure."),
        (230, "agent.reply.done", {"reply": "r2"}),
        (240, "agent.speech.started", {"reply": "r2"}),
        (250, "agent.speech.ended", {"reply": "r2", "interrupted": False}),
        END,
    )
    violations = found(events, "late-tokens")
    assert [s for s, _ in violations] == [5]
    assert violations[0][1].startswith("2 agent.text events for reply [r1]")


def test_no_late_tokens_when_the_generation_stops() -> None:
    events = tape(START, *reply(50, "r1", "Let me "), (100, "interruption", {"reply": "r1"}), END)
    assert found(events, "late-tokens") == []


# -- unsettled-drop ----------------------------------------------------------------------------


def test_unsettled_drop_when_an_old_drop_is_the_last_event() -> None:
    events = tape(START, (100, "session.dropped", {}), (110, "x.note", {"k": 1}))
    assert [s for s, _ in found(events, "unsettled-drop")] == [2]


def test_no_unsettled_drop_when_recent_resumed_or_ended() -> None:
    recent = tape(START, (100, "session.dropped", {}))
    resumed = tape(
        START, (100, "session.dropped", {}), (200, "session.resumed", {"agent": "b", "epoch": 2, "from_seq": 1}, 2)
    )
    ended = tape(START, (100, "session.dropped", {}), (200, "session.ended", {}))
    assert found(recent, "unsettled-drop", stale_after_ms=2 * 3_600_000) == []
    for events in (resumed, ended):
        assert found(events, "unsettled-drop") == []


# -- slow-tool ---------------------------------------------------------------------------------


def test_slow_tool_over_the_default_limit_and_over_a_declared_timeout() -> None:
    default = tape(
        START,
        *reply(50, "r1"),
        CALL,
        (200, "tool.started", {"call": "c1"}),
        (200 + 31_000, "tool.result", {"call": "c1", "output": 1}),
        (40_000, "session.ended", {}),
    )
    assert [s for s, _ in found(default, "slow-tool")] == [5]
    declared = tape(
        START,
        *reply(50, "r1"),
        (100, "tool.call", {"reply": "r1", "call": "c1", "name": "book", "arguments": {}, "timeout": 2}),
        (200, "tool.started", {"call": "c1"}),
        (2_500, "tool.cancelled", {"call": "c1", "reason": "timeout", "outcome": "unknown"}),
        END,
    )
    violations = found(declared, "slow-tool")
    assert [s for s, _ in violations] == [5] and "2 s" in violations[0][1]


def test_slow_tool_still_running_at_the_last_event() -> None:
    events = tape(
        START, *reply(50, "r1"), CALL, (200, "tool.started", {"call": "c1"}), (45_000, "user.text", {"text": "hello?"})
    )
    violations = found(events, "slow-tool")
    assert [s for s, _ in violations] == [5] and "still running" in violations[0][1]


def test_no_slow_tool_within_the_limit() -> None:
    events = tape(
        START,
        *reply(50, "r1"),
        CALL,
        (200, "tool.started", {"call": "c1"}),
        (29_000, "tool.result", {"call": "c1", "output": 1}),
        (29_100, "session.ended", {}),
    )
    assert found(events, "slow-tool") == []


# -- the whole set -----------------------------------------------------------------------------


def test_a_clean_barge_in_call_passes_every_rule() -> None:
    events = tape(
        START,
        (500, "user.speech.started", {}),
        (1_000, "user.transcript", {"text": "book a table", "final": True}),
        (1_100, "user.speech.stopped", {}),
        *reply(1_200, "r1", "Sure, booking."),
        (1_300, "tool.call", {"reply": "r1", "call": "c1", "name": "book", "arguments": {"n": 2}}),
        (1_310, "tool.call", {"reply": "r1", "call": "c2", "name": "notify", "arguments": {}}),
        (1_320, "agent.reply.done", {"reply": "r1"}),
        (1_330, "tool.started", {"call": "c1"}),
        (1_400, "agent.speech.started", {"reply": "r1"}),
        (1_500, "user.speech.started", {}),
        (1_510, "interruption", {"reply": "r1", "cause": "user_speech", "heard": "Sure"}),
        (1_520, "agent.speech.ended", {"reply": "r1", "interrupted": True}),
        (2_000, "tool.result", {"call": "c1", "output": {"ok": True}}),
        (2_100, "user.transcript", {"text": "for three", "final": True}),
        (2_200, "user.speech.stopped", {}),
        END,
    )
    assert check(events) == []


def test_violations_come_in_seq_order_and_rule_filters_apply() -> None:
    events = tape(
        START,
        *reply(50, "r1"),
        CALL,
        (150, "interruption", {"reply": "r1"}),
        (160, "agent.text", {"reply": "r1", "text": "more"}),
        (200, "tool.started", {"call": "c1"}),
        END,
    )
    violations = check(events)
    assert [(v.seq, v.rule) for v in violations] == [(4, "orphan-call"), (6, "late-tokens"), (7, "late-start")]
    only = check_events(to_events(events), CheckOptions(now_ms=NOW), rules=["late-start"])
    assert [v.rule for v in only] == ["late-start"]
    assert str(only[0]).startswith("s 7 late-start: ")
    assert only[0].to_json() == {"session": "s", "seq": 7, "rule": "late-start", "message": only[0].message}


def test_duplicate_ids_are_one_event() -> None:
    events = tape(START, *reply(50, "r1"), CALL, (200, "tool.started", {"call": "c1"}), END)
    doubled = [*events[:5], events[4], *events[5:]]  # the tool.started line twice, same id
    assert found(doubled, "double-run") == []
    assert [s for s, _ in found(doubled, "orphan-call")] == [4]


@pytest.mark.parametrize("rule_id", list(RULES))
def test_every_rule_has_a_summary(rule_id: str) -> None:
    assert RULES[rule_id].summary and RULES[rule_id].id == rule_id
