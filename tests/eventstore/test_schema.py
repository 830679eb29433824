"""The tables are defined once (calltape/eventstore/schema.py): the migrations must build exactly them."""

from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, Index, inspect

from calltape.eventstore import upgrade
from calltape.eventstore.connect import create_engine, resolve_url
from calltape.eventstore.schema import ONLY, metadata
from calltape.migrations import VERSION_TABLE


def _differences(conn: Connection) -> list[Any]:
    dialect = conn.dialect.name

    def belongs(obj: Any, _name: Any, kind: str, _reflected: bool, _compare_to: Any) -> bool:
        columns = list(obj.columns) if kind == "index" and isinstance(obj, Index) else [obj] if kind == "column" else []
        return all(c.info.get(ONLY, dialect) == dialect for c in columns)

    context = MigrationContext.configure(
        conn,
        opts={
            "compare_type": True,
            "compare_server_default": True,
            "include_object": belongs,
            "version_table": VERSION_TABLE,
        },
    )
    found = list(compare_metadata(context, metadata))
    if dialect == "sqlite":  # SQLite has no identity columns; _identity checks its AUTOINCREMENT instead
        found = [
            d for d in found if not (isinstance(d, list) and d[0][:4] == ("modify_default", None, "ct_events", "pos"))
        ]
    return found + _identity(conn)


def _identity(conn: Connection) -> list[Any]:
    (pos,) = [c for c in inspect(conn).get_columns("ct_events") if c["name"] == "pos"]
    if conn.dialect.name == "postgresql":
        found = pos.get("identity") or {}
        return [] if found.get("always") else [("pos is not GENERATED ALWAYS AS IDENTITY", pos)]
    sql = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = 'ct_events'").scalar() or ""
    return [] if "pos INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT" in sql else [("pos is not AUTOINCREMENT", sql)]


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/schema.db"
    url: str = request.getfixturevalue("empty_pg")
    return url


@pytest.mark.filterwarnings("ignore:Did not recognize type .xid8.")
async def test_migrations_build_the_tables_defined_once(fresh_url: str) -> None:
    await upgrade(fresh_url)
    engine = create_engine(resolve_url(fresh_url))
    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(_differences) == []
    finally:
        await engine.dispose()


@pytest.mark.filterwarnings("ignore:Did not recognize type .xid8.")
async def test_the_comparison_sees_a_column_the_migrations_lack(fresh_url: str) -> None:
    # The check above must be able to fail: a column added to the tables but not to a migration.
    from sqlalchemy import Column, Text

    await upgrade(fresh_url)
    engine = create_engine(resolve_url(fresh_url))
    extra = Column("not_migrated", Text)
    metadata.tables["ct_sessions"].append_column(extra)
    try:
        async with engine.connect() as conn:
            found = await conn.run_sync(_differences)
        assert [d[0] for d in found] == ["add_column"] and found[0][3].name == "not_migrated"
    finally:
        metadata.tables["ct_sessions"]._columns.remove(extra)  # type: ignore[attr-defined]
        await engine.dispose()
