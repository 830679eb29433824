"""The plan's cheap copies: a session summary copied field by field, an event built positionally (both
once per session or event of every batch). These pin that nothing is lost when a field is added."""

from __future__ import annotations

import gc
from dataclasses import fields

import msgspec

from calltape.events import Event, make_event
from calltape.eventstore.append_plan import SessionInfo, plan_append


def test_session_info_copy_keeps_every_field() -> None:
    values = {
        f.name: (f"v-{f.name}" if f.type in ("str", "str | None") else 7 if "int" in str(f.type) else True)
        for f in fields(SessionInfo)
    }
    info = SessionInfo(**values)
    copy = info.copy()
    assert copy == info and copy is not info
    copy.last_seq += 1
    assert info.last_seq == 7


def test_event_fields_are_in_the_order_the_positional_builders_use() -> None:
    # append_plan._admit and the stores' reads build events positionally in this order
    assert list(Event.__struct_fields__) == [
        "type", "data", "session", "id", "at_ms", "agent", "epoch", "seq", "checked", "redacted",
    ]  # fmt: skip


def test_events_are_left_out_of_the_cyclic_gc_but_their_data_is_not() -> None:
    # a busy recorder's events in flight were most of what each collection walked (issue 32)
    event = make_event("s", "tool.call", {"call": "c1", "name": "book", "arguments": {"day": "thu"}})
    assert not gc.is_tracked(event)
    assert gc.is_tracked(event.data)  # a cycle through the data is still found
    assert not gc.is_tracked(msgspec.structs.replace(event, seq=3))


def test_events_are_equal_whatever_their_marks() -> None:
    event = make_event("s", "user.text", {"text": "hi"}, at_ms=1234, epoch=1)
    assert event == msgspec.structs.replace(event, checked=False, redacted=True)
    assert event != msgspec.structs.replace(event, seq=1)
    assert event != msgspec.structs.replace(event, data={"text": "ho"})
    assert (event == "not an event") is False


def test_planned_event_is_the_input_with_its_seq_and_agent() -> None:
    event = make_event("s", "user.text", {"text": "hi"}, at_ms=1234, epoch=1)
    row = SessionInfo("s", agent="triage", last_seq=4, started=True)
    (planned,) = plan_append([event], {"s": row}, {}).results
    assert (planned.type, planned.data, planned.session, planned.id, planned.at_ms) == (
        "user.text", {"text": "hi"}, "s", event.id, 1234,
    )  # fmt: skip
    assert (planned.agent, planned.epoch, planned.seq, planned.checked) == ("triage", 1, 5, True)
    assert event.seq is None and row.last_seq == 4  # the inputs are left as they were
