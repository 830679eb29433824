"""Shared fixtures: every store-facing test runs on SQLite and on a real PostgreSQL.

PostgreSQL comes from ``$CALLTAPE_TEST_PG_URL`` (an admin URL; the suite creates and drops its own
database), else from testcontainers when a Docker engine answers. In CI (``CI=true``) a missing
PostgreSQL fails the run instead of skipping.

``$CALLTAPE_TEST_CITUS_URL`` (the coordinator of a Citus cluster, a database with the ``citus``
extension and its workers added) runs the PostgreSQL tests on the cluster instead: the suite distributes
the calltape tables there (``db upgrade``) and uses that database as it is (tests use their own session
ids), and tests that need a database of their own are skipped. Tests marked ``citus`` run only then,
in one process (``-n 0``: some count the cluster's two-phase commits, which another process's writes
would move). CI keeps the single node.

The README's command runs the suite in two processes (pytest-xdist): each makes its own database.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from sqlalchemy.engine import make_url

from calltape.eventstore import EventStore, open_store, upgrade

PG_ENV = "CALLTAPE_TEST_PG_URL"
CITUS_ENV = "CALLTAPE_TEST_CITUS_URL"


def citus_url() -> str | None:
    """The Citus coordinator the suite runs on, when ``$CALLTAPE_TEST_CITUS_URL`` names one."""
    return os.environ.get(CITUS_ENV) or None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``citus`` need the cluster: skipped without ``$CALLTAPE_TEST_CITUS_URL``."""
    if citus_url() is None:
        skip = pytest.mark.skip(reason=f"no Citus cluster: set {CITUS_ENV}")
        for item in items:
            if item.get_closest_marker("citus") is not None:
                item.add_marker(skip)


def _docker_postgres() -> Iterator[str] | None:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception:
        return None
    from testcontainers.postgres import PostgresContainer

    def run() -> Iterator[str]:
        with PostgresContainer("postgres:16-alpine", driver=None) as pg:
            yield pg.get_connection_url()

    return run()


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    url = citus_url() or os.environ.get(PG_ENV)
    if url:
        yield url
        return
    container = _docker_postgres()
    if container is not None:
        yield from container
        return
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL tests must run in CI: set {PG_ENV} (e.g. postgresql://postgres@127.0.0.1/test)")
    pytest.skip(f"no PostgreSQL: set {PG_ENV} or start Docker")


async def _admin(url: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh, migrated database for this test run (on Citus: the cluster's database, distributed)."""
    if citus_url() is not None:
        asyncio.run(upgrade(pg_admin_url, citus=True))
        yield pg_admin_url
        return
    name = f"calltape_test_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(pg_admin_url, f'CREATE DATABASE "{name}"'))
    url = make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    asyncio.run(upgrade(url))
    yield url
    asyncio.run(_admin(pg_admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('store')}/calltape.db"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[EventStore]:
    s = await open_store(store_url)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def session_id() -> str:
    return f"call-{uuid.uuid4().hex[:12]}"
