"""Canonical JSON: the one text a value has, whichever backend (jsonb reorders keys) stored it."""

from __future__ import annotations

from calltape.canonical_json import canonical_arguments, canonical_bytes, canonical_text, json_text


def test_keys_are_sorted_at_every_depth() -> None:
    assert canonical_bytes({"b": 1, "a": {"d": 2, "c": [3, {"f": 4, "e": 5}]}}) == (
        b'{"a":{"c":[3,{"e":5,"f":4}],"d":2},"b":1}'
    )
    assert canonical_text({"b": 1, "a": 2}) == '{"a":2,"b":1}'


def test_text_is_verbatim_and_other_values_become_canonical_json() -> None:
    assert json_text('{"b": 1, "a": 2}') == '{"b": 1, "a": 2}'  # a string output is the output
    assert json_text({"b": 1, "a": 2}) == '{"a":2,"b":1}'
    assert json_text(None) == "null"


def test_arguments_compare_equal_as_object_or_json_text() -> None:
    assert canonical_arguments({"a": 1, "b": 2}) == canonical_arguments('{"b": 2, "a": 1}') == b'{"a":1,"b":2}'
    assert canonical_arguments("  ") == b"{}"
    assert canonical_arguments("not json") == b"not json"
    assert canonical_arguments(b'{"b":1}') == b'{"b":1}'
