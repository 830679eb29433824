"""The effect rules of SPEC section 8 apply to every explored run with no assertion of the user's: a
heard-first charge made although the caller cut its announcement off is found, every failing run is
reported under ``unheard-effect`` with the seq of the charge's ``started``; the same agent waiting for
the announcement properly passes every boundary."""

from __future__ import annotations

import asyncio
from typing import Any

from calltape.runtime import CallSession
from calltape.testing.explore import explore

CHARGED: dict[str, int] = {}


def agent(*, waits_properly: bool) -> Any:
    """Announces a charge, plays the announcement, then charges (a heard-first effect, recorded by hand
    the way section 8 lays its phases out). The careless one takes "the playout is over" for "the
    caller heard it", so it charges after a barge-in too."""

    async def run(call: CallSession) -> None:
        call.emit("user.transcript", {"text": "charge my order 42", "final": True})
        call.emit("agent.reply.started", {"reply": "r1"})
        steps: list[tuple[str, dict[str, Any]]] = [
            ("agent.text", {"reply": "r1", "text": "Charging your card for order 42 now."}),
            ("tool.call", {"reply": "r1", "call": "c1", "name": "charge_card", "arguments": {"order": "42"}}),
            ("agent.reply.done", {"reply": "r1"}),
            ("agent.speech.started", {"reply": "r1"}),
        ]
        for kind, data in steps:
            if call.reply_interrupted("r1"):
                break
            call.emit(kind, data)
        if call.call_state("c1") is None:
            return
        await asyncio.sleep(0.01)  # the announcement plays
        if not call.reply_interrupted("r1"):
            call.emit("agent.speech.ended", {"reply": "r1", "interrupted": False})
        if waits_properly and call.reply_interrupted("r1"):
            call.emit("tool.cancelled", {"call": "c1", "reason": "interrupted", "outcome": "not_run"})
            return
        await call.emit_durable("tool.started", {"call": "c1"})
        if waits_properly and call.reply_interrupted("r1"):
            # the caller said stop before the action, even after hearing the announcement: not run
            call.emit("tool.cancelled", {"call": "c1", "reason": "interrupted", "outcome": "not_run"})
            return
        effect = {"call": "c1", "name": "charge_card", "key": "order-42"}
        await call.emit_durable("tool.effect", {**effect, "phase": "started", "heard": True})
        CHARGED[call.session_id] = CHARGED.get(call.session_id, 0) + 1
        call.emit("tool.effect", {**effect, "phase": "done", "output": {"charged": 40}})
        call.emit("tool.result", {"call": "c1", "output": {"charged": 40}})

    return run


async def test_an_unheard_charge_is_found_with_no_assertion_of_the_users() -> None:
    CHARGED.clear()  # run sessions are named by boundary: the same names in every exploration
    exploration = await explore(agent(waits_properly=False), drops=False)
    assert not exploration.baseline.failed, exploration.baseline.describe()
    failures = exploration.failures
    assert failures
    groups = exploration.by_rule()
    assert "unheard-effect" in groups
    # every failing run charged after the caller cut the announcement, and each is in the group
    unheard = {run.session for run, _ in groups["unheard-effect"]}
    assert unheard == {r.session for r in failures if any(e.type == "interruption" for e in r.events)}
    for run, seq in groups["unheard-effect"]:
        (state,) = run.effects("charge_card")
        assert [r.seq for r in state.runs] == [seq] and CHARGED[run.session] == 1
        assert not run.played(run.reply_of("c1") or "")
    report = exploration.report()
    assert report.count("-- explored-at-") >= len(groups["unheard-effect"])
    assert "== unheard-effect:" in report


async def test_the_agent_that_waits_properly_passes_every_boundary() -> None:
    CHARGED.clear()
    exploration = await explore(agent(waits_properly=True), drops=False)
    exploration.assert_ok()
    cut = [r for r in exploration.runs if any(e.type == "interruption" for e in r.events)]
    assert cut
    for run in cut:  # a charge only when the caller had not said stop first
        barge_in = run.landed_seq or 0
        started = [r.seq for state in run.effects("charge_card") for r in state.runs]
        assert CHARGED.get(run.session, 0) == len(started) and all(seq < barge_in for seq in started)
    assert any(not CHARGED.get(r.session) for r in cut) and any(CHARGED.get(r.session) for r in cut)
