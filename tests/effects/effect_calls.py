"""Recorded calls with effects (SPEC section 8), as wire-format dicts, for the event, check and picture tests."""

from __future__ import annotations

from typing import Any

from checks.test_check_rules import T0, tape

__all__ = ["CARD", "T0", "charged_call", "effect", "tape"]

CARD = "4242 4242 4242 4242"


def effect(call: str, phase: str, key: str = "order-7", name: str = "charge", **extra: Any) -> dict[str, Any]:
    """The data of one ``tool.effect``."""
    return {"call": call, "name": name, "key": key, "phase": phase, **extra}


def charged_call(session: str = "s") -> list[dict[str, Any]]:
    """A clean call: the agent announces the charge, the announcement plays out, the card is charged
    once (heard first); the caller asks again, and the second call is answered from the log."""
    return tape(
        (0, "session.started", {"agent": "billing"}),
        (100, "user.text", {"text": "charge my card for order 7"}),
        (200, "agent.reply.started", {"reply": "r1"}),
        (250, "agent.text", {"reply": "r1", "text": "Charging 40 dollars now."}),
        (300, "tool.call", {"reply": "r1", "call": "c1", "name": "charge_card", "arguments": {"order": 7}}),
        (350, "agent.reply.done", {"reply": "r1"}),
        (360, "tool.started", {"call": "c1"}),
        (400, "agent.speech.started", {"reply": "r1"}),
        (1400, "agent.speech.ended", {"reply": "r1", "interrupted": False}),
        (1410, "tool.effect", effect("c1", "started", heard=True)),
        (1600, "tool.effect", effect("c1", "done", output={"charge": "ch_1", "card": CARD})),
        (1610, "tool.result", {"call": "c1", "output": {"charge": "ch_1", "card": CARD}}),
        (2000, "session.ended", {}),
        session=session,
    )
