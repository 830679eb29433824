"""The calltape pytest plugin (entry point ``pytest11``): loads whenever calltape is installed.

Fixture ``calltape_store``: an empty event store of its own for each test, SQLite in memory, so no
server is needed and nothing is left behind (the database goes away when the test's store closes).
It is an asyncio fixture: use it from ``async def`` tests run by pytest-asyncio.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from calltape.eventstore import EventStore

_NEEDS_ASYNCIO = (
    "the calltape_store fixture is an asyncio fixture: install pytest-asyncio (pip install pytest-asyncio) "
    "and write the test as 'async def'"
)


async def _memory_store() -> AsyncIterator[EventStore]:
    from calltape.eventstore import open_store

    store = await open_store("sqlite://")
    try:
        yield store
    finally:
        await store.close()


try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - exercised only without pytest-asyncio

    @pytest.fixture
    def calltape_store() -> Any:
        """An empty in-memory calltape store for this test (needs pytest-asyncio)."""
        raise pytest.UsageError(_NEEDS_ASYNCIO)

else:

    @pytest_asyncio.fixture
    async def calltape_store() -> AsyncIterator[EventStore]:  # type: ignore[misc]
        """An empty in-memory calltape store for this test, closed (and gone) when the test ends."""
        async for store in _memory_store():
            yield store
