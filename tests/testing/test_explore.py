"""Barge-in exploration finds pipecat#4997's shape (a queued call of an interrupted generation that
runs anyway) in an unguarded agent, and passes once the agent runs its tools under ``run_tool``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from calltape import CallSession, ToolSpec
from calltape.testing.dropresume import started_calls
from calltape.testing.explore import Run, explore

BOOKINGS: list[dict[str, Any]] = []


async def book_table() -> dict[str, Any]:
    """The agent's real tool (a side effect we must not repeat or run for a cancelled turn)."""
    await asyncio.sleep(0.01)
    booking = {"reference": f"BK-{len(BOOKINGS) + 1}"}
    BOOKINGS.append(booking)
    return booking


def turn(call: CallSession) -> None:
    """The scripted caller and the scripted LLM's first turn (the LLM stops streaming when cancelled)."""
    call.emit("user.speech.started", {"source": "vad"})
    call.emit("user.transcript", {"text": "a table for two at eight", "final": True})
    call.emit("user.speech.stopped")
    call.emit("agent.reply.started", {"reply": "r1"})
    steps: list[tuple[str, dict[str, Any]]] = [
        ("agent.text", {"reply": "r1", "text": "Booking that now."}),
        ("tool.call", {"reply": "r1", "call": "c1", "name": "book_table", "arguments": {"people": 2}}),
        ("agent.reply.done", {"reply": "r1"}),
    ]
    for kind, data in steps:
        if call.reply_interrupted("r1"):
            return
        call.emit(kind, data)


async def unguarded_agent(call: CallSession) -> None:
    """Runs the queued call whatever happened to its generation (the bug)."""
    turn(call)
    if call.call_state("c1") is None:
        return  # the generation was cut before it asked for the tool
    await asyncio.sleep(0)  # the function-call runner picks the call up later
    call.emit("tool.started", {"call": "c1"})
    output = await book_table()
    call.emit("tool.result", {"call": "c1", "output": output})


async def guarded_agent(call: CallSession) -> None:
    """The same agent with the tool under calltape's guard."""
    turn(call)
    await asyncio.sleep(0)
    await call.run_tool("c1", "book_table", {"people": 2}, book_table, reply="r1")


def no_booking_for_a_cancelled_turn(run: Run) -> None:
    """The user's own assertion: a booking exists only when the turn asking for it was not cut first."""
    outputs = [i for i in run.context["items"] if i["type"] == "function_call_output"]
    # a drop mid-tool (then a resume) leaves the booking's outcome unknown: never re-run blindly
    allowed = ("completed", "cancelled", "unknown") if run.dropped else ("completed", "cancelled")
    for output in outputs:
        assert output["status"] in allowed, output["status"]


async def test_exploration_finds_the_queued_call_of_an_interrupted_generation() -> None:
    exploration = await explore(unguarded_agent, assertions=no_booking_for_a_cancelled_turn)
    assert not exploration.baseline.failed, exploration.baseline.describe()
    failures = exploration.failures
    assert failures, "the barge-in between the call and its start must be found"
    # a barge-in between the queued call and its start cuts the generation, and the call runs anyway
    assert [r.after.split(",")[0] for r in failures if r.after] == ["agent.reply.done"] * len(failures)
    assert all({v.rule for v in r.violations} == {"late-start"} for r in failures)
    with pytest.raises(
        AssertionError,
        match=r"runs failed\nlate-start \(\d+ runs?\):\n  a barge-in at boundary \d+ \(landed after agent.reply.done",
    ):
        exploration.assert_ok()


async def test_the_guarded_agent_passes_every_boundary() -> None:
    started = time.perf_counter()
    exploration = await explore(guarded_agent, assertions=no_booking_for_a_cancelled_turn)
    exploration.assert_ok()
    # one run per event boundary of the uninterrupted run (session.started and session.ended aside),
    # and one drop and resume per tool call that started
    calls = started_calls(exploration.baseline.events)
    assert len(exploration.runs) == 1 + len(exploration.baseline.events) - 2 + len(calls)
    assert [r.dropped for r in exploration.runs if r.dropped] == calls != []
    assert any(r.interrupted or r.boundary for r in exploration.runs[1:])
    assert time.perf_counter() - started < 60


async def test_forty_boundaries_explore_in_seconds() -> None:
    async def long_agent(call: CallSession) -> None:
        for i in range(8):
            call.emit("user.transcript", {"text": f"question {i}", "final": True})
            call.emit("agent.reply.started", {"reply": f"r{i}"})
            if call.reply_interrupted(f"r{i}"):
                continue
            call.emit("agent.text", {"reply": f"r{i}", "text": "Let me see."})
            if call.reply_interrupted(f"r{i}"):
                continue
            call.emit("tool.call", {"reply": f"r{i}", "call": f"c{i}", "name": "lookup", "arguments": {"i": i}})
            call.emit("agent.reply.done", {"reply": f"r{i}"})
            await call.run_tool(f"c{i}", "lookup", {"i": i}, book_table, reply=f"r{i}")

    exploration = await explore(long_agent)
    exploration.assert_ok()
    assert len(exploration.runs) >= 41
    assert exploration.seconds < 60, exploration.seconds


async def test_a_failing_user_assertion_is_reported_with_its_instant() -> None:
    def never_interrupted(run: Run) -> None:
        assert not any(e.type == "interruption" for e in run.events), "the agent was interrupted"

    exploration = await explore(guarded_agent, assertions=never_interrupted)
    assert not exploration.baseline.failed
    assert all(r.failed for r in exploration.runs[1:])
    assert "assertion failed: the agent was interrupted" in exploration.failures[0].describe()
    # the summary (the exception message) gives one line per failing run: pytest's detail is in the report
    lines = exploration.summary().splitlines()
    assert lines[1] == f"assertion ({len(exploration.failures)} runs):"
    assert len(lines) == 2 + len(exploration.failures)
    assert all(line.endswith("assertion failed: the agent was interrupted") for line in lines[2:])


def test_tool_specs_are_untouched() -> None:
    assert ToolSpec().timeout > 0


async def test_virtual_time_explores_a_slow_scenario_in_no_wall_time() -> None:
    async def slow_agent(call: CallSession) -> None:
        call.emit("user.transcript", {"text": "book it", "final": True})
        call.emit("agent.reply.started", {"reply": "r1"})
        await asyncio.sleep(20)  # a long think: virtual seconds
        if not call.reply_interrupted("r1"):
            call.emit("agent.text", {"reply": "r1", "text": "Booked."})
            call.emit("agent.reply.done", {"reply": "r1"})

    started = time.perf_counter()
    exploration = await explore(slow_agent, virtual_time=True)
    exploration.assert_ok()
    assert len(exploration.runs) == 5  # the uninterrupted run and a barge-in after each of its 4 events
    assert time.perf_counter() - started < 15  # 5 runs of 20 s each, on a virtual clock


# -- the report: every failing run, by rule, with its seq and timeline -----------------------------


def _row_seq(line: str) -> int | None:
    """The seq of a timeline line (``▶ 12 +0.010 …`` or ``  11 +0.000 …``), None for other lines."""
    tokens = line.split()
    if tokens and tokens[0] == "▶":
        tokens = tokens[1:]
    return int(tokens[0]) if len(tokens) > 1 and tokens[0].isdigit() and tokens[1].startswith("+") else None


async def test_the_report_lists_every_failing_run_grouped_by_rule_with_its_timeline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exploration = await explore(unguarded_agent, assertions=no_booking_for_a_cancelled_turn)
    failures = exploration.failures
    assert len(failures) >= 1
    groups = exploration.by_rule()
    assert list(groups) == ["late-start"]
    # every failing run is there (not only the first), each with the seq its violation names
    assert [run for run, _ in groups["late-start"]] == failures
    for run, seq in groups["late-start"]:
        (violation,) = run.violations
        assert seq == violation.seq
        assert next(e for e in run.events if e.seq == seq).type == "tool.started"
    report = exploration.report(radius=2)
    for run, seq in groups["late-start"]:
        block = report.split(f"-- {run.session}: ")[1].split("\n-- ")[0]
        assert block.startswith(f"{run.where}; seq {seq}")
        marked = [line for line in block.splitlines() if line.lstrip().startswith("▶")]
        assert len(marked) == 1 and marked[0].split()[1] == str(seq)  # that seq's line, marked
        seqs = [_row_seq(line) for line in block.splitlines()]
        seqs = [n for n in seqs if n is not None]
        assert min(seqs) >= seq - 2 and max(seqs) <= seq + 2 and seq in seqs  # the timeline around it
    with pytest.raises(AssertionError) as raised:
        exploration.assert_ok()
    message = str(raised.value)
    assert message.count("a barge-in at boundary") == len(failures)  # every failing run, in the message
    assert "a table for two" not in message  # the call's words stay out of the exception
    assert "▶" in capsys.readouterr().err  # the report with its timelines goes to stderr


async def test_a_rule_added_to_calltape_check_applies_to_exploration_at_once() -> None:
    from collections.abc import Iterator

    from calltape.checks import RULES, CheckOptions, SessionFacts, Violation, rule

    @rule("x-test-every-reply", "flags every reply (test only)")
    def every_reply(facts: SessionFacts, options: CheckOptions) -> Iterator[Violation]:
        for reply in facts.replies.values():
            yield Violation(facts.session, 1, "x-test-every-reply", f"reply {reply.reply}")

    try:
        exploration = await explore(guarded_agent, drops=False)
    finally:
        del RULES["x-test-every-reply"]
    assert (
        exploration.failures
        == [r for r in exploration.runs if r.events and any(e.type == "agent.reply.started" for e in r.events)]
        != []
    )
    assert "x-test-every-reply" in exploration.by_rule()


async def test_the_run_helpers_answer_what_a_users_assertion_asks() -> None:
    seen: dict[int | None, tuple[str | None, str, bool, list[str]]] = {}

    def record(run: Run) -> None:
        reply = run.reply_of("c1")
        seen[run.boundary] = (reply, run.heard("r1"), run.played("r1"), run.calls("book_table"))

    exploration = await explore(guarded_agent, assertions=record, drops=False)
    # uninterrupted: r1 carried c1 and was heard whole, but no playout was recorded: not "played"
    assert seen[None] == ("r1", "Booking that now.", False, ["c1"])
    # a barge-in before r1's text: nothing of it was heard, and it never played
    early = [v for b, v in seen.items() if b is not None and v[1] == ""]
    assert early and all(not played for _, _, played, _ in early)
    assert exploration.runs[0].reply_of("nope") is None and exploration.runs[0].heard("nope") == ""


def test_the_effects_of_a_name_are_read_from_the_effect_events() -> None:
    from calltape.events import Event

    def effect(seq: int, call: str, key: str, phase: str, output: Any = None) -> Event:
        data: dict[str, Any] = {"call": call, "name": "charge_card", "key": key, "phase": phase}
        if output is not None:
            data["output"] = output
        return Event("tool.effect", data, "s", id=f"e{seq}", seq=seq)

    run = Run(
        boundary=3,
        events=[
            effect(1, "c1", "order-1", "started"),
            effect(2, "c1", "order-1", "done", {"charged": 40}),
            effect(3, "c2", "order-1", "started"),  # asked again under a new call id, and run again
            effect(4, "c2", "order-1", "done", {"charged": 40}),
            effect(5, "c3", "order-2", "started"),
            Event(
                "tool.effect",
                {"call": "c4", "name": "refund", "key": "order-1", "phase": "started"},
                "s",
                id="e6",
                seq=6,
            ),
        ],
    )
    first, second = run.effects("charge_card")
    assert (first.key, first.phase, first.output) == ("order-1", "done", {"charged": 40})
    assert [(r.call, r.seq, r.phase) for r in first.runs] == [("c1", 1, "done"), ("c2", 3, "done")]  # run twice
    assert (second.key, second.phase, [r.call for r in second.runs]) == ("order-2", "started", ["c3"])
    assert [e.key for e in run.effects("refund")] == ["order-1"] and run.effects("nothing") == []
