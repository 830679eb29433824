"""Fixtures of the event-log tests: a PostgreSQL proxy a test can cut (an outage on demand), and an empty
PostgreSQL database (no calltape schema) for migration tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest
from eventstore_support import TcpProxy, raw_pg
from sqlalchemy.engine import make_url

from calltape.eventstore import EventStore, open_store
from calltape.eventstore.tenancy import ALL_TENANTS


@pytest.fixture
async def proxy(pg_url: str) -> AsyncIterator[TcpProxy]:
    u = make_url(pg_url)
    p = TcpProxy(u.host or "127.0.0.1", u.port or 5432)
    await p.start()
    try:
        yield p
    finally:
        await p.kill()


@pytest.fixture
async def empty_pg(pg_admin_url: str) -> AsyncIterator[str]:
    """A PostgreSQL database with no calltape schema, dropped afterwards (not on a Citus cluster, where
    a database needs the extension and its workers: those tests are skipped)."""
    if os.environ.get("CALLTAPE_TEST_CITUS_URL"):
        pytest.skip("needs a database of its own, not the Citus cluster's")
    name = f"calltape_empty_{uuid.uuid4().hex[:10]}"
    admin = await raw_pg(pg_admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    admin = await raw_pg(pg_admin_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def operator_store(store_url: str) -> AsyncIterator[EventStore]:
    """The store opened for every tenant (the operator's), for tests that write several tenants' sessions."""
    s = await open_store(store_url, tenant=ALL_TENANTS)
    try:
        yield s
    finally:
        await s.close()
