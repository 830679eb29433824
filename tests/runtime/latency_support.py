"""Hand-built timelines whose latency figures are known to the millisecond (shared by the runtime,
CLI and server tests)."""

from __future__ import annotations

from typing import Any

from calltape.events import Event, format_time, parse_event, parse_time

T0 = parse_time("2025-03-01T10:00:00.000Z")

# Session A: a turn with a pause, a tool, a barge-in, a second turn, a reply with no waiting user.
TIMELINE_A: list[tuple[int, str, dict[str, Any]]] = [
    (0, "session.started", {"agent": "booker"}),
    (1000, "user.speech.started", {}),
    (1800, "user.speech.stopped", {}),
    (2000, "user.speech.started", {}),  # the user went on: the turn ends at the next stop
    (2400, "user.transcript", {"text": "a table for two at eight", "final": True}),
    (2500, "user.speech.stopped", {}),
    (2600, "agent.reply.started", {"reply": "r1"}),
    (2900, "agent.text", {"reply": "r1", "text": "Sure, "}),  # first text: 300
    (2950, "agent.text", {"reply": "r1", "text": "booking it."}),
    (3000, "tool.call", {"reply": "r1", "call": "c1", "name": "book_table", "arguments": {"people": 2}}),
    (3100, "tool.started", {"call": "c1"}),
    (3300, "agent.speech.started", {"reply": "r1"}),  # response: 3300 - 2500 = 800
    (4000, "user.speech.started", {}),
    (4100, "interruption", {"reply": "r1", "cause": "user_speech", "heard": "Sure,"}),
    (4350, "agent.speech.ended", {"reply": "r1", "interrupted": True, "heard": "Sure,"}),  # talk-over: 250
    (4600, "tool.result", {"call": "c1", "output": {"ok": True}}),  # book_table: 1500
    (4700, "user.speech.stopped", {}),
    (4750, "agent.reply.started", {"reply": "r2"}),
    (5150, "agent.text", {"reply": "r2", "text": "Done."}),  # first text: 400
    (5200, "agent.speech.started", {"reply": "r2"}),  # response: 5200 - 4700 = 500
    (5300, "tool.call", {"reply": "r2", "call": "c2", "name": "lookup", "arguments": {}}),
    (5400, "tool.started", {"call": "c2"}),
    (5500, "tool.cancelled", {"call": "c2", "reason": "timeout"}),  # lookup: 100
    (6000, "agent.speech.ended", {"reply": "r2", "interrupted": False}),  # no barge-in: no sample
    (6050, "agent.reply.started", {"reply": "r3"}),  # no text ever: no first-text sample
    (6100, "agent.speech.started", {"reply": "r3"}),  # nobody waiting: no response sample
    (6200, "interruption", {"cause": "api"}),  # the latest reply, r3, is playing
    (6900, "agent.speech.ended", {"reply": "r3", "interrupted": True}),  # talk-over: 700
    (7000, "interruption", {"reply": "r2"}),  # r2 is not playing: no sample
    (7100, "session.ended", {}),
]
EXPECTED_A = {
    "user_stopped_to_agent_speech": [800, 500],
    "interruption_to_agent_stopped": [250, 700],
    "reply_to_first_text": [300, 400],
    "tool_duration": {"book_table": [1500], "lookup": [100]},
}
SUMMARY_A = {
    "user_stopped_to_agent_speech": {"count": 2, "p50": 500, "p95": 800, "p99": 800, "max": 800},
    "interruption_to_agent_stopped": {"count": 2, "p50": 250, "p95": 700, "p99": 700, "max": 700},
    "reply_to_first_text": {"count": 2, "p50": 300, "p95": 400, "p99": 400, "max": 400},
    "tool_duration": {
        "book_table": {"count": 1, "p50": 1500, "p95": 1500, "p99": 1500, "max": 1500},
        "lookup": {"count": 1, "p50": 100, "p95": 100, "p99": 100, "max": 100},
    },
}
"""What ``calltape stats`` prints for session A under ``latency_ms``."""

# Session B: a drop forgets what was waiting; a writer's clock running behind is skipped; a retried tool.
TIMELINE_B: list[tuple[int, str, dict[str, Any]]] = [
    (0, "session.started", {"agent": "booker"}),
    (500, "user.speech.stopped", {}),
    (900, "agent.speech.started", {"reply": "b1"}),  # response: 400
    (1000, "tool.call", {"reply": "b1", "call": "c9", "name": "book_table", "arguments": {}}),
    (1200, "tool.started", {"call": "c9"}),
    (1300, "user.speech.stopped", {}),
    (1400, "session.dropped", {"reason": "crash"}),
    (3000, "session.resumed", {"agent": "backup", "epoch": 2, "from_seq": 7}),
    (3500, "tool.cancelled", {"call": "c9", "reason": "dropped", "outcome": "unknown"}),  # forgotten: no sample
    (3600, "agent.speech.started", {"reply": "b2"}),  # the stop before the drop is forgotten: no sample
    (3700, "agent.reply.started", {"reply": "b3"}),
    (3650, "agent.text", {"reply": "b3", "text": "Hello again."}),  # before its start (clock skew): skipped
    (4000, "tool.started", {"call": "c9"}),  # the resume retried it
    (4900, "tool.result", {"call": "c9", "output": {"ok": True}}),  # book_table: 900
]
EXPECTED_B = {
    "user_stopped_to_agent_speech": [400],
    "interruption_to_agent_stopped": [],
    "reply_to_first_text": [],
    "tool_duration": {"book_table": [900]},
}


def wire(session: str, timeline: list[tuple[int, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The timeline as wire-format dicts (a JSONL file's lines)."""
    return [
        {"id": f"{session}-{i}", "session": session, "type": t, "at": format_time(T0 + ms), "data": d}
        for i, (ms, t, d) in enumerate(timeline, start=1)
    ]


def events(session: str, timeline: list[tuple[int, str, dict[str, Any]]]) -> list[Event]:
    """The timeline as events, numbered as the store would."""
    return [parse_event(w).with_seq(i) for i, w in enumerate(wire(session, timeline), start=1)]
