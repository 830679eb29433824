"""The ``native`` rendering of the fold's items (SPEC section 2, Formats; rules 6, 7 and 9).

Each record renders to its native items on its own (:func:`item_json`), so the snapshot codec can
store settled items already rendered and :meth:`ContextFold.native` only renders what is still
live. The provider formats derive from the native context in :mod:`calltape.projections.formats`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from calltape.projections.records import IN_PROGRESS, Handoff, Item, Reply, User, call_outcome, heard_text

NativeItem = dict[str, Any]


def system_item(instructions: str) -> NativeItem:
    """Rule 1: the first item, the current agent's instructions."""
    return {"type": "message", "role": "system", "content": instructions}


def reply_items(r: Reply, out: list[NativeItem], pending: list[NativeItem] | None = None) -> None:
    """Rules 3-6 for one reply: its heard text, its included calls, then one output per call.

    A reply with no heard text and no included call renders nothing (rule 6). Calls still
    ``in_progress`` are also listed in ``pending`` when given.
    """
    calls = [c for c in r.calls if c.included]
    text = heard_text(r)
    has_text = bool(text.strip())
    if not has_text and not calls:
        return
    if has_text:
        msg: NativeItem = {"type": "message", "role": "assistant", "content": text}
        if r.interrupted:
            msg["interrupted"] = True
        out.append(msg)
    for c in calls:
        out.append({"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments})
    for c in calls:
        status, output = call_outcome(c)
        out.append({"type": "function_call_output", "call_id": c.id, "output": output, "status": status})
        if status == IN_PROGRESS and pending is not None:
            pending.append({"call_id": c.id, "name": c.name, "status": status})


def item_json(item: Item, out: list[NativeItem], pending: list[NativeItem] | None = None) -> None:
    """Appends the native items of one record to ``out`` (order: rule 9, by the caller's item order)."""
    if isinstance(item, Reply):
        reply_items(item, out, pending)
    elif isinstance(item, User):
        out.append({"type": "message", "role": "user", "content": " ".join(item.parts)})
    elif isinstance(item, Handoff):
        out.append({"type": "handoff", "from": item.from_, "to": item.to})


def items_json(items: Iterable[Item], out: list[NativeItem], pending: list[NativeItem] | None = None) -> None:
    """:func:`item_json` over several records, in order."""
    for item in items:
        item_json(item, out, pending)
