"""A tiny timeline builder: validated events with incrementing seq, ids and times."""

from __future__ import annotations

from typing import Any

from calltape.events import EVENT_TYPES, Event, validate_data
from calltape.projections import ContextFold, fold_events

T0 = 1_750_000_000_000


class Tape:
    def __init__(
        self,
        session: str = "s1",
        *,
        agent: str = "alice",
        instructions: str | None = "Be brief.",
        modality: str = "voice",
        start: bool = True,
    ) -> None:
        self.session = session
        self.events: list[Event] = []
        if start:
            data: dict[str, Any] = {"agent": agent, "modality": modality}
            if instructions is not None:
                data["instructions"] = instructions
            self.add("session.started", **data)

    def add(self, type: str, **data: Any) -> Event:
        seq = len(self.events) + 1
        payload = validate_data(type, data) if type in EVENT_TYPES else data
        event = Event(type=type, data=payload, session=self.session, id=f"e{seq}", at_ms=T0 + seq * 100, seq=seq)
        self.events.append(event)
        return event

    # shortcuts -------------------------------------------------------------------------------
    def said(self, text: str) -> Event:
        return self.add("user.transcript", text=text, final=True)

    def interim(self, text: str) -> Event:
        return self.add("user.transcript", text=text, final=False)

    def typed(self, text: str) -> Event:
        return self.add("user.text", text=text)

    def reply(self, rid: str, *texts: str, done: bool = True, spoken: bool = False) -> None:
        self.add("agent.reply.started", reply=rid)
        for t in texts:
            self.add("agent.text", reply=rid, text=t)
        if done:
            self.add("agent.reply.done", reply=rid)
        if spoken:
            self.add("agent.speech.started", reply=rid)
            self.add("agent.speech.ended", reply=rid, interrupted=False)

    def call(self, cid: str, name: str = "lookup", arguments: Any = None, reply: str | None = None) -> Event:
        data: dict[str, Any] = {"call": cid, "name": name, "arguments": {} if arguments is None else arguments}
        if reply is not None:
            data["reply"] = reply
        return self.add("tool.call", **data)

    def result(self, cid: str, output: Any, error: bool = False) -> Event:
        return self.add("tool.result", call=cid, output=output, error=error)

    def fold(self, upto: int | None = None) -> ContextFold:
        return fold_events(self.events if upto is None else self.events[:upto])

    def native(self, upto: int | None = None) -> dict[str, Any]:
        return self.fold(upto).native()

    def items(self, upto: int | None = None) -> list[tuple[Any, ...]]:
        return compact(self.native(upto))


def compact(native: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Items as short tuples, system message left out, for readable assertions."""
    out: list[tuple[Any, ...]] = []
    for item in native["items"]:
        kind = item["type"]
        if kind == "message":
            if item["role"] == "system":
                continue
            row: tuple[Any, ...] = (item["role"], item["content"])
            if item.get("interrupted"):
                row += ("interrupted",)
            out.append(row)
        elif kind == "function_call":
            out.append(("call", item["call_id"]))
        elif kind == "function_call_output":
            out.append(("out", item["call_id"], item["status"], item["output"]))
        else:
            out.append(("handoff", item["from"], item["to"]))
    return out
