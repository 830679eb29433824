"""One validation at the boundary (issue 17, items 4, 5 and 10): the Python API, the wire parser and the
store accept exactly what both databases store, and what they accept round-trips through export.

Every store test runs on SQLite and on PostgreSQL: SQLite must refuse what PostgreSQL would refuse, so
an export from one always imports into the other.
"""

from __future__ import annotations

import json

import pytest
from eventstore_support import started

from calltape.errors import InvalidEvent
from calltape.events import (
    MAX_AT_MS,
    MAX_DATA_BYTES,
    MAX_DEPTH,
    MAX_EPOCH,
    MAX_ID_CHARS,
    MIN_AT_MS,
    Event,
    format_time,
    make_event,
    parse_event,
    parse_time,
)


def nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


# Each bad wire line, and the words its one-sentence refusal must contain. No message may quote content.
BAD_WIRE: list[tuple[dict, str]] = [
    ({"session": "s\x00", "type": "user.text", "data": {"text": "hi"}}, "NUL"),
    ({"session": "s", "type": "user.text", "data": {"text": "card\x004242"}}, "NUL"),
    ({"session": "s", "type": "x.note", "data": {"k\x00": 1}}, "NUL"),
    ({"session": "s" * (MAX_ID_CHARS + 1), "type": "user.text", "data": {"text": "hi"}}, "longer"),
    ({"session": "s", "id": "i" * (MAX_ID_CHARS + 1), "type": "user.text", "data": {"text": "hi"}}, "longer"),
    ({"session": "s", "agent": "a" * (MAX_ID_CHARS + 1), "type": "user.text", "data": {"text": "hi"}}, "longer"),
    ({"session": "s", "epoch": MAX_EPOCH + 1, "type": "user.text", "data": {"text": "hi"}}, "epoch"),
    ({"session": "s", "epoch": 2**63, "type": "user.text", "data": {"text": "hi"}}, "epoch"),
    ({"session": "s", "seq": MAX_EPOCH + 1, "type": "user.text", "data": {"text": "hi"}}, "seq"),
    ({"session": "s", "type": "x.deep", "data": {"v": nested(MAX_DEPTH + 1)}}, "nested"),
    ({"session": "s", "type": "user.text", "at": "0001-01-01T00:00:00+01:00", "data": {"text": "hi"}}, "years"),
    ({"session": "s", "type": "user.text", "at": "9999-12-31T23:59:59-01:00", "data": {"text": "hi"}}, "years"),
]


@pytest.mark.parametrize(("line", "words"), BAD_WIRE, ids=[w + str(i) for i, (_, w) in enumerate(BAD_WIRE)])
def test_parse_refuses_what_a_database_would(line: dict, words: str) -> None:
    with pytest.raises(InvalidEvent) as info:
        parse_event(json.dumps(line))
    message = str(info.value)
    assert words in message
    assert "4242" not in message and "card" not in message


def test_lone_surrogate_is_refused() -> None:
    with pytest.raises(InvalidEvent, match="surrogate"):
        make_event("s", "user.text", {"text": "\ud800"})


def test_integers_beyond_64_bits_are_refused() -> None:
    """(orjson reads such a number from JSON text as a float, which is storable.)"""
    with pytest.raises(InvalidEvent, match="64 bits"):
        make_event("s", "x.n", {"v": [2**64]})


def test_nan_is_refused() -> None:
    with pytest.raises(InvalidEvent, match="finite"):
        make_event("s", "x.n", {"v": float("nan")})


def test_data_size_limit() -> None:
    make_event("s", "x.ok", {"v": "a" * (MAX_DATA_BYTES // 2)})
    with pytest.raises(InvalidEvent, match="larger"):
        make_event("s", "x.big", {"v": "a" * (MAX_DATA_BYTES + 1)})
    with pytest.raises(InvalidEvent, match="larger"):
        make_event("s", "x.big", {"v": ["\x01" * 1000] * (MAX_DATA_BYTES // 5000)})


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"id": ""}, "empty"),
        ({"at_ms": "now"}, "'at'"),
        ({"at_ms": 1.5}, "'at'"),
        ({"epoch": 1.5}, "epoch"),
        ({"epoch": 0}, "epoch"),
        ({"at_ms": MAX_AT_MS + 1}, "years"),
    ],
)
def test_make_event_refuses_bad_python_values(kwargs: dict, words: str) -> None:
    with pytest.raises(InvalidEvent, match=words):
        make_event("s", "user.text", {"text": "hi"}, **kwargs)


def test_make_event_refuses_a_non_string_type_and_list_data() -> None:
    with pytest.raises(InvalidEvent, match="'type'"):
        make_event("s", 7, {})  # type: ignore[arg-type]
    with pytest.raises(InvalidEvent, match="'data'"):
        make_event("s", "x.note", [1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize("at_ms", [MIN_AT_MS, MAX_AT_MS, -1, 0, parse_time("0999-03-04T05:06:07.089Z")])
def test_every_accepted_time_round_trips(at_ms: int) -> None:
    text = format_time(at_ms)
    assert len(text) == 24 and text.endswith("Z")
    assert parse_time(text) == at_ms
    event = make_event("s", "user.text", {"text": "hi"}, at_ms=at_ms)
    assert parse_event(event.to_json()).at_ms == at_ms


async def test_store_refuses_a_hand_built_event(store, session_id) -> None:
    """An `Event` that skipped make_event is validated by the store itself, on both backends."""
    await store.append([started(session_id)])
    bad = [
        Event(type="no.such.type", data={}, session=session_id),
        Event(type="user.text", data=[1, 2], session=session_id),  # type: ignore[arg-type]
        Event(type="user.text", data={"text": 5}, session=session_id),
        Event(type="x.n", data={"v": "a\x00b"}, session=session_id),
        Event(type="x.n", data={"v": 1}, session=session_id, id=""),
        Event(type="x.n", data={"v": 1}, session=session_id, epoch=MAX_EPOCH + 1),
        Event(type="x.n", data={"v": nested(MAX_DEPTH + 5)}, session=session_id),
        Event(type="x.n", data={}, session=session_id, at_ms=MAX_AT_MS + 1),
    ]
    for event in bad:
        with pytest.raises(InvalidEvent):
            await store.append([event])
    assert [e.type for e in await store.read(session_id)] == ["session.started"]


async def test_store_normalizes_a_good_hand_built_event(store, session_id) -> None:
    await store.append([started(session_id)])
    (stored,) = await store.append([Event(type="user.text", data={"text": "hi"}, session=session_id)])
    assert stored.seq == 2 and stored.data == {"text": "hi"}


async def test_limits_are_storable_on_both_backends(store, session_id) -> None:
    """The largest values the boundary accepts are stored and read back unchanged."""
    sid = session_id[: MAX_ID_CHARS - 1] + "x" * (MAX_ID_CHARS - len(session_id[: MAX_ID_CHARS - 1]))
    assert len(sid) == MAX_ID_CHARS
    events = [
        make_event(sid, "session.started", {"agent": "a" * MAX_ID_CHARS}, epoch=MAX_EPOCH - 1, at_ms=MIN_AT_MS),
        make_event(
            sid,
            "x.edge",
            {"deep": nested(MAX_DEPTH - 1), "n": 2**63 - 1, "m": -(2**63)},
            id="i" * MAX_ID_CHARS,
            at_ms=MAX_AT_MS,
            epoch=MAX_EPOCH,
        ),
    ]
    # Nesting is counted from `data` itself: {"deep": nested(MAX_DEPTH - 1)} is MAX_DEPTH levels.
    await store.append(events)
    back = await store.read(sid)
    assert [(e.id, e.data, e.at_ms, e.epoch) for e in back] == [(e.id, e.data, e.at_ms, e.epoch) for e in events]
    for event in back:
        assert parse_event(event.to_json()).data == event.data
