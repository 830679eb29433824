"""A call with everything the picture draws: VAD, interims, a barge-in with a late result and late
tokens, a reply cut before it was heard, a call excluded from the context, a handoff, an effect cut by the drop
(settled unknown), a drop, a resume."""

from __future__ import annotations

from typing import Any

from calltape.events import Event, parse_event

SESSION = "call-picture"
T0 = 1_738_315_800_000  # 2025-01-31T09:30:00Z

HOSTILE = 'book it </script><script>window.__pwned = 1</script> <img src=x onerror="window.__pwned = 2">'
"""A transcript that would run script if the page did not escape it."""

SCRIPT: list[tuple[int, str, dict[str, Any]]] = [
    (0, "session.started", {"agent": "concierge", "framework": "test"}),
    (100, "user.speech.started", {"source": "vad"}),
    (400, "user.transcript", {"text": "a table", "final": False}),
    (900, "user.transcript", {"text": "a table for two please", "final": True}),
    (1000, "user.speech.stopped", {}),
    (1200, "agent.reply.started", {"reply": "r1"}),
    (1300, "agent.text", {"reply": "r1", "text": "Sure, booking a table for two at eight."}),
    (1300, "tool.call", {"reply": "r1", "call": "c1", "name": "book_table", "arguments": {"people": 2}}),
    (1350, "agent.reply.done", {"reply": "r1"}),
    (1400, "tool.started", {"call": "c1"}),
    (1500, "agent.speech.started", {"reply": "r1"}),
    (2000, "user.speech.started", {"source": "vad"}),
    (2100, "interruption", {"reply": "r1", "cause": "user_speech", "heard": "Sure, booking a table"}),
    (2150, "agent.text", {"reply": "r1", "text": " late"}),
    (2600, "user.transcript", {"text": HOSTILE, "final": True}),
    (2700, "user.speech.stopped", {}),
    (3400, "tool.result", {"call": "c1", "output": {"reference": "BK-1"}}),
    (3500, "agent.reply.started", {"reply": "r2"}),
    (3550, "agent.text", {"reply": "r2", "text": "Let me check the menu."}),
    (3560, "tool.call", {"reply": "r2", "call": "c2", "name": "menu", "arguments": {}}),
    (3600, "interruption", {"reply": "r2", "cause": "api"}),
    (3650, "tool.call", {"reply": "r2", "call": "c3", "name": "wine_list", "arguments": {}}),
    (3700, "interruption", {"cause": "api"}),
    (4000, "agent.handoff", {"from": "concierge", "to": "sommelier", "reason": "wine"}),
    (4200, "agent.reply.started", {"reply": "r3"}),
    (4300, "agent.text", {"reply": "r3", "text": "Hello from the sommelier."}),
    (4300, "tool.call", {"reply": "r3", "call": "c4", "name": "pairing", "arguments": {"dish": "fish"}}),
    (4350, "agent.reply.done", {"reply": "r3"}),
    (4400, "tool.started", {"call": "c4"}),
    (4450, "tool.effect", {"call": "c4", "name": "reserve", "key": "fish-pairing", "phase": "started"}),
    (4500, "agent.speech.started", {"reply": "r3"}),
    (4900, "agent.speech.ended", {"reply": "r3", "interrupted": False}),
    (5000, "session.dropped", {"reason": "network"}),
    (5200, "tool.cancelled", {"call": "c4", "reason": "dropped", "outcome": "unknown"}),
    (5250, "tool.effect", {"call": "c4", "name": "reserve", "key": "fish-pairing", "phase": "unknown"}),
    (5300, "session.resumed", {"agent": "sommelier-2", "epoch": 2, "from_seq": 31}),
    (5600, "user.text", {"text": "thanks"}),
    (6000, "session.ended", {"reason": "done"}),
]


def wire_events(script: list[tuple[int, str, dict[str, Any]]] = SCRIPT, session: str = SESSION) -> list[dict[str, Any]]:
    """The script as wire-format dicts (a JSONL file's lines); the resume raises the epoch."""
    out = []
    epoch = 1
    for at, kind, data in script:
        if kind == "session.resumed":
            epoch = 2
        out.append(
            {
                "id": f"e{len(out) + 1}",
                "session": session,
                "type": kind,
                "at": _rfc3339(T0 + at),
                "epoch": epoch,
                "data": data,
            }
        )
    return out


def events() -> list[Event]:
    """The script as stored events (seq 1, 2, …)."""
    return [parse_event(w).with_seq(n) for n, w in enumerate(wire_events(), 1)]


def _rfc3339(at_ms: int) -> str:
    from calltape.events import format_time

    return format_time(at_ms)
