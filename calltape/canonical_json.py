"""Canonical JSON: the one way calltape turns a value into JSON text where the text must not depend on
who stored it.

Keys are sorted because PostgreSQL's ``jsonb`` does not keep key order: the same log must export,
render, hash and compare the same on both backends. Tool outputs and arguments become text the
same way everywhere (a string stays verbatim, anything else becomes canonical JSON), so a provider
format, an adapter's reply to its platform and the CLI show one and the same text.
"""

from __future__ import annotations

from typing import Any

import orjson


def canonical_bytes(value: Any) -> bytes:
    """``value`` as JSON with sorted keys."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def canonical_text(value: Any) -> str:
    """``value`` as JSON text with sorted keys."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def json_text(value: Any) -> str:
    """A string verbatim, anything else as canonical JSON text (tool outputs, for instance)."""
    return value if isinstance(value, str) else canonical_text(value)


def canonical_arguments(value: Any) -> bytes:
    """Tool arguments in one form whether they came as an object or as JSON text, so that
    ``{"a":1,"b":2}`` and ``'{"b": 2, "a": 1}'`` compare equal; a blank string is ``{}`` and text
    that is not JSON stays as it is."""
    if isinstance(value, (str, bytes)):
        try:
            value = orjson.loads(value) if value.strip() else {}
        except orjson.JSONDecodeError:
            return value.encode() if isinstance(value, str) else value
    return canonical_bytes(value)
