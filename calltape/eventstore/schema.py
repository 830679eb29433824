"""The event log's tables, defined once: the queries of both backends are built from them, new
migrations may create from them, and a test checks that the migrations produce exactly this.

The two backends differ in four places, all declared here: ``ct_events.pos`` is a ``bigint``
identity on PostgreSQL and SQLite's ``INTEGER PRIMARY KEY AUTOINCREMENT``; on PostgreSQL the primary key
of ``ct_events`` is ``(session, pos)`` (migration 0004: Citus accepts only keys that include the
column it shards by; see :mod:`.citus`), on SQLite ``pos`` alone (its rowid); ``data`` is ``jsonb`` on
PostgreSQL and text on SQLite; and only PostgreSQL has ``txid`` (the transaction that wrote the row,
which orders the global feed) with its index. A column marked ``info={"only": dialect}`` is left out of
the other dialect's ``CREATE TABLE``.

``ct_events`` and ``ct_snapshots`` carry their session's tenant (migration 0005), copied from the
session's summary row by every write: a row-level-security policy can then hold each row by its own
columns, which is the only kind Citus accepts (see :mod:`.citus`).

The existing migration files (0001, 0002) keep their own copy of the columns on purpose: a
migration is history and must create the schema of its day, whatever these tables become later.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateColumn
from sqlalchemy.types import UserDefinedType

metadata = MetaData()
"""Every calltape table (all named ``ct_*``, so they can share a database with an application's)."""

ONLY = "only"
"""``Column.info`` key: the one dialect that has this column."""


class Xid8(UserDefinedType[int]):
    """PostgreSQL's 64-bit transaction id (``xid8``)."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        """The type's name in DDL."""
        return "xid8"


@compiles(CreateColumn)
def _create_column(element: CreateColumn, compiler: Any, **kw: Any) -> str | None:
    """Leaves a dialect-only column out of the other dialects' ``CREATE TABLE``."""
    only = element.element.info.get(ONLY)
    if only is not None and only != compiler.dialect.name:
        return None
    text_: str = compiler.visit_create_column(element, **kw)
    return text_


sessions = Table(
    "ct_sessions",
    metadata,
    Column("session", Text, primary_key=True),
    Column("agent", Text),
    Column("tenant", Text),
    Column("modality", Text),
    Column("framework", Text),
    Column("status", Text, nullable=False),
    Column("last_seq", Integer, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("first_at_ms", BigInteger),
    Column("last_at_ms", BigInteger),
    Column("started", Boolean, nullable=False, server_default=false()),
    Index("ct_sessions_last_at", "last_at_ms"),
)
"""One row per session: its summary, kept current by every append (and the lock appends take)."""

events = Table(
    "ct_events",
    metadata,
    Column(
        "pos",
        BigInteger().with_variant(Integer(), "sqlite"),
        Identity(always=True),
        primary_key=True,
    ),
    Column("session", Text, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("id", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    Column("agent", Text),
    Column("epoch", Integer),
    Column("data", JSONB().with_variant(Text(), "sqlite"), nullable=False),
    Column("txid", Xid8(), nullable=False, server_default=text("pg_current_xact_id()"), info={ONLY: "postgresql"}),
    Column("tenant", Text),
    UniqueConstraint("session", "seq", name="ct_events_session_seq"),
    UniqueConstraint("session", "id", name="ct_events_session_id"),
    Index("ct_events_feed", "txid", "pos").ddl_if(dialect="postgresql"),
    Index("ct_events_session_type", "session", "type", "seq"),
    sqlite_autoincrement=True,
)
"""The log: one row per event; ``(session, seq)`` and ``(session, id)`` unique, ``pos`` the feed order,
``(session, type, seq)`` for reads of a few types (migration 0006: the effect API's ``tool.effect``).

``pos`` is declared the key as SQLite has it; on PostgreSQL the key is ``(session, pos)`` (see above)."""

snapshots = Table(
    "ct_snapshots",
    metadata,
    Column("session", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("state", LargeBinary, nullable=False),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("tenant", Text),
    PrimaryKeyConstraint("session", "version", "seq"),
)
"""Fold snapshots: a cache, dropped whenever stored events are rewritten."""

tombstones = Table(
    "ct_tombstones",
    metadata,
    Column("session", Text, primary_key=True),
    Column("erased_at_ms", BigInteger, nullable=False),
    Column("events", Integer, nullable=False),
    Column("tenant", Text),
)
"""What stays of an erased session: id, time, event count, its tenant; a trigger refuses the id ever after."""

SESSION_COLUMNS = tuple(sessions.c)
"""The summary's columns, in :class:`~calltape.eventstore.append_plan.SessionInfo` field order."""

EVENT_COLUMNS = tuple(c for c in events.c if c.name not in ("pos", "txid", "tenant"))
"""An event's columns: ``session, seq, id, type, at_ms, agent, epoch, data``."""

ROW_COLUMNS = (*EVENT_COLUMNS, events.c.tenant)
"""A ``ct_events`` row as written: the event's columns, then its session's tenant (migration 0005)."""
