"""Opening a store from a URL: the embedded default, URL forms, and the schema check."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
from sqlalchemy import Connection, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool

from calltape.errors import CalltapeError, SchemaOutdated
from calltape.eventstore import tenancy
from calltape.eventstore.citus import (
    CONNECTION_SETTINGS,
    CitusEventStore,
    distribute,
    is_distributed,
    settle_two_phase,
    worker_groups,
)
from calltape.eventstore.errors import translate_errors, where
from calltape.eventstore.postgres import PostgresEventStore
from calltape.eventstore.queries import dumps_data
from calltape.eventstore.sqlite import SqliteEventStore, configure_engine
from calltape.eventstore.store import EventStore
from calltape.eventstore.tenancy import tenant_settings
from calltape.migrations import HEAD, VERSION_TABLE, alembic_config
from calltape.redaction import Redactor

ENV_URL = "CALLTAPE_DATABASE_URL"
MEMORY = ":memory:"
_MIGRATION_LOCK = 0x63616C6C74617065  # "calltape": the advisory lock key that serialises upgrades


def default_path() -> Path:
    """The embedded database: ``$CALLTAPE_HOME/calltape.db``, else under the XDG data directory."""
    home = os.environ.get("CALLTAPE_HOME")
    if home:
        return Path(home) / "calltape.db"
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "calltape" / "calltape.db"


def resolve_url(url: str | None = None) -> str:
    """``--db`` first, then ``$CALLTAPE_DATABASE_URL``, then the embedded SQLite file; driver-qualified."""
    raw = url or os.environ.get(ENV_URL) or f"sqlite:///{default_path()}"
    try:
        parsed = make_url(raw)
    except ArgumentError:
        raise CalltapeError(f"'{raw}' is not a database URL (use postgresql://… or sqlite:///path)") from None
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    elif backend == "sqlite":
        if (parsed.database or MEMORY) == MEMORY:
            # `sqlite://` and `sqlite:///:memory:`: SQLite's private in-memory database.
            return f"sqlite+aiosqlite:///{MEMORY}"
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    else:
        raise CalltapeError(f"calltape stores events in PostgreSQL or SQLite, not '{backend}'")
    return parsed.render_as_string(hide_password=False)


def absolute_hint(database: str) -> str:
    """How to write ``database`` (a path an SQLite URL gives relative to the current directory) as the
    absolute path it may have meant: ``sqlite:///`` and three slashes is relative, four is absolute."""
    return f"an absolute path takes four slashes: sqlite:////{database.lstrip('/')}"


def check_relative_sqlite(url: str) -> None:
    """Refuses an SQLite URL whose relative path names a directory the current one does not have:
    ``sqlite:///data/calls.db`` is ``./data/calls.db``, and a missing ``./data`` most often means the
    absolute ``/data/calls.db`` was meant (calltape would otherwise create a stray database here)."""
    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", MEMORY) or database.startswith("file:"):
        return
    path = Path(database)
    if path.is_absolute() or path.parent.is_dir():
        return
    raise CalltapeError(
        f"the SQLite path '{database}' is relative to the current directory, which has no '{path.parent}' "
        f"directory: {absolute_hint(database)}, or create the directory first"
    )


def is_memory(url: str) -> bool:
    """Whether ``url`` names SQLite's in-memory database (one private database per opened store)."""
    parsed = make_url(url)
    return parsed.get_backend_name() == "sqlite" and (parsed.database or MEMORY) == MEMORY


def _create_private(path: Path) -> None:
    """Creates the embedded database readable by its owner only (it holds what callers said): the
    directory 0700 and the file 0600 when calltape creates them. SQLite gives its -wal and -shm files
    the database file's mode. An existing file or directory keeps the mode its owner chose."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def create_engine(url: str, *, tenant: str | None = None) -> AsyncEngine:
    """An async engine for ``url``: SQLite configured for WAL and explicit BEGIN, PostgreSQL pooled.

    Every PostgreSQL connection of the pool starts with ``calltape.tenant`` set to ``tenant`` (empty for
    none): row-level security reads it, so whatever runs on the connection sees that tenant's rows only.
    """
    if is_memory(url):
        # A pool of exactly one connection hands the database to one transaction at a time (SQLite
        # serializes writers anyway). The database is a named shared-cache one held open by a keeper
        # connection that never queries: a pooled connection discarded mid-query (a task cancelled in
        # a write) would otherwise take the whole database with it.
        name = f"file:calltape-{uuid.uuid4().hex}?mode=memory&cache=shared"
        keeper = sqlite3.connect(name, uri=True, check_same_thread=False)
        engine = create_async_engine(
            f"sqlite+aiosqlite:///{name}&uri=true",
            poolclass=AsyncAdaptedQueuePool,
            pool_size=1,
            max_overflow=0,
            # waiting for the one connection is the design, not a fault: no give-up timer at all (on a
            # virtual-time test loop any timer fires as soon as the loop idles on the SQLite thread,
            # however long it is: 86,400 s did in CI)
            pool_timeout=None,
            json_serializer=dumps_data,
            json_deserializer=orjson.loads,
        )
        configure_engine(engine)
        weakref.finalize(engine, keeper.close)  # the database lives exactly as long as its engine
        return engine
    if make_url(url).get_backend_name() == "sqlite":
        _create_private(Path(make_url(url).database or ""))
        engine = create_async_engine(url, json_serializer=dumps_data, json_deserializer=orjson.loads)
        configure_engine(engine)
        return engine
    return create_async_engine(
        url,
        pool_size=10,
        max_overflow=20,
        json_serializer=dumps_data,
        json_deserializer=orjson.loads,
        connect_args={
            "timeout": 10,
            "server_settings": {**tenant_settings(tenant), **CONNECTION_SETTINGS},
        },
    )


def _current_revision(conn: Connection) -> str | None:
    """The applied revision, read without importing Alembic (every CLI call opens a store)."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def _upgrade(conn: Connection) -> None:
    from alembic import command

    cfg = alembic_config()
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, "head")


async def upgrade(
    url: str | None = None, *, grant: str | None = None, citus: bool | None = None, shards: int | None = None
) -> tuple[str | None, str]:
    """Applies the migrations; returns (revision before, revision after).

    ``grant`` (PostgreSQL) names an existing role to prepare for the application: rights to read and
    write the calltape tables' rows, nothing more; a role that bypasses row-level security is refused.

    On a database with the ``citus`` extension the tables are then distributed by session (see
    :mod:`.citus`); ``citus=True`` requires the extension, ``citus=False`` leaves the tables local.
    ``shards`` sets how many shards they are distributed in (see :data:`.citus.SHARDS_PER_WORKER`).
    """
    resolved = resolve_url(url)
    postgres = make_url(resolved).get_backend_name() == "postgresql"
    if shards is not None and shards < 1:
        raise CalltapeError(f"--shards takes a count of 1 or more, not {shards}")
    if grant is not None and not postgres:
        raise CalltapeError("--grant prepares a PostgreSQL role, and an SQLite file has no roles")
    if citus and not postgres:
        raise CalltapeError("--citus distributes a PostgreSQL database, and an SQLite file is not one")
    if shards is not None and not postgres:
        raise CalltapeError("--shards distributes a PostgreSQL database over Citus, and an SQLite file is not one")
    if shards is not None and citus is False:
        raise CalltapeError("--shards distributes the tables over Citus, and --no-citus leaves them local")
    engine = create_engine(resolved)
    try:
        async with translate_errors(resolved), _schema_transaction(engine) as conn:
            before = await conn.run_sync(_current_revision)
            if before != HEAD:
                await conn.run_sync(_upgrade)
            distributed = False
            if postgres and citus is not False:
                await conn.run_sync(lambda sync: distribute(sync, required=bool(citus), shards=shards))
                distributed = await conn.run_sync(is_distributed)
            if grant is not None:
                role = grant
                await conn.run_sync(lambda sync: tenancy.grant(sync, role, VERSION_TABLE))
        if distributed:
            # Citus ran the upgrade's DDL by two-phase commit, and the feed waits until Citus confirms
            # those commits (see citus.py): confirm them now, not at Citus's next recovery round.
            async with engine.connect() as sa_conn:
                raw = await sa_conn.get_raw_connection()
                await settle_two_phase(raw.driver_connection)
        return before, HEAD
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def _schema_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A transaction that may change the schema. On SQLite it takes the write lock up front
    (``BEGIN IMMEDIATE``): a deferred transaction that read the revision cannot upgrade its lock
    while another process does the same, so two processes opening a fresh file at once would
    fail with "database is locked" instead of one waiting for the other's migration. On PostgreSQL
    a transaction-scoped advisory lock makes concurrent upgrades take turns."""
    async with engine.connect() as conn:
        sqlite = engine.dialect.name == "sqlite"
        if sqlite:
            conn = await conn.execution_options(calltape_begin="IMMEDIATE")
        async with conn.begin():
            if not sqlite:
                await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            yield conn


ENV_REDACT = "CALLTAPE_REDACT"


async def open_store(
    url: str | None = None,
    *,
    upgrade_schema: bool | None = None,
    redactor: Redactor | None = None,
    tenant: str | None = None,
) -> EventStore:
    """Opens the store at ``url``; SQLite stores are upgraded automatically, PostgreSQL ones are checked.

    ``redactor`` (default: the kinds in ``$CALLTAPE_REDACT``, e.g. ``card,email`` or ``all``) is applied to
    every event appended through this store, and the recorders over it, before it reaches the database.

    ``tenant`` (default ``$CALLTAPE_TENANT``; ``""`` for none) opens the store for one tenant: it sees and
    writes only that tenant's sessions. On PostgreSQL the database enforces it (row-level security), and a
    role that bypasses row-level security is refused; on SQLite calltape filters (see :mod:`.tenancy`).
    Without a tenant the store sees and writes only the sessions that have none. ``tenant="*"``
    (:data:`~.tenancy.ALL_TENANTS`) opens it for every tenant: the operator's, on PostgreSQL only for a
    role that bypasses row-level security.
    """
    resolved = resolve_url(url)
    check_relative_sqlite(resolved)
    tenant = tenancy.resolve_tenant(tenant)
    everyone = tenant == tenancy.ALL_TENANTS
    if everyone:
        tenant = None
    sqlite = make_url(resolved).get_backend_name() == "sqlite"
    engine = create_engine(resolved, tenant=tenant)
    try:
        async with translate_errors(resolved):
            async with engine.connect() as conn:
                current = await conn.run_sync(_current_revision)
                bypasses = not sqlite and bool((await conn.execute(text(tenancy.BYPASSES))).scalar())
                citus = not sqlite and await conn.run_sync(is_distributed)
                groups = await conn.run_sync(worker_groups) if citus else 1
                if tenant is not None and bypasses:
                    raise CalltapeError(
                        "the PostgreSQL role of this connection bypasses row-level security, so it cannot be "
                        f"held to tenant '{tenant}': connect as a role prepared with "
                        "`calltape db upgrade --grant ROLE`"
                    )
                if everyone and not sqlite and not bypasses:
                    raise CalltapeError(
                        "row-level security holds the PostgreSQL role of this connection to one tenant at a "
                        "time, so it cannot see every tenant: connect as a superuser or a BYPASSRLS role"
                    )
            head = HEAD
            if current != head:
                if upgrade_schema if upgrade_schema is not None else sqlite:
                    async with _schema_transaction(engine) as conn:
                        # Read again under the lock: another process may have upgraded meanwhile.
                        if await conn.run_sync(_current_revision) != head:
                            await conn.run_sync(_upgrade)
                elif current is None:
                    raise SchemaOutdated(f"the {where(resolved)} has no calltape schema; run `calltape db upgrade`")
                else:
                    raise SchemaOutdated(
                        f"the {where(resolved)} is at schema revision {current} but this calltape needs "
                        f"{head}; run `calltape db upgrade`"
                    )
    except BaseException:
        await engine.dispose()
        raise
    store: EventStore
    if sqlite:
        store = SqliteEventStore(engine, resolved)
    else:
        store = (CitusEventStore if citus else PostgresEventStore)(engine, resolved)
        store.write_groups = groups
        store.copy_in = bypasses
        store.held_by_rls = not bypasses
    store.tenant = tenant
    store.all_tenants = everyone
    store.redactor = redactor if redactor is not None else Redactor.parse(os.environ.get(ENV_REDACT))
    return store
