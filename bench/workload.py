"""Realistic voice-call timelines: user turns with interim transcripts, replies streamed as text
deltas and played out with progress cursors, tool calls with results (some landing after a
barge-in), interruptions.

A timeline is a list of ``(type, data)`` pairs; the recorder benchmarks emit them through
``recorder.session(...).emit``, the read benchmarks append them with explicit times.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

Step = tuple[str, dict[str, Any]]

_WORDS = (
    "sure let me check that for you the appointment is on tuesday at three thirty would you like "
    "me to move it to wednesday instead I can also send a confirmation by text message your "
    "account number ends in four two seven and the balance is one hundred twelve dollars okay "
    "great thanks perfect no problem anything else I can help with today the order shipped "
    "yesterday and should arrive by friday afternoon please hold while I look that up"
).split()

_TOOLS = (
    ("lookup_order", lambda r: {"order_id": f"A-{r.randrange(10_000, 99_999)}", "include_items": True}),
    ("book_slot", lambda r: {"date": f"2026-12-{r.randrange(1, 28):02d}", "time": "15:30", "party": 2}),
    ("get_balance", lambda r: {"account": f"{r.randrange(1000, 9999)}"}),
    ("send_sms", lambda r: {"to": f"+1555{r.randrange(1_000_000, 9_999_999)}", "template": "confirm"}),
)


def _sentence(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def _deltas(text: str, rng: random.Random) -> list[str]:
    """Splits text into LLM-like deltas of one or two words (with their leading space)."""
    words = text.split(" ")
    out: list[str] = []
    i = 0
    while i < len(words):
        n = 1 if rng.random() < 0.7 else 2
        chunk = " ".join(words[i : i + n])
        out.append(chunk if i == 0 else " " + chunk)
        i += n
    return out


def _reply(rng: random.Random, rid: str, call_counter: list[int], *, interrupt: bool, tool: bool) -> Iterator[Step]:
    """One agent turn: optional tool round trip, then a spoken reply, possibly barged into."""
    if tool:
        # Generation 1 asks for a tool; the result lands; generation 2 speaks.
        yield "agent.reply.started", {"reply": rid + "t"}
        yield "agent.text", {"reply": rid + "t", "text": "One moment."}
        name, args = rng.choice(_TOOLS)
        call_counter[0] += 1
        cid = f"call_{call_counter[0]:06d}"
        yield "tool.call", {"call": cid, "name": name, "arguments": args(rng), "reply": rid + "t"}
        yield "agent.reply.done", {"reply": rid + "t"}
        yield "agent.speech.started", {"reply": rid + "t"}
        yield "tool.started", {"call": cid}
        if rng.random() < 0.3:
            yield "tool.progress", {"call": cid, "state": {"step": "queried"}, "message": "querying backend"}
        yield "agent.speech.ended", {"reply": rid + "t", "interrupted": False}
        yield (
            "tool.result",
            {
                "call": cid,
                "output": {"ok": True, "summary": _sentence(rng, 6, 14), "ref": f"R{rng.randrange(10**6)}"},
            },
        )
    text = _sentence(rng, 12, 40)
    deltas = _deltas(text, rng)
    yield "agent.reply.started", {"reply": rid}
    cut = rng.randrange(1, len(deltas)) if interrupt and len(deltas) > 1 else len(deltas)
    spoken = ""
    for i, d in enumerate(deltas):
        yield "agent.text", {"reply": rid, "text": d}
        if i == 2:
            yield "agent.speech.started", {"reply": rid}
        if i < cut:
            spoken += d
        if i > 2 and i % 8 == 0 and i < cut:
            yield "agent.speech.progress", {"reply": rid, "heard": spoken}
    yield "agent.reply.done", {"reply": rid}
    if len(deltas) <= 2:
        yield "agent.speech.started", {"reply": rid}
    if interrupt:
        yield "user.speech.started", {"source": "vad"}
        yield "interruption", {"reply": rid, "cause": "user_speech", "heard": spoken}
        yield "agent.speech.ended", {"reply": rid, "interrupted": True, "heard": spoken}
    else:
        yield "agent.speech.progress", {"reply": rid, "heard": text}
        yield "agent.speech.ended", {"reply": rid, "interrupted": False}


def _user_turn(rng: random.Random, *, already_speaking: bool) -> Iterator[Step]:
    if not already_speaking:
        yield "user.speech.started", {"source": "vad"}
    final = _sentence(rng, 3, 16)
    words = final.split(" ")
    for k in range(1, min(len(words), rng.randint(2, 6)) + 1):
        yield "user.transcript", {"text": " ".join(words[: k * len(words) // 6 + 1]), "final": False}
    yield "user.transcript", {"text": final, "final": True}
    yield "user.speech.stopped", {}


def call_steps(seed: int, *, agent: str = "support", tools: float = 0.25, interrupts: float = 0.15) -> Iterator[Step]:
    """An endless, deterministic call: ``session.started`` then alternating user and agent turns."""
    rng = random.Random(seed)
    yield (
        "session.started",
        {
            "agent": agent,
            "instructions": "You are a helpful phone agent for Acme. Be brief.",
            "modality": "voice",  # no tenant: the benches' stores declare none (SPEC section 6)
            "framework": "bench",
        },
    )
    turn = 0
    calls = [0]
    interrupted = False
    while True:
        turn += 1
        yield from _user_turn(rng, already_speaking=interrupted)
        interrupted = rng.random() < interrupts
        yield from _reply(rng, f"r{turn:06d}", calls, interrupt=interrupted, tool=rng.random() < tools)


def call_timeline(seed: int, n: int, **kw: Any) -> list[Step]:
    """The first ``n`` steps of :func:`call_steps` (a session may end mid-turn, like a live call)."""
    out: list[Step] = []
    for step in call_steps(seed, **kw):
        out.append(step)
        if len(out) >= n:
            break
    return out


def clean_timeline(seed: int, n: int, **kw: Any) -> list[Step]:
    """About ``n`` steps, cut at the end of a turn (a clean point), so snapshots and resume have a
    clean checkpoint near the end."""
    out: list[Step] = []
    for step in call_steps(seed, **kw):
        out.append(step)
        if len(out) >= n and step[0] == "agent.speech.ended" and not step[1].get("interrupted"):
            break
    return out
