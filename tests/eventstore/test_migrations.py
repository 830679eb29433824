"""Opening stores: schema checks, automatic SQLite upgrade, `upgrade()`, unreachable databases."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from eventstore_support import raw_pg, started
from sqlalchemy.engine import make_url

import calltape
from calltape.errors import CalltapeError, SchemaOutdated, StoreUnavailable
from calltape.eventstore import open_store, resolve_url, upgrade
from calltape.migrations import VERSION_TABLE, alembic_config, head_revision


def one_sentence(message: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message


async def test_postgres_without_schema_says_what_to_run(empty_pg):
    with pytest.raises(SchemaOutdated) as info:
        await open_store(empty_pg)
    message = str(info.value)
    one_sentence(message)
    assert "has no calltape schema" in message and "run `calltape db upgrade`" in message
    assert make_url(empty_pg).database in message


async def test_postgres_at_an_older_revision_says_what_to_run(empty_pg):
    await upgrade(empty_pg)
    conn = await raw_pg(empty_pg)
    try:
        await conn.execute(f"UPDATE {VERSION_TABLE} SET version_num = '0000_older'")
    finally:
        await conn.close()
    with pytest.raises(SchemaOutdated) as info:
        await open_store(empty_pg)
    message = str(info.value)
    one_sentence(message)
    assert f"is at schema revision 0000_older but this calltape needs {head_revision()}" in message
    assert message.endswith("run `calltape db upgrade`")


async def test_upgrade_then_open(empty_pg, session_id, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no alembic.ini or repository files around: the package carries its migrations
    assert await upgrade(empty_pg) == (None, head_revision())
    assert await upgrade(empty_pg) == (head_revision(), head_revision())  # idempotent
    async with await open_store(empty_pg) as store:
        assert store.dialect == "postgresql"
        assert [e.seq for e in await store.append([started(session_id)])] == [1]


def test_migrations_ship_inside_the_package():
    location = Path(alembic_config().get_main_option("script_location") or "")
    assert location.resolve() == (Path(calltape.__file__).parent / "migrations").resolve()
    assert (location / "env.py").is_file() and list((location / "versions").glob("*.py"))
    assert head_revision() == "0006"


async def test_sqlite_is_upgraded_automatically(tmp_path, session_id):
    path = tmp_path / "nested" / "dir" / "calltape.db"
    async with await open_store(f"sqlite:///{path}") as store:
        assert store.dialect == "sqlite"
        await store.append([started(session_id)])
    with sqlite3.connect(path) as db:
        assert db.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall() == [(head_revision(),)]
    async with await open_store(f"sqlite:///{path}") as store:  # reopening keeps the data
        assert len(await store.read(session_id)) == 1


async def test_sqlite_upgrade_function(tmp_path):
    url = f"sqlite:///{tmp_path}/x.db"
    assert await upgrade(url) == (None, head_revision())
    assert await upgrade(url) == (head_revision(), head_revision())


async def test_postgres_upgrade_on_open_when_asked(empty_pg):
    async with await open_store(empty_pg, upgrade_schema=True) as store:
        assert await store.sessions() == []


async def test_unreachable_postgres_is_one_sentence():
    with pytest.raises(StoreUnavailable) as info:
        await open_store("postgresql://postgres@127.0.0.1:1/nothing")
    message = str(info.value)
    one_sentence(message)
    assert message.startswith("cannot reach the PostgreSQL at 127.0.0.1:1/nothing")


async def test_unreachable_postgres_upgrade_is_one_sentence():
    with pytest.raises(StoreUnavailable) as info:
        await upgrade("postgresql://postgres@127.0.0.1:1/nothing")
    one_sentence(str(info.value))


async def test_password_never_appears_in_errors():
    with pytest.raises(StoreUnavailable) as info:
        await open_store("postgresql://postgres:s3cret-pw@127.0.0.1:1/nothing")
    assert "s3cret-pw" not in str(info.value)


def test_url_forms(tmp_path, monkeypatch):
    monkeypatch.delenv("CALLTAPE_DATABASE_URL", raising=False)
    monkeypatch.setenv("CALLTAPE_HOME", str(tmp_path))
    assert resolve_url() == f"sqlite+aiosqlite:///{tmp_path}/calltape.db"
    assert resolve_url("postgresql://u@h/db") == "postgresql+asyncpg://u@h/db"
    assert resolve_url("postgres://u@h/db") == "postgresql+asyncpg://u@h/db"
    assert resolve_url("sqlite:////tmp/a.db") == "sqlite+aiosqlite:////tmp/a.db"
    monkeypatch.setenv("CALLTAPE_DATABASE_URL", "postgresql://env@h/db")
    assert resolve_url() == "postgresql+asyncpg://env@h/db"
    assert resolve_url("sqlite:////tmp/b.db") == "sqlite+aiosqlite:////tmp/b.db"  # explicit beats env
    # SQLite's in-memory database, both spellings (a private database per opened store: for tests)
    assert resolve_url("sqlite:///:memory:") == "sqlite+aiosqlite:///:memory:"
    assert resolve_url("sqlite://") == "sqlite+aiosqlite:///:memory:"
    for bad, words in [
        ("mysql://u@h/db", "PostgreSQL or SQLite"),
        ("not a url", "not a database URL"),
    ]:
        with pytest.raises(CalltapeError, match=words):
            resolve_url(bad)
