"""Turns driver errors into the two a caller can act on: retry later, or upgrade the schema."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
from collections.abc import AsyncIterator

import asyncpg
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from calltape.errors import SchemaOutdated, SessionErased, StoreUnavailable, TenantRefused


def is_rls_violation(exc: BaseException) -> bool:
    """Whether a driver error is PostgreSQL refusing a row under row-level security."""
    return getattr(exc, "sqlstate", None) == "42501" and "row-level security" in str(exc)


_ASYNCPG_DISCONNECTS = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
    # A backend terminated while the connection sat idle in the pool: its FATAL message leaves the
    # protocol out of sync ("another operation is in progress") before the socket reports EOF.
    asyncpg.InternalClientError,
)


def where(url: str) -> str:
    """The database named for a person, without the password."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if (u.database or ":memory:") == ":memory:":
            return "in-memory SQLite database"
        return f"SQLite file {u.database}"
    return f"PostgreSQL at {u.host or 'localhost'}:{u.port or 5432}/{u.database or ''}"


def error_chain(exc: BaseException) -> list[BaseException]:
    """The error and everything it wraps (SQLAlchemy's ``orig``, causes, contexts)."""
    found: list[BaseException] = []
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or any(e is f for f in found):
            continue
        found.append(e)
        stack += [getattr(e, "orig", None), e.__cause__, e.__context__]
    return found


def is_disconnect(exc: BaseException) -> bool:
    """Whether the error means the database is unreachable (so retrying later may succeed)."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return any(
        isinstance(e, (OSError, asyncio.TimeoutError, sa_exc.TimeoutError, *_ASYNCPG_DISCONNECTS))
        for e in error_chain(exc)
    )


_NODE_FAILURE = re.compile(
    r"could not commit transaction (?:for shard \d+ )?on (?:at least one|any) active node"
    r"|failure on connection marked as essential"
)
"""Citus's words for a worker node it lost during a transaction (raised as SQLSTATE XX000, an internal
error, often at COMMIT): the cluster is partly down, not the events wrong."""


def is_node_failure(exc: BaseException) -> bool:
    """Whether a Citus coordinator reports a worker node lost mid-transaction (an outage: retrying once
    the worker is back succeeds, and appends are idempotent, so a part that did commit is not doubled)."""
    return any(
        getattr(e, "sqlstate", None) == "XX000" and _NODE_FAILURE.search(str(e)) is not None for e in error_chain(exc)
    )


@contextlib.asynccontextmanager
async def translate_errors(url: str, *, tenant: str | None = None) -> AsyncIterator[None]:
    """Turns driver errors into ``StoreUnavailable`` (an unreachable database, a busy SQLite file, a Citus
    worker lost mid-transaction) or ``SchemaOutdated`` naming the database, and a row refused by
    row-level security into ``TenantRefused`` (for a store opened for ``tenant``)."""
    try:
        yield
    except (StoreUnavailable, SchemaOutdated, TenantRefused):
        raise
    except Exception as exc:
        chain = error_chain(exc)
        root = chain[-1] if len(chain) > 1 else exc
        text = str(root).strip().splitlines()[0] if str(root).strip() else type(root).__name__
        if any(is_rls_violation(e) for e in chain):
            raise TenantRefused(None, tenant) from None
        if any("calltape: session erased" in str(e) for e in chain):
            raise SessionErased() from None  # the tombstone guard (migration 0002)
        if any(isinstance(e, asyncpg.UndefinedTableError) for e in chain) or "no such table" in text:
            raise SchemaOutdated(f"the {where(url)} has no calltape schema; run `calltape db upgrade`") from exc
        sqlite_busy = any(
            isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "unable to open" in str(e))
            for e in chain
        )
        if is_disconnect(exc) or sqlite_busy or is_node_failure(exc):
            raise StoreUnavailable(f"cannot reach the {where(url)}: {text}") from exc
        raise


# SQLSTATEs worth an immediate retry: serialization failure, deadlock, lock not available.
_TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03"})


def is_transient(exc: BaseException) -> bool:
    """A conflict that a second attempt of the same transaction can win (not an outage, not a verdict)."""
    for e in error_chain(exc):
        if getattr(e, "sqlstate", None) in _TRANSIENT_SQLSTATES:
            return True
        if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
            return True
    return False
