"""Parsing ``--at`` values."""

from __future__ import annotations

import pytest
from projection_timeline import T0, Tape

from calltape.errors import CalltapeError
from calltape.projections import AtOffset, AtSeq, AtTime, InvalidInstant, parse_instant, seq_for_instant


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", AtSeq(42)),
        (" 7 ", AtSeq(7)),
        (3, AtSeq(3)),
        ("+12.5", AtOffset(12.5)),
        ("+0", AtOffset(0.0)),
        ("+.5", AtOffset(0.5)),
        ("2025-01-31T09:30:00Z", AtTime(1738315800000)),
        ("2025-01-31T10:30:00.250+01:00", AtTime(1738315800250)),
    ],
)
def test_parse(text: str | int, expected: object) -> None:
    assert parse_instant(text) == expected


@pytest.mark.parametrize("text", ["0", "-3", "+", "+-1", "+nan", "+inf", "+1e3", "abc", "", "2025-13-45T00:00:00Z", 0])
def test_bad_values_raise_one_sentence(text: str | int) -> None:
    with pytest.raises(InvalidInstant) as info:
        parse_instant(text)
    assert isinstance(info.value, CalltapeError)
    message = str(info.value)
    assert message and "\n" not in message
    assert "instant" in message or "offset" in message


def test_seq_for_instant_matches_the_store_rule() -> None:
    tape = Tape()
    for i in range(5):
        tape.said(str(i))
    events = tape.events  # at T0 + seq*100
    assert seq_for_instant(events, AtSeq(3)) == 3
    assert seq_for_instant(events, AtSeq(99)) == 6
    assert seq_for_instant(events, AtTime(T0 + 350)) == 3
    assert seq_for_instant(events, AtTime(T0)) == 0
    assert seq_for_instant(events, AtOffset(0.2)) == 3
    assert seq_for_instant([], AtOffset(1)) == 0
