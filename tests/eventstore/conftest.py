"""Fixtures of the event-log tests: a PostgreSQL proxy a test can cut (an outage on demand)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from eventstore_support import TcpProxy
from sqlalchemy.engine import make_url


@pytest.fixture
async def proxy(pg_url: str) -> AsyncIterator[TcpProxy]:
    u = make_url(pg_url)
    p = TcpProxy(u.host or "127.0.0.1", u.port or 5432)
    await p.start()
    try:
        yield p
    finally:
        await p.kill()
