"""The effect rules of ``calltape check`` (SPEC section 8): seeded violations are found exactly (rule and
seq), clean interleavings generated at random never are; ``calltape stats`` counts effects by outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from cli.conftest import Cli
from effect_calls import charged_call, effect, tape
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calltape.checks import CheckOptions, check_events, to_events
from calltape.runtime import session_stats

EFFECT_RULES = ("double-effect", "unheard-effect", "unsettled-effect")


def found(events: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(v.rule, v.seq) for v in check_events(to_events(events), CheckOptions(), rules=EFFECT_RULES)]


def call_rows(ms: int, call: str, reply: str, *, played: bool = True, text: str = "Charging now.") -> list[tuple]:
    rows: list[tuple] = [
        (ms, "agent.reply.started", {"reply": reply}),
        (ms + 1, "agent.text", {"reply": reply, "text": text}),
        (ms + 2, "tool.call", {"reply": reply, "call": call, "name": "charge_card", "arguments": {}}),
        (ms + 3, "agent.reply.done", {"reply": reply}),
        (ms + 4, "tool.started", {"call": call}),
        (ms + 5, "agent.speech.started", {"reply": reply}),
    ]
    if played:
        rows.append((ms + 6, "agent.speech.ended", {"reply": reply, "interrupted": False}))
    return rows


START = (0, "session.started", {"agent": "billing"})


def test_the_clean_call_has_no_finding() -> None:
    assert found(charged_call()) == []


def test_double_effect_after_done_after_unknown_and_while_running() -> None:
    after_done = tape(
        START,
        *call_rows(10, "c1", "r1"),  # seqs 2-8
        (20, "tool.effect", effect("c1", "started")),  # 9
        (21, "tool.effect", effect("c1", "done", output=1)),  # 10
        (22, "tool.result", {"call": "c1", "output": 1}),  # 11
        *call_rows(30, "c2", "r2"),  # 12-18: the LLM asks again under a new call id
        (40, "tool.effect", effect("c2", "started")),  # 19
        (41, "tool.effect", effect("c2", "done", output=2)),
    )
    assert found(after_done) == [("double-effect", 19)]
    while_running = tape(
        START,
        *call_rows(10, "c1", "r1"),
        (20, "tool.effect", effect("c1", "started")),  # 9
        *call_rows(30, "c2", "r2"),
        (40, "tool.effect", effect("c2", "started")),  # 17
        (41, "tool.effect", effect("c2", "done")),
        (42, "tool.effect", effect("c1", "done")),
    )
    assert found(while_running) == [("double-effect", 17)]
    after_unknown = tape(
        START,
        *call_rows(10, "c1", "r1"),
        (20, "tool.effect", effect("c1", "started")),  # 9
        (21, "session.dropped", {}),
        (22, "tool.effect", effect("c1", "unknown"), 2),
        (23, "tool.cancelled", {"call": "c1", "reason": "dropped", "outcome": "unknown"}, 2),
        (24, "session.resumed", {"agent": "billing", "epoch": 2, "from_seq": 1}, 2),
        (25, "tool.started", {"call": "c1"}, 2),  # a retry of the call (declared idempotent)
        (26, "tool.effect", effect("c1", "started"), 2),  # 15: charged a second time
        (27, "tool.effect", effect("c1", "done"), 2),
    )
    assert found(after_unknown) == [("double-effect", 15)]


def test_only_a_failed_run_may_run_again_and_other_keys_are_other_effects() -> None:
    events = tape(
        START,
        *call_rows(10, "c1", "r1"),
        (20, "tool.effect", effect("c1", "started")),
        (21, "tool.effect", effect("c1", "failed")),
        (22, "tool.effect", effect("c1", "started")),  # the retry after a failure: allowed
        (23, "tool.effect", effect("c1", "done")),
        (24, "tool.effect", effect("c1", "started", key="order-8")),  # another order
        (25, "tool.effect", effect("c1", "done", key="order-8")),
        (26, "tool.effect", effect("c1", "started", name="refund")),  # another action
        (27, "tool.effect", effect("c1", "done", name="refund")),
        (28, "session.ended", {}),
    )
    assert found(events) == []


def test_unheard_effect_before_the_end_of_playout_and_after_a_barge_in() -> None:
    playing = tape(
        START,
        *call_rows(10, "c1", "r1", played=False),  # seqs 2-7: the announcement is playing
        (20, "tool.effect", effect("c1", "started", heard=True)),  # 8
        (21, "tool.effect", effect("c1", "done")),
    )
    assert found(playing) == [("unheard-effect", 8)]
    cut = tape(
        START,
        *call_rows(10, "c1", "r1", played=False),
        (20, "interruption", {"reply": "r1", "cause": "user_speech"}),  # 8: the caller said stop
        (21, "agent.speech.ended", {"reply": "r1", "interrupted": True}),
        (30, "tool.effect", effect("c1", "started", heard=True)),  # 10: charged anyway (issue 28, bad tool a)
        (31, "tool.effect", effect("c1", "done")),
    )
    violations = check_events(to_events(cut), CheckOptions(), rules=EFFECT_RULES)
    assert [(v.rule, v.seq) for v in violations] == [("unheard-effect", 10)]
    assert "interrupted at seq 8" in violations[0].message and "order-7" not in violations[0].message
    # not declared heard first: the rule has nothing to say (the user's own assertion must)
    undeclared = [dict(e, data={k: v for k, v in e["data"].items() if k != "heard"}) for e in cut]
    assert found(undeclared) == []


def test_a_reply_with_no_text_counts_once_done() -> None:
    rows = call_rows(10, "c1", "r1", text="")
    quiet = [r for r in rows if r[1] not in ("agent.text", "agent.speech.started", "agent.speech.ended")]
    heard_start = (20, "tool.effect", effect("c1", "started", heard=True))
    generating = tape(START, *[r for r in quiet if r[1] != "agent.reply.done"], heard_start)
    assert found(generating) == [("unheard-effect", 5)]  # the reply was still being generated
    events = tape(START, *quiet, heard_start, (21, "session.ended", {}))
    assert found(events) == [("unsettled-effect", 6)]  # heard is fine: only the end left it started


def test_unsettled_effect_at_the_end_and_at_a_resume() -> None:
    started = (20, "tool.effect", effect("c1", "started"))  # seq 9
    ended = tape(START, *call_rows(10, "c1", "r1"), started, (30, "session.ended", {}))
    assert found(ended) == [("unsettled-effect", 9)]
    dropped = (21, "session.dropped", {})
    cancelled = (22, "tool.cancelled", {"call": "c1", "reason": "dropped", "outcome": "unknown"}, 2)
    unknown = (23, "tool.effect", effect("c1", "unknown"), 2)
    tail = [(24, "session.resumed", {"agent": "billing", "epoch": 2, "from_seq": 1}, 2), (25, "session.ended", {}, 2)]
    resumed = tape(START, *call_rows(10, "c1", "r1"), started, dropped, cancelled, *tail)  # not settled
    assert found(resumed) == [("unsettled-effect", 9)]  # once, although both the resume and the end find it
    assert found(tape(START, *call_rows(10, "c1", "r1"), started, dropped, cancelled, unknown, *tail)) == []


def test_check_cli_names_rule_and_seq(cli: Cli, tmp_path: Path) -> None:
    bad = tape(
        START,
        *call_rows(10, "c1", "r1", played=False),
        (20, "interruption", {"reply": "r1"}),  # 8
        (30, "tool.effect", effect("c1", "started", heard=True)),  # 9
        (35, "tool.result", {"call": "c1", "output": {"charged": 40}}),  # the tool forgot to settle its effect
        (40, "session.ended", {}),  # 11
        session="bad-call",
    )
    path = tmp_path / "calls.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in [*charged_call("good-call"), *bad]))
    as_json, as_text = cli.many(["check", "--file", str(path), "--json"], ["check", "--file", str(path)], db=False)
    assert as_json.code == 1, as_json
    assert [(v["session"], v["seq"], v["rule"]) for v in as_json.json()] == [
        ("bad-call", 9, "unheard-effect"),
        ("bad-call", 9, "unsettled-effect"),
    ]
    assert "bad-call 9 unheard-effect: " in as_text.out


def test_stats_count_effects_by_name_and_outcome(cli: Cli, tmp_path: Path, session_id: str) -> None:
    events = tape(
        START,
        *call_rows(10, "c1", "r1"),
        (20, "tool.effect", effect("c1", "started")),
        (21, "tool.effect", effect("c1", "failed")),
        (22, "tool.effect", effect("c1", "started")),
        (23, "tool.effect", effect("c1", "done")),
        (24, "tool.effect", effect("c1", "started", name="refund")),
        (25, "tool.effect", effect("c1", "unknown", name="refund")),
        session=session_id,
    )
    assert session_stats(to_events(events))["effects"] == {"charge": {"done": 1, "failed": 1}, "refund": {"unknown": 1}}
    path = tmp_path / "call.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    # the totals cover every session of the store (on PostgreSQL, other tests' too): compare before and after
    empty = cli("stats", "--json")  # a fresh SQLite file is no database yet: nothing counted
    before = empty.json().get("effects", {}) if empty.code == 0 else {}
    assert cli("import", str(path)).code == 0
    one, total, text = cli.many(["stats", session_id, "--json"], ["stats", "--json"], ["stats", session_id])
    assert one.json()["effects"] == {"charge": {"done": 1, "failed": 1}, "refund": {"unknown": 1}}, one
    added = {
        name: {
            o: n - before.get(name, {}).get(o, 0) for o, n in outcomes.items() if n != before.get(name, {}).get(o, 0)
        }
        for name, outcomes in total.json()["effects"].items()
    }
    assert {name: outcomes for name, outcomes in added.items() if outcomes} == one.json()["effects"], total
    assert "charge: 1 done, 1 failed; refund: 1 unknown" in text.out, text


# -- clean interleavings at random ------------------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["start", "start_heard", "settle", "reconcile", "drop", "cut_reply"]),
        st.integers(0, 2),  # which effect (name, key)
        st.sampled_from(["done", "failed", "unknown"]),
    ),
    max_size=30,
)


class _Call:
    """Builds a call that follows SPEC section 8 whatever the operations: what the runtime writes."""

    def __init__(self) -> None:
        self.rows: list[tuple] = [START]
        self.ms = 0
        self.epoch = 1
        self.calls = 0
        self.phase: dict[int, str | None] = {}
        self.call_of: dict[int, str] = {}

    def add(self, kind: str, data: dict[str, Any]) -> None:
        self.ms += 10
        self.rows.append((self.ms, kind, data, self.epoch))

    def key(self, which: int) -> dict[str, str]:
        return {"name": ["charge", "book", "refund"][which], "key": f"k{which}"}

    def effect(self, which: int, phase: str, **extra: Any) -> None:
        self.add("tool.effect", {"call": self.call_of[which], **self.key(which), "phase": phase, **extra})
        self.phase[which] = phase

    def start(self, which: int, heard: bool) -> None:
        if self.phase.get(which) not in (None, "failed"):
            return  # the runtime answers from the log (done) or refuses (started, unknown)
        self.calls += 1
        call, reply = f"c{self.calls}", f"r{self.calls}"
        self.add("agent.reply.started", {"reply": reply})
        self.add("agent.text", {"reply": reply, "text": "One moment."})
        self.add("tool.call", {"reply": reply, "call": call, "name": "tool", "arguments": {}})
        self.add("agent.reply.done", {"reply": reply})
        self.add("tool.started", {"call": call})
        self.add("agent.speech.started", {"reply": reply})
        if heard:
            self.add("agent.speech.ended", {"reply": reply, "interrupted": False})
        self.call_of[which] = call
        self.effect(which, "started", **({"heard": True} if heard else {}))

    def settle(self, which: int, phase: str) -> None:
        if self.phase.get(which) == "started":
            self.effect(which, phase)

    def reconcile(self, which: int, phase: str) -> None:
        if self.phase.get(which) == "unknown" and phase != "unknown":
            self.effect(which, phase)

    def drop(self) -> None:
        self.add("session.dropped", {})
        self.epoch += 1
        for which, phase in list(self.phase.items()):
            if phase == "started":
                self.effect(which, "unknown")
        self.add("session.resumed", {"agent": "billing", "epoch": self.epoch, "from_seq": 1})

    def cut_reply(self) -> None:
        if self.calls:
            self.add("interruption", {"reply": f"r{self.calls}"})

    def end(self) -> list[dict[str, Any]]:
        for which, phase in list(self.phase.items()):
            if phase == "started":
                self.effect(which, "done")
        self.add("session.ended", {})
        return tape(*self.rows)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_clean_effect_interleavings_have_no_finding(ops: list[tuple[str, int, str]]) -> None:
    call = _Call()
    for op, which, phase in ops:
        if op in ("start", "start_heard"):
            call.start(which, op == "start_heard")
        elif op == "settle":
            call.settle(which, phase)
        elif op == "reconcile":
            call.reconcile(which, phase)
        elif op == "drop":
            call.drop()
        else:
            call.cut_reply()
    events = call.end()
    assert found(events) == []
    # and the runs the log holds are exactly the starts the builder made
    starts = sum(1 for e in events if e["type"] == "tool.effect" and e["data"]["phase"] == "started")
    stats = session_stats(to_events(events))["effects"]
    assert sum(sum(c.values()) for c in stats.values()) == starts
