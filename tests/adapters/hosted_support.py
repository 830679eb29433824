"""Helpers shared by the hosted-platform adapter tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder


@pytest.fixture
async def recorder(store: EventStore) -> AsyncIterator[Recorder]:
    """A started recorder over the shared ``store`` fixture (SQLite and PostgreSQL); import it to use it."""
    rec = Recorder(store)
    await rec.start()
    yield rec
    await rec.close()


def tool_json(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-format messages with each ``tool`` content parsed: PostgreSQL's JSONB does not keep an
    object's key order, so the serialized output of a replay may order keys differently from the live one."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "tool" and isinstance(m.get("content"), str):
            try:
                m = {**m, "content": json.loads(m["content"])}
            except json.JSONDecodeError:
                pass
        out.append(m)
    return out
