"""The scratch database: created for one run, migrated, dropped at the end."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
from sqlalchemy.engine import make_url

from calltape.eventstore import upgrade

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1/test"

RAW_TABLE = "ct_events_raw"
ES_SCHEMA = "es_bench"


def plain_dsn(url: str) -> str:
    """A libpq/asyncpg DSN (no SQLAlchemy driver suffix)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass(frozen=True, slots=True)
class Scratch:
    url: str
    """The scratch database (plain ``postgresql://`` URL)."""
    name: str

    async def connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(plain_dsn(self.url))

    def es_env(self, app_name: str) -> dict[str, str]:
        """The ``eventsourcing`` environment for an application on the same server and database,
        in its own schema."""
        u = make_url(self.url)
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": u.database or "",
            "POSTGRES_HOST": u.host or "127.0.0.1",
            "POSTGRES_PORT": str(u.port or 5432),
            "POSTGRES_USER": u.username or "postgres",
            "POSTGRES_PASSWORD": u.password or "",
            "POSTGRES_SCHEMA": ES_SCHEMA,
            "POSTGRES_POOL_SIZE": "2",
            "CREATE_TABLE": "yes",
            "NAME": app_name,
        }


async def server_facts(scratch: Scratch) -> dict[str, str]:
    conn = await scratch.connect()
    try:
        facts = {"version": await conn.fetchval("SELECT version()")}
        for name in ("fsync", "synchronous_commit", "wal_sync_method", "shared_buffers", "full_page_writes"):
            facts[name] = await conn.fetchval(f"SHOW {name}")
        return facts
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def scratch_database(admin_url: str) -> AsyncIterator[Scratch]:
    name = f"calltape_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(plain_dsn(admin_url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = make_url(plain_dsn(admin_url)).set(database=name).render_as_string(hide_password=False)
    scratch = Scratch(url, name)
    try:
        await upgrade(url)
        conn = await scratch.connect()
        try:
            # The baseline table: the same row shape, the same indexes, defaults and identity.
            await conn.execute(f"CREATE TABLE {RAW_TABLE} (LIKE ct_events INCLUDING ALL)")
            await conn.execute(f"CREATE SCHEMA {ES_SCHEMA}")
        finally:
            await conn.close()
        yield scratch
    finally:
        admin = await asyncpg.connect(plain_dsn(admin_url))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def truncate_calltape(scratch: Scratch) -> None:
    conn = await scratch.connect()
    try:
        await conn.execute("TRUNCATE ct_events, ct_sessions, ct_snapshots")
    finally:
        await conn.close()


async def truncate_raw(scratch: Scratch) -> None:
    conn = await scratch.connect()
    try:
        await conn.execute(f"TRUNCATE {RAW_TABLE}")
    finally:
        await conn.close()


async def truncate_es(scratch: Scratch) -> None:
    conn = await scratch.connect()
    try:
        tables = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", ES_SCHEMA)
        if tables:
            await conn.execute("TRUNCATE " + ", ".join(f'{ES_SCHEMA}."{r["tablename"]}"' for r in tables))
    finally:
        await conn.close()
