"""``make_event`` builds the usual event through a per-type check generated from the schema, with
the envelope tested inline; everything else goes to ``_make_event``, the general path.

The fast path must never change what is accepted, what it becomes or what a refusal says: on
generated data and envelopes, valid or not, both agree (the same event, key order included, or the
same sentence). And the realistic call mix must actually take it.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.workload import call_timeline
from calltape.errors import InvalidEvent
from calltape.event_schema import SCHEMA
from calltape.events import (
    _COMPILED,
    _FAST,
    MAX_DATA_BYTES,
    Event,
    _make_event,
    _schema_data,
    make_event,
    parse_event,
)


class Tag(str):
    """A str subclass: never an exact JSON string, so the fast path must leave it alone."""


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=2**40),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.text(max_size=4),
    st.sampled_from(["vad", "api", "voice", "text", "not_run", "started", "done", "{}", '{"a": 1}', " ", "{bad"]),
    st.sampled_from(["a\x00b", "\ud800", "h\xe9llo \u2603", Tag("vad"), b"bytes", ("t",), 1.5]),
    st.lists(st.sampled_from(["card", 1, None, "\x00", float("nan")]), max_size=2),
    st.dictionaries(st.sampled_from(["a", "text", "\x00k"]), st.sampled_from([1, "x", None, [["deep"]]]), max_size=2),
    st.sampled_from([{1: "not a str key"}, {"k": float("inf")}, {"k": object()}]),
)


@st.composite
def typed_data(draw: st.DrawFn) -> tuple[str, Any]:
    event_type = draw(st.sampled_from(sorted(SCHEMA)))
    names = [*(name for name, _ in _COMPILED[event_type].fields), "extra"]
    data = draw(st.dictionaries(st.sampled_from(names), VALUES, max_size=len(names)))
    if draw(st.booleans()):  # declared order, the common shape
        order = [name for name in names if name in data]
        data = {name: data[name] for name in order}
    return event_type, draw(st.sampled_from([data, None])) if not data else data


def _outcome(build: Any) -> Any:
    try:
        event = build()
    except InvalidEvent as exc:
        return ("refused", str(exc))
    assert isinstance(event, Event) and event.checked
    return (event.type, event.data, list(event.data), event.session, event.agent, event.epoch, event.seq)


@settings(max_examples=3000, deadline=None)
@given(typed_data())
def test_the_generated_check_is_the_schema_check(case: tuple[str, Any]) -> None:
    event_type, data = case
    fast = _FAST.get(event_type)
    if fast is None or data is None:
        return
    try:
        reference = _schema_data(_COMPILED[event_type], data)
    except Exception:  # the general path may raise for what it cannot judge; the fast one must defer
        reference = None
    got = fast(data)
    if got is not None:  # the fast check decides only what the schema check accepts, and identically
        assert got == reference and list(got) == list(reference)
        assert got is not data


SESSIONS = st.sampled_from(["s", "call-42", "", "s" * 256, "s" * 257, "a\x00b", "\ud800", "h\xe9", 5, None, Tag("s")])
AGENTS = st.sampled_from([None, "support", "", "a" * 256, "a" * 257, "a\x00", "\ud800", "\xe9", 3, Tag("a")])
EPOCHS = st.sampled_from([None, 1, 7, 2**31 - 1, 2**31, 0, -1, True, "1", 1.0])
TIMES = st.sampled_from([None, 0, 1_700_000_000_000, -62_135_596_800_000, -62_135_596_800_001, 2**60, 1.5, "x"])
IDS = st.sampled_from([None, "e1", "", "i" * 256, "i" * 257, "e\x00", "\ud800", "\xe9", 7, Tag("e")])
TYPES = st.one_of(st.sampled_from(sorted(SCHEMA)), st.sampled_from(["x.custom", "user.transcrpt", 5, Tag("user.text")]))


@settings(max_examples=3000, deadline=None)
@given(typed_data(), TYPES, SESSIONS, AGENTS, EPOCHS, TIMES, IDS, st.booleans())
def test_make_event_agrees_with_the_general_path(
    case: tuple[str, Any], other_type: Any, session: Any, agent: Any, epoch: Any, at_ms: Any, id: Any, swap: bool
) -> None:
    event_type, data = case
    if swap:  # data of one type under another (or an odd type): the fast path must refuse the same way
        event_type = other_type
    kw = {"id": id, "at_ms": at_ms, "agent": agent, "epoch": epoch}
    fast = _outcome(lambda: make_event(session, event_type, data, **kw))
    general = _outcome(lambda: _make_event(session, event_type, data, id, at_ms, agent, epoch))
    assert fast == general


def test_sizes_near_the_limit_are_decided_as_before() -> None:
    near = MAX_DATA_BYTES // 6
    cases = [
        ("agent.text", {"reply": "r", "text": "x" * (MAX_DATA_BYTES - 40)}),
        ("agent.text", {"reply": "r", "text": "x" * (MAX_DATA_BYTES + 1)}),
        ("agent.text", {"reply": "r", "text": '"' * near}),
        ("agent.text", {"reply": "r", "text": '"' * (MAX_DATA_BYTES // 2)}),
        ("tool.result", {"call": "c", "output": ["\n" * near]}),
        ("tool.result", {"call": "c", "output": ["\n" * (MAX_DATA_BYTES // 2)]}),
    ]
    for event_type, data in cases:
        fast = _outcome(lambda t=event_type, d=data: make_event("s", t, d))
        assert fast == _outcome(lambda t=event_type, d=data: _make_event("s", t, d, None, None, None, None))
    with pytest.raises(InvalidEvent, match="larger than"):
        make_event("s", "agent.text", {"reply": "r", "text": '"' * (MAX_DATA_BYTES // 2)})


def test_the_realistic_mix_takes_the_fast_path() -> None:
    steps = call_timeline(7, 3000)
    assert {t for t, _ in steps} <= set(_FAST)
    for event_type, data in steps:
        assert _FAST[event_type](data) is not None, event_type
        made = make_event("call-7", event_type, data, agent="support", epoch=1)
        assert made.data == data and made.data is not data
    # every type the generator handles; session.redacted (a list of strings) keeps the general path
    assert set(SCHEMA) - set(_FAST) == {"session.redacted"}


def test_the_made_data_is_a_copy() -> None:
    data = {"reply": "r1", "text": "hi"}
    event = make_event("s", "agent.text", data)
    data["text"] = "changed"
    assert event.data == {"reply": "r1", "text": "hi"}
    assert make_event("s", "user.speech.stopped").data == {}
    assert make_event("s", "session.started", {"agent": "a"}).data == {"agent": "a", "modality": "voice"}


def test_a_lone_surrogate_in_a_field_of_another_type_is_refused_in_one_sentence() -> None:
    # msgspec raised UnicodeEncodeError building its error for this; now the models decide it
    data = {"reply": "r1", "interrupted": "\ud800"}
    with pytest.raises(InvalidEvent, match="'interrupted'"):
        make_event("s", "agent.speech.ended", data)
    with pytest.raises(InvalidEvent, match=r"'data\.interrupted'"):
        parse_event({"session": "s", "type": "agent.speech.ended", "data": data})
