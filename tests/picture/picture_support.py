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


def long_call(target: int = 50_000, session: str = "call-hour") -> list[Event]:
    """An hour-long call of about ``target`` events: turn after turn with tool calls, a barge-in every
    tenth turn (every twentieth one talks over the user for 900 ms: a ``talk-over`` finding), and a
    drop with its resume in the middle."""
    per_turn = 13  # on average
    turns = target // per_turn
    step = 3_600_000 // turns
    rows: list[tuple[int, str, dict[str, Any]]] = [(0, "session.started", {"agent": "concierge"})]
    dropped_at = turns // 2
    for n in range(turns):
        t = 1000 + n * step
        r, c = f"r{n}", f"c{n}"
        rows += [
            (t, "user.speech.started", {"source": "vad"}),
            (t + 80, "user.transcript", {"text": f"turn {n} please", "final": False}),
            (t + 200, "user.transcript", {"text": f"turn {n} please, table {n % 12}", "final": True}),
            (t + 240, "user.speech.stopped", {}),
            (t + 300, "agent.reply.started", {"reply": r}),
            (t + 340, "agent.text", {"reply": r, "text": f"Answer {n}, "}),
            (t + 360, "agent.text", {"reply": r, "text": "checking the book "}),
        ]
        if n % 3 == 0:
            rows += [
                (t + 370, "tool.call", {"reply": r, "call": c, "name": "lookup", "arguments": {"turn": n}}),
                (t + 380, "tool.started", {"call": c}),
                (t + 600, "tool.result", {"call": c, "output": {"ok": n}}),
            ]
        else:
            rows.append((t + 380, "agent.text", {"reply": r, "text": "now."}))
        rows += [
            (t + 400, "agent.reply.done", {"reply": r}),
            (t + 420, "agent.speech.started", {"reply": r}),
            (t + 500, "agent.speech.progress", {"reply": r, "heard": f"Answer {n},"}),
        ]
        if n % 10 == 5:
            late = 900 if n % 20 == 5 else 100
            rows += [
                (t + 560, "user.speech.started", {"source": "vad"}),
                (t + 600, "interruption", {"reply": r, "cause": "user_speech", "heard": f"Answer {n},"}),
                (t + 600 + late, "agent.speech.ended", {"reply": r, "interrupted": True, "heard": f"Answer {n},"}),
                (t + 620 + late, "user.speech.stopped", {}),
            ]
        else:
            rows.append((t + 700, "agent.speech.ended", {"reply": r, "interrupted": False}))
        if n == dropped_at:
            rows += [
                (t + step - 300, "session.dropped", {"reason": "network"}),
                (t + step - 100, "session.resumed", {"agent": "concierge-2", "epoch": 2, "from_seq": len(rows)}),
            ]
    rows.append((1000 + turns * step, "session.ended", {"reason": "done"}))
    return [parse_event(w).with_seq(n) for n, w in enumerate(wire_events(rows, session=session), 1)]
