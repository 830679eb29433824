"""The event wire format (SPEC section 1): validation, normalization, errors a person can read."""

from __future__ import annotations

import orjson
import pytest

from calltape.errors import InvalidEvent
from calltape.events import (
    DATA_MODELS,
    EVENT_TYPES,
    Event,
    dumps_jsonl,
    format_time,
    load_stored,
    make_event,
    parse_event,
    parse_time,
    validate_data,
)

# One valid `data` per type: the minimal form, and what it normalizes to.
MINIMAL: dict[str, tuple[dict, dict]] = {
    "session.started": ({"agent": "triage"}, {"agent": "triage", "modality": "voice"}),
    "session.ended": ({}, {}),
    "session.dropped": ({"reason": "ws closed"}, {"reason": "ws closed"}),
    "session.resumed": ({"agent": "b", "epoch": 2, "from_seq": 7}, {"agent": "b", "epoch": 2, "from_seq": 7}),
    "session.redacted": ({"kinds": ["card"], "spans": 2}, {"kinds": ["card"], "spans": 2}),
    "agent.handoff": ({"from": "a", "to": "b"}, {"from": "a", "to": "b"}),
    "agent.instructions": ({"text": "be brief"}, {"text": "be brief"}),
    "user.speech.started": ({}, {}),
    "user.speech.stopped": ({}, {}),
    "user.transcript": ({"text": "hel", "final": False}, {"text": "hel", "final": False}),
    "user.text": ({"text": "hello"}, {"text": "hello"}),
    "agent.reply.started": ({"reply": "r1"}, {"reply": "r1"}),
    "agent.text": ({"reply": "r1", "text": "Hi"}, {"reply": "r1", "text": "Hi"}),
    "agent.reply.done": ({"reply": "r1"}, {"reply": "r1"}),
    "agent.speech.started": ({"reply": "r1"}, {"reply": "r1"}),
    "agent.speech.progress": ({"reply": "r1", "heard": "H"}, {"reply": "r1", "heard": "H"}),
    "agent.speech.ended": ({"reply": "r1", "interrupted": True}, {"reply": "r1", "interrupted": True}),
    "interruption": ({}, {}),
    "tool.call": (
        {"call": "c1", "name": "lookup", "arguments": '{"id": 3}'},
        {"call": "c1", "name": "lookup", "arguments": '{"id": 3}'},
    ),
    "tool.started": ({"call": "c1"}, {"call": "c1"}),
    "tool.progress": ({"call": "c1", "state": {"page": 2}}, {"call": "c1", "state": {"page": 2}}),
    "tool.result": ({"call": "c1", "output": [1, "a", None]}, {"call": "c1", "output": [1, "a", None]}),
    "tool.cancelled": ({"call": "c1", "reason": "timeout"}, {"call": "c1", "reason": "timeout"}),
    "tool.effect": (
        {"call": "c1", "name": "charge", "key": "order-7", "phase": "done", "output": {"id": "ch_1"}, "heard": None},
        {"call": "c1", "name": "charge", "key": "order-7", "phase": "done", "output": {"id": "ch_1"}},
    ),
}


def wire(event_type: str, data: object, **extra: object) -> dict:
    return {"session": "s1", "type": event_type, "data": data, **extra}


def test_every_spec_type_has_a_case():
    assert set(MINIMAL) == EVENT_TYPES == set(DATA_MODELS)
    assert len(EVENT_TYPES) == 24  # section 1's 22, section 6's session.redacted, section 8's tool.effect


@pytest.mark.parametrize("event_type", sorted(MINIMAL))
def test_every_type_validates_and_normalizes(event_type):
    given, normalized = MINIMAL[event_type]
    event = parse_event(wire(event_type, given, at="2025-03-01T10:00:00.250Z"))
    assert event.type == event_type
    assert event.data == normalized
    assert event.session == "s1"
    assert event.at_ms == parse_time("2025-03-01T10:00:00.250Z")
    assert validate_data(event_type, given) == normalized
    assert make_event("s1", event_type, given).data == normalized


@pytest.mark.parametrize("event_type", sorted(MINIMAL))
def test_wire_roundtrip(event_type):
    given, _ = MINIMAL[event_type]
    original = make_event("s1", event_type, given, agent="triage", epoch=2, at_ms=1_741_000_000_123)
    stored = original.with_seq(4)
    back = parse_event(stored.to_json())
    assert back == stored
    assert orjson.loads(stored.to_json())["at"] == "2025-03-03T11:06:40.123Z"


def test_optional_fields_are_kept_and_defaults_applied():
    e = parse_event(
        wire(
            "session.started",
            {
                "agent": "a",
                "instructions": "x",
                "modality": "text",
                "tenant": "acme",
                "framework": "pipecat",
                "metadata": {"k": 1},
                "custom": "kept",
            },
        )
    )
    assert e.data == {
        "agent": "a",
        "instructions": "x",
        "modality": "text",
        "tenant": "acme",
        "framework": "pipecat",
        "metadata": {"k": 1},
        "custom": "kept",
    }
    assert parse_event(wire("tool.call", {"call": "c", "name": "n", "arguments": {"a": [1]}})).data["arguments"] == {
        "a": [1]
    }
    ended = parse_event(wire("agent.speech.ended", {"reply": "r", "interrupted": False, "heard": "He"}))
    assert ended.data == {"reply": "r", "interrupted": False, "heard": "He"}


def test_handoff_from_keeps_its_wire_name():
    e = make_event("s", "agent.handoff", {"from": "a", "to": "b", "reason": "billing"})
    assert e.data == {"from": "a", "to": "b", "reason": "billing"}
    assert "from_" not in orjson.loads(e.to_json())["data"]


def test_generated_id_and_time():
    a = parse_event(wire("user.text", {"text": "x"}))
    b = parse_event(wire("user.text", {"text": "x"}))
    assert a.id and b.id and a.id != b.id
    assert abs(a.at_ms - Event("t", {}, "s").at_ms) < 5_000
    assert parse_event(wire("user.text", {"text": "x"}, id="given")).id == "given"


def test_seq_on_import_is_information_only():
    assert parse_event(wire("user.text", {"text": "x"}, seq=9)).seq == 9


@pytest.mark.parametrize(
    ("at", "ms"),
    [
        ("2025-01-01T00:00:00Z", 1_735_689_600_000),
        ("2025-01-01T00:00:00.5Z", 1_735_689_600_500),
        ("2025-01-01T02:00:00.007+02:00", 1_735_689_600_007),
        ("2025-01-01T00:00:00.123456Z", 1_735_689_600_123),  # truncated to ms
        ("2025-01-01T00:00:00", 1_735_689_600_000),  # naive: UTC
    ],
)
def test_times(at, ms):
    assert parse_event(wire("user.text", {"text": "x"}, at=at)).at_ms == ms
    assert parse_time(at) == ms


def test_format_time_is_rfc3339_ms():
    assert format_time(1_735_689_600_007) == "2025-01-01T00:00:00.007Z"
    assert format_time(0) == "1970-01-01T00:00:00.000Z"
    assert parse_time(format_time(1_700_000_000_999)) == 1_700_000_000_999


def test_extensions_are_accepted_as_is():
    e = parse_event(wire("x.acme.sentiment", {"score": 0.4, "nested": {"a": [1]}}))
    assert e.type == "x.acme.sentiment"
    assert e.data == {"score": 0.4, "nested": {"a": [1]}}
    assert parse_event({"session": "s", "type": "x.bare"}).data == {}
    assert make_event("s", "x.y", {"any": "thing"}).data == {"any": "thing"}


def one_sentence(message: str) -> None:
    assert message and "\n" not in message
    assert "Traceback" not in message and "pydantic" not in message.lower() and "errors.pydantic.dev" not in message


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (wire("user.shout", {}), "unknown event type 'user.shout' (use 'x.<name>' for extensions)"),
        (wire("x.", {}), "unknown event type 'x.'"),
        ({"session": "s", "data": {}}, "'type' is missing"),
        ({"session": "s", "type": 7, "data": {}}, "'type' must be a string"),
        ({"type": "user.text", "data": {"text": "x"}}, "user.text: 'session' is missing"),
        (wire("session.started", {}), "session.started: 'data.agent' is missing"),
        (wire("agent.handoff", {"to": "b"}), "agent.handoff: 'data.from' is missing"),
        (
            wire("tool.call", {"call": "c", "name": "n", "arguments": "{not json"}),
            "tool.call: 'data.arguments': arguments is a string that is not valid JSON",
        ),
        (
            wire("tool.call", {"call": "c", "name": "n", "arguments": 5}),
            "tool.call: 'data.arguments': arguments must be an object or a JSON string",
        ),
        (wire("user.text", {"text": "x"}, at="yesterday"), "user.text: 'at': 'yesterday' is not an RFC 3339 time"),
        (wire("user.transcript", {"text": "x", "final": "maybe"}), "user.transcript: 'data.final'"),
        (
            wire("session.started", {"agent": "a", "modality": "video"}),
            "session.started: 'data.modality': input should be 'voice' or 'text'",
        ),
        (wire("user.text", {"text": "x"}, colour="red"), "user.text: 'colour' is not a field of an event"),
        (wire("user.text", {"text": "x"}, epoch=0), "user.text: 'epoch'"),
        (wire("x.foo", [1]), "x.foo: 'data': input should be a valid dictionary"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "an event must be a JSON object"),
    ],
)
def test_errors_are_one_clear_sentence(obj, expected):
    with pytest.raises(InvalidEvent) as info:
        parse_event(obj)
    message = str(info.value)
    assert message.startswith(expected), message
    one_sentence(message)


@pytest.mark.parametrize(
    ("event_type", "data", "expected"),
    [
        ("user.text", {}, "user.text: data 'text' is missing"),
        ("nope", {}, "unknown event type 'nope'"),
        ("tool.call", {"call": "c", "name": "n", "arguments": "{"}, "tool.call: data 'arguments': arguments is a"),
        ("tool.cancelled", {"call": "c", "reason": "x", "outcome": "maybe"}, "tool.cancelled: data 'outcome'"),
        ("tool.effect", {"call": "c", "name": "n", "key": "k", "phase": "maybe"}, "tool.effect: data 'phase'"),
        ("tool.effect", {"call": "c", "name": "n", "phase": "started"}, "tool.effect: data 'key' is missing"),
        (
            "tool.effect",
            {"call": "c", "name": "n", "key": "k", "phase": "started", "heard": "maybe"},
            "tool.effect: data 'heard'",
        ),
    ],
)
def test_make_event_errors(event_type, data, expected):
    with pytest.raises(InvalidEvent) as info:
        make_event("s", event_type, data)
    assert str(info.value).startswith(expected), str(info.value)
    one_sentence(str(info.value))


def _nested(levels: int) -> object:
    value: object = "SECRET-leaf"
    for _ in range(levels):
        value = [value]
    return value


class _Opaque:
    def __repr__(self) -> str:
        return "SECRET-repr"


_NOT_JSON = {
    "bytes": (b"SECRET-bytes", "'data' holds a bytes, which is not a JSON value"),
    "bytes not utf-8": (b"\xffSECRET", "'data' holds a bytes, which is not a JSON value"),
    "object": (object(), "'data' holds an object, which is not a JSON value"),
    "own class": (_Opaque(), "'data' holds an _Opaque, which is not a JSON value"),
    "nested 65": (_nested(65), "'data' is nested deeper than 64 levels"),
    "nested 300": (_nested(300), "'data' is nested deeper than 64 levels"),
    "nested 3000": (_nested(3000), "'data' is nested deeper than 64 levels"),
    "nan": (float("nan"), "a number in 'data' is not finite"),
    "infinity": ({"SECRET-key": [float("inf")]}, "a number in 'data' is not finite"),
    "-infinity": (-float("inf"), "a number in 'data' is not finite"),
}


@pytest.mark.parametrize("value", _NOT_JSON.values(), ids=_NOT_JSON.keys())
@pytest.mark.parametrize(
    ("event_type", "place"),
    [
        ("tool.result", lambda v: {"call": "c", "output": v}),
        ("tool.call", lambda v: {"call": "c", "name": "n", "arguments": {"a": v}}),
        ("tool.progress", lambda v: {"call": "c", "state": {"s": v}}),
        ("session.started", lambda v: {"agent": "a", "metadata": {"m": v}}),
        ("x.acme", lambda v: {"v": v}),
    ],
    ids=["tool.result", "tool.call", "tool.progress", "session.started", "extension"],
)
def test_make_event_refuses_what_is_not_json_in_one_sentence(event_type, place, value):
    """Issue 26 item 14: typed events refuse what an extension refuses (raw pydantic, Unicode and
    recursion errors before; NaN and infinity silently stored as null), always an InvalidEvent whose
    one sentence never quotes the value."""
    bad, sentence = value
    with pytest.raises(InvalidEvent) as info:
        make_event("s", event_type, place(bad))
    message = str(info.value)
    assert message == sentence
    one_sentence(message)
    assert "SECRET" not in message


def test_typed_fields_refuse_bytes_where_a_string_is_due():
    with pytest.raises(InvalidEvent, match="'data' holds a bytes"):
        make_event("s", "user.text", {"text": b"hello"})


def test_python_values_the_dump_turns_into_json_are_still_kept():
    """A tool may return a date or a model: the typed dump writes them as JSON, as before."""
    import datetime

    event = make_event("s", "tool.result", {"call": "c", "output": {"on": datetime.date(2025, 1, 31), "n": (1, 2)}})
    assert event.data["output"] == {"on": "2025-01-31", "n": [1, 2]}


def test_deep_typed_data_on_the_wire_is_the_depth_sentence():
    line = '{"type":"tool.result","session":"s","data":{"call":"c","output":' + "[" * 1000 + "]" * 1000 + "}}"
    with pytest.raises(InvalidEvent) as info:
        parse_event(line)
    assert str(info.value) == "'data' is nested deeper than 64 levels"


def test_make_event_needs_a_session():
    with pytest.raises(InvalidEvent, match="session"):
        make_event("", "user.text", {"text": "x"})


def test_invalid_event_is_a_value_error():
    with pytest.raises(ValueError):
        parse_event(wire("nope", {}))


def test_unknown_stored_type_loads_without_validation():
    """A row written by a newer calltape comes back as a plain Event (projections skip it)."""
    e = load_stored(
        session="s", seq=3, id="i", type="agent.emotion", at_ms=5, agent=None, epoch=None, data='{"mood": "calm"}'
    )
    assert (e.type, e.data, e.seq) == ("agent.emotion", {"mood": "calm"}, 3)


def test_dumps_jsonl_one_line_per_event():
    events = [make_event("s", "user.text", {"text": "a\nb"}), make_event("s", "x.k", {})]
    lines = dumps_jsonl(events).splitlines()
    assert len(lines) == 2
    assert [parse_event(line) for line in lines] == events
