"""``calltape.testing.assert_invariants``: the check rules plus the section 2 context invariants."""

from __future__ import annotations

from typing import Any

import pytest

from calltape.checks import CheckOptions
from calltape.checks.context import anthropic_problems, native_problems, openai_problems
from calltape.events import format_time, make_event, parse_time
from calltape.eventstore import EventStore
from calltape.testing import assert_invariants, context_violations, invariant_violations

T0 = parse_time("2025-01-31T09:30:00.000Z")


def call(session: str, *rows: tuple[int, str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"id": f"{session}-{i}", "session": session, "type": t, "at": format_time(T0 + ms), "data": d}
        for i, (ms, t, d) in enumerate(rows, start=1)
    ]


def queued_call_run_after_barge_in(session: str = "bad") -> list[dict[str, Any]]:
    return call(
        session,
        (0, "session.started", {"agent": "a", "instructions": "Book tables."}),
        (50, "user.text", {"text": "book a table"}),
        (100, "agent.reply.started", {"reply": "r1"}),
        (110, "agent.text", {"reply": "r1", "text": "Booking now"}),
        (120, "tool.call", {"reply": "r1", "call": "c1", "name": "book_table", "arguments": {"people": 2}}),
        (200, "interruption", {"reply": "r1", "cause": "user_speech"}),
        (300, "tool.started", {"call": "c1"}),
        (400, "tool.result", {"call": "c1", "output": {"ok": True}}),
        (500, "session.ended", {}),
    )


def clean(session: str = "good") -> list[dict[str, Any]]:
    return call(
        session,
        (0, "session.started", {"agent": "a", "instructions": "Book tables."}),
        (50, "user.text", {"text": "book a table"}),
        (100, "agent.reply.started", {"reply": "r1"}),
        (110, "agent.text", {"reply": "r1", "text": "Booking now"}),
        (120, "tool.call", {"reply": "r1", "call": "c1", "name": "book_table", "arguments": {"people": 2}}),
        (130, "agent.reply.done", {"reply": "r1"}),
        (140, "tool.started", {"call": "c1"}),
        (200, "interruption", {"reply": "r1", "cause": "user_speech"}),
        (400, "tool.result", {"call": "c1", "output": {"ok": True}}),
        (450, "agent.reply.started", {"reply": "r2"}),
        (460, "agent.text", {"reply": "r2", "text": "Booked."}),
        (470, "agent.reply.done", {"reply": "r2"}),
        (500, "session.ended", {"reason": "done"}),
    )


def test_a_violating_call_fails_with_the_rule_and_its_timeline(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(AssertionError) as info:
        assert_invariants(queued_call_run_after_barge_in())
    text = str(info.value)
    assert "1 invariant violation:" in text
    assert "bad 7 late-start: tool call 'book_table' [c1]" in text
    assert "Booking now" not in text and "True" not in text  # no words or outputs in the error
    timeline = capsys.readouterr().err
    assert "timeline of bad (first violation at seq 7)" in timeline
    assert "'Booking now'" in timeline and "barge-in" in timeline and "LATE" in timeline


def test_a_clean_call_passes_in_every_shape() -> None:
    events = clean()
    assert_invariants(events)
    assert_invariants(events, "good")
    # several sessions in one list: each is checked; session= picks one
    mixed = events + queued_call_run_after_barge_in()
    assert_invariants(mixed, "good")
    with pytest.raises(AssertionError, match="late-start"):
        assert_invariants(mixed)


def test_options_reach_the_rules() -> None:
    events = call(
        "s",
        (0, "session.started", {"agent": "a"}),
        (100, "agent.reply.started", {"reply": "r1"}),
        (110, "tool.call", {"reply": "r1", "call": "c1", "name": "slow", "arguments": {}}),
        (120, "agent.reply.done", {"reply": "r1"}),
        (130, "tool.started", {"call": "c1"}),
        (5_130, "tool.result", {"call": "c1", "output": 1}),
        (5_200, "session.ended", {}),
    )
    assert_invariants(events)
    with pytest.raises(AssertionError, match="slow-tool"):
        assert_invariants(events, options=CheckOptions(default_tool_timeout_s=2))


async def test_a_store_session(calltape_store: EventStore) -> None:
    from calltape.checks import to_events

    await calltape_store.append(to_events(clean("ok")) + to_events(queued_call_run_after_barge_in("ko")))
    await assert_invariants(calltape_store, "ok")
    with pytest.raises(AssertionError, match="ko 7 late-start"):
        await assert_invariants(calltape_store, "ko")


async def test_the_store_fixture_is_empty_and_private(calltape_store: EventStore) -> None:
    assert await calltape_store.sessions() == []
    await calltape_store.append([make_event("x", "session.started", {"agent": "a"})])
    assert [s.session for s in await calltape_store.sessions()] == ["x"]


def test_context_invariants_catch_an_output_away_from_its_call() -> None:
    native = {
        "items": [
            {"type": "message", "role": "system", "content": ""},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "function_call_output", "call_id": "c1", "output": 1, "status": "completed"},
        ]
    }
    problems = native_problems(native)
    assert any("not answered" in p for p in problems)
    assert any("away from its assistant message" in p for p in problems)
    assert native_problems({"items": [{"type": "message", "role": "system", "content": ""}]}) == []


def test_provider_format_checks_catch_unanswered_calls_and_broken_alternation() -> None:
    unanswered = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "user", "content": "hi"},
    ]
    assert openai_problems(unanswered)
    assert openai_problems([{"role": "tool", "tool_call_id": "c1", "content": "1"}])
    assert not openai_problems([{"role": "user", "content": "hi"}])
    twice = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}] * 2}
    assert any("strict alternation" in p for p in anthropic_problems(twice))


def test_the_contexts_of_real_timelines_keep_the_invariants() -> None:
    from calltape.checks import to_events

    for events in (clean(), queued_call_run_after_barge_in()):
        assert context_violations(to_events(events)) == []
    assert [v.rule for v in invariant_violations(queued_call_run_after_barge_in())] == ["late-start"]
