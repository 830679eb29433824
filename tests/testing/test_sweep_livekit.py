"""Sweeping a team's existing, unmodified LiveKit ``session.run`` / ``RunResult`` test: as written,
then once per event boundary with a barge-in, every rule of ``calltape check`` on every run."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("livekit.agents")

import existing_livekit_shop as existing

from calltape.testing.livekit import Call, Say
from calltape.testing.sweep import sweep_livekit

pytestmark = pytest.mark.livekit

MODEL = [
    [Say("Charging order 42 now."), Call("charge_card", "c1", {"order": "42"})],
    [Say("Done: your card is charged.")],
]


async def test_the_unmodified_test_is_swept_over_every_boundary() -> None:
    existing.CHARGES.clear()
    started = time.perf_counter()
    sweep = await sweep_livekit(existing.test_charges_the_order, llm=MODEL)
    took = time.perf_counter() - started
    print(f"\nLiveKit RunResult sweep: {len(sweep.runs)} runs in {took:.1f} s")  # the figure for the docs
    sweep.assert_ok()  # no rule broken anywhere; the test's own expectations hold as written
    baseline = sweep.runs[0]
    assert baseline.session not in sweep.unmet
    assert [e.data["name"] for e in baseline.events if e.type == "tool.call"] == ["charge_card"]
    # one run per boundary of the test as written (its first and last events aside)
    assert len(sweep.runs) == 1 + len(baseline.events) - 2
    # the barge-ins really landed, and cut the conversation the test's expectations describe
    cut = [r for r in sweep.runs[1:] if any(e.type == "interruption" for e in r.events)]
    assert cut and set(sweep.unmet) <= {r.session for r in sweep.runs[1:]} and sweep.unmet
    # the test's model never ran (the scripted stand-in answered), its judge was not asked
    assert any("judge() not asked" in n for n in sweep.notes)
    assert any("no drop runs" in n for n in sweep.notes)


async def test_strict_keeps_the_tests_expectations_on_every_run() -> None:
    sweep = await sweep_livekit(existing.test_charges_the_order, llm=MODEL, strict=True)
    groups = sweep.exploration.by_rule()
    assert list(groups) == ["assertion"]
    assert {run.session for run, _ in groups["assertion"]} == set(sweep.unmet)


async def test_a_broken_expectation_fails_the_run_as_written() -> None:
    wrong = [[Say("Charging order 43 now."), Call("charge_card", "c1", {"order": "43"})], [Say("Done.")]]
    sweep = await sweep_livekit(existing.test_charges_the_order, llm=wrong)
    assert sweep.runs[0].failed
    assert sweep.runs[0].problems[0].startswith("assertion failed: the test's own expectation failed")
    with pytest.raises(AssertionError, match="the uninterrupted run"):
        sweep.assert_ok()
