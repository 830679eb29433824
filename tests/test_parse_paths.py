"""``parse_event`` reads the usual event in plain Python and sends the rest to the pydantic union.

The fast reader must never change what is accepted or what it becomes: on every generated wire
object, valid or not, both paths agree (the same event, or both refuse). The import's reader
(``parse_read``, which trusts the text of a line orjson has just read) is held to the same.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calltape.errors import InvalidEvent
from calltape.events import (
    _parse_common,
    _parse_union,
    check_event,
    parse_event,
    parse_read,
)

SAMPLES: list[tuple[str, dict[str, Any]]] = [
    ("session.started", {"agent": "triage", "instructions": "Be brief.", "modality": "text"}),
    ("session.started", {"agent": "triage", "tenant": "acme", "metadata": {"k": [1, 2.5, None]}}),
    ("user.transcript", {"text": "a table for two", "final": True}),
    ("user.transcript", {"text": "a table", "final": False, "turn": "t1"}),
    ("user.speech.started", {}),
    ("agent.reply.started", {"reply": "r1"}),
    ("agent.text", {"reply": "r1", "text": "One moment."}),
    ("agent.speech.progress", {"reply": "r1", "heard": "One"}),
    ("tool.call", {"reply": "r1", "call": "c1", "name": "book", "arguments": {"people": 2}}),
    ("tool.result", {"call": "c1", "output": {"ok": True}}),
    ("interruption", {"reply": "r1"}),
    ("agent.handoff", {"from": "a", "to": "b"}),
    ("x.custom", {"anything": [1, {"deep": "yes"}]}),
    ("x.custom", {}),
    ("x.custom", {"gone": None, "big": 2**63, "nul": "a\x00b"}),
    ("session.ended", {"reason": "hangup"}),
    ("session.dropped", {"reason": None}),
    ("session.resumed", {"agent": "triage", "epoch": 2, "from_seq": 0}),
    ("session.redacted", {"kinds": ["card", "email"], "spans": 3}),
    ("agent.instructions", {"text": "Be brief."}),
    ("user.speech.stopped", {}),
    ("user.text", {"text": "héllo \u2603"}),
    ("agent.reply.done", {"reply": "r1"}),
    ("agent.speech.started", {"reply": "r1"}),
    ("agent.speech.ended", {"reply": "r1", "interrupted": True, "heard": "One"}),
    ("tool.call", {"call": "c2", "name": "look", "arguments": '{"q": 1}'}),
    ("tool.call", {"call": "c3", "name": "look", "arguments": " "}),
    ("tool.started", {"call": "c1"}),
    ("tool.progress", {"call": "c1", "state": None, "message": "half way"}),
    ("tool.result", {"call": "c1", "output": [{"a": None}, 2**63 - 1, -(2**63)], "error": False}),
    ("tool.cancelled", {"call": "c1", "reason": "barge-in", "outcome": "not_run"}),
    ("tool.effect", {"call": "c1", "name": "charge", "key": "o-1", "phase": "started", "heard": True}),
    ("tool.effect", {"call": "c1", "name": "charge", "key": "o-1", "phase": "done", "output": {"id": 1}}),
]

ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from(["", "5", "r1", "2025-01-31T09:30:00.000Z", " 2025-01-31T09:30:00Z ", "2025-01-31", "nope"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["a", "text"]), st.integers(), max_size=2),
    st.sampled_from(["vad", "voice", "not_run", "started", "{}", "{bad", "a\x00b", 2**63, 2**64 - 1, [["deep"]]]),
    st.lists(st.sampled_from(["card", 1, None]), max_size=2),
)
TIMES = st.sampled_from(
    [
        "2025-01-31T09:30:00.000Z",
        "2025-01-31T09:30:00Z",
        "2025-01-31T10:30:00.123+01:00",
        "2025-01-31T09:30:00",
        "2025-01-31T09:30:00.000z",
        "0001-01-01T00:00:00.000Z",
        "9999-12-31T23:59:59.999Z",
        "2025-13-31T09:30:00Z",
    ]
)


@st.composite
def wire_objects(draw: st.DrawFn) -> dict[str, Any]:
    event_type, data = draw(st.sampled_from(SAMPLES))
    data = dict(data)
    if data and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(data)))
        action = draw(st.sampled_from(["drop", "odd"]))
        if action == "drop":
            del data[key]
        else:
            data[key] = draw(ODD)
    if draw(st.booleans()):
        data[draw(st.sampled_from(["extra", "note"]))] = draw(ODD)
    obj: dict[str, Any] = {"type": event_type, "session": "call-1", "data": data}
    for name, good in (("id", st.just("e1")), ("at", TIMES), ("agent", st.just("triage"))):
        choice = draw(st.sampled_from(["absent", "good", "odd"]))
        if choice != "absent":
            obj[name] = draw(good if choice == "good" else ODD)
    for name in ("seq", "epoch"):
        choice = draw(st.sampled_from(["absent", "good", "odd"]))
        if choice != "absent":
            obj[name] = draw(st.integers(min_value=1, max_value=2**31 - 1) if choice == "good" else ODD)
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        obj[draw(st.sampled_from(["session", "data"]))] = draw(ODD)
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        obj["unknown_field"] = 1
    return obj


def _outcome(parse: Any, obj: dict[str, Any], *, checked: bool = False) -> Any:
    """What ``parse`` makes of ``obj``; ``checked``: it must return events that passed ``check_event``
    itself (the import's reader: the store writes them without another look)."""
    try:
        event = parse(obj)
        assert event.checked or not checked
        event = check_event(event) if not checked else event
    except InvalidEvent:
        return "refused"
    return (
        event.type,
        event.data,
        event.session,
        event.id if obj.get("id") else "generated",
        event.at_ms if obj.get("at") is not None else "now",
        event.agent,
        event.epoch,
        event.seq,
    )


def _fast_or_union(obj: dict[str, Any]) -> Any:
    return _parse_common(obj, obj["type"]) or _parse_union(obj, obj["type"])


@settings(max_examples=1500, deadline=None)
@given(wire_objects())
def test_the_fast_reader_agrees_with_the_union_on_every_object(obj: dict[str, Any]) -> None:
    assert _outcome(_fast_or_union, obj) == _outcome(lambda o: _parse_union(o, o["type"]), obj)


def _line(obj: dict[str, Any]) -> bytes | None:
    """``obj`` as one JSONL line, or None when JSON cannot carry it."""
    try:
        return orjson.dumps(obj)
    except (TypeError, orjson.JSONEncodeError):
        return None


@settings(max_examples=1500, deadline=None)
@given(wire_objects())
def test_the_import_reader_agrees_with_the_union_on_every_line(obj: dict[str, Any]) -> None:
    line = _line(obj)
    if line is None:
        return
    try:
        read = orjson.loads(line)
    except orjson.JSONDecodeError:
        return  # orjson writes a lone surrogate it cannot read back: the import reports the line
    expected = _outcome(lambda o: _parse_union(o, o["type"]), read)
    assert _outcome(lambda o: parse_read(o, line), read, checked=True) == expected


@pytest.mark.parametrize(("event_type", "data"), [s for s in SAMPLES if s[0] != "x.custom" or "nul" not in s[1]])
def test_the_usual_events_take_the_fast_reader(event_type: str, data: dict[str, Any]) -> None:
    obj = {"type": event_type, "session": "s", "id": "e", "at": "2025-01-31T09:30:00.000Z", "data": data}
    assert _parse_common(obj, event_type) is not None
    assert parse_event(obj) == _parse_union(obj, event_type)
    line = orjson.dumps(obj)
    assert _parse_common(orjson.loads(line), event_type, trusted=b"\\u0000" not in line) is not None


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (b'{"session":"s","type":"user.text","data":{"text":"a\\u0000b"}}', "NUL"),
        (b'{"session":"s","type":"x.n","data":{"v":[18446744073709551615]}}', "64 bits"),
        (b'{"session":"s","type":"x.n","data":{"v":9223372036854775808}}', "64 bits"),
        (b'{"session":"s","type":"x.n","data":{"v":' + b"[" * 70 + b"]" * 70 + b"}}", "nested deeper"),
        (b'{"session":"s","type":"user.text","epoch":2147483648,"data":{"text":"x"}}', "'epoch'"),
        (b'{"session":"' + b"s" * 300 + b'","type":"user.text","data":{"text":"x"}}', "'session'"),
        (b'{"session":"s","type":"user.text","at":"2025-02-30T10:00:00.000Z","data":{"text":"x"}}', "RFC 3339"),
    ],
)
def test_the_import_reader_refuses_with_the_usual_sentence(line: bytes, fragment: str) -> None:
    with pytest.raises(InvalidEvent) as refused:
        parse_read(orjson.loads(line), line)
    with pytest.raises(InvalidEvent) as reference:
        parse_event(line)
    assert fragment in str(refused.value) and str(refused.value) == str(reference.value)


PLAIN_VALUES = st.one_of(ODD, st.text(max_size=3), st.just(True), st.just(False))


@st.composite
def plain_data(draw: st.DrawFn) -> tuple[str, Any]:
    from calltape.events import _COMPILED

    event_type = draw(st.sampled_from(sorted(_COMPILED)))
    names = [*(name for name, _ in _COMPILED[event_type].fields), "extra"]
    data = draw(st.dictionaries(st.sampled_from(names), PLAIN_VALUES, max_size=len(names)))
    return event_type, draw(st.sampled_from([data, None])) if not data else data


@settings(max_examples=1500, deadline=None)
@given(plain_data())
def test_plain_data_is_what_the_model_makes_of_it(case: tuple[str, Any]) -> None:
    # validate_data checks the usual data with the compiled schema: the same result as the model, or both refuse.
    from calltape.events import DATA_MODELS, _dump_data, validate_data

    event_type, data = case

    def by_model() -> Any:
        try:
            return _dump_data(DATA_MODELS[event_type].model_validate(data or {}))
        except ValueError:
            return "refused"

    try:
        fast: Any = validate_data(event_type, data)
    except InvalidEvent:
        fast = "refused"
    expected = by_model()
    assert fast == expected
    if isinstance(fast, dict):
        assert list(fast) == list(expected)  # the same key order: the stored JSON text is the same


def test_every_known_type_has_a_compiled_check() -> None:
    from calltape.event_schema import SCHEMA
    from calltape.events import _COMPILED

    # the hot types and the ones with an alias, a Literal, a default, a constraint or a check alike
    assert set(_COMPILED) == set(SCHEMA)
    assert all(_COMPILED[t].struct is SCHEMA[t] for t in SCHEMA)
