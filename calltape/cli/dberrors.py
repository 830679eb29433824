"""One sentence, naming the fix, for every database failure a user can cause from the command line.

The store raises what a program can act on (``StoreUnavailable``, ``SchemaOutdated``) and lets the
driver's own errors through otherwise. A person at a terminal needs more: which server, which
database or role, and the command that repairs it (``createdb NAME``, ``calltape db upgrade``).
This module turns both kinds into that sentence; it never includes a password.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import URL, make_url

from calltape.errors import CliError, SchemaOutdated, StoreUnavailable, TenantRefused
from calltape.eventstore.errors import error_chain


def _server(url: URL) -> str:
    return f"the PostgreSQL server at {url.host or 'localhost'}:{url.port or 5432}"


def explain(exc: BaseException, raw_url: str) -> str | None:
    """The sentence for ``exc`` raised while using the database at ``raw_url``, or None if it is not a
    database failure a user can cause."""
    try:
        url = make_url(raw_url)
    except Exception:
        return None
    chain = error_chain(exc)
    if url.get_backend_name() == "sqlite":
        return _explain_sqlite(chain, url)
    return _explain_postgres(chain, url)


def _sqlstate(chain: list[BaseException]) -> str | None:
    for e in chain:
        code = getattr(e, "sqlstate", None)
        if isinstance(code, str):
            return code
    return None


def _explain_postgres(chain: list[BaseException], url: URL) -> str | None:
    database = url.database or url.username or "postgres"
    user = url.username or "the current user"
    state = _sqlstate(chain)
    if state == "3D000":
        return (
            f"there is no database '{database}' on {_server(url)}: create it (createdb {database}), "
            "then run `calltape db upgrade` with the same --db"
        )
    if state == "28P01":
        return (
            f"{_server(url)} refused the password for user '{user}': check the password in the database URL "
            "(or $PGPASSWORD, ~/.pgpass)"
        )
    if state == "28000":
        text = " ".join(str(e) for e in chain)
        if "role" in text and "does not exist" in text:
            return (
                f"{_server(url)} has no role '{user}': create it (createuser {user}) or put an existing "
                "user in the database URL"
            )
        return (
            f"{_server(url)} does not let user '{user}' connect to database '{database}' from this host "
            "(see its pg_hba.conf)"
        )
    if state == "42501":
        return (
            f"user '{user}' lacks the rights calltape needs on database '{database}' of {_server(url)}: "
            "grant them (calltape db upgrade --grant ROLE, run as the owner) or connect as the owner"
        )
    for e in chain:
        if isinstance(e, SchemaOutdated):
            return str(e)
    if any(isinstance(e, StoreUnavailable) for e in chain):
        return (
            f"cannot reach the PostgreSQL at {url.host or 'localhost'}:{url.port or 5432}/{url.database or ''} "
            f"({_why_unreachable(chain, url)}): is the server running, and are the host and port in the URL right?"
        )
    return None


def _why_unreachable(chain: list[BaseException], url: URL) -> str:
    for e in chain:
        if isinstance(e, socket.gaierror):
            return f"host '{url.host}' not found"
        if isinstance(e, ConnectionRefusedError):
            return "connection refused"
        if isinstance(e, TimeoutError):
            return "no answer in time"
        if isinstance(e, OSError) and e.errno is not None and "Connect call failed" in str(e):
            return "connection refused"
    for e in chain:
        if isinstance(e, OSError) and e.strerror:
            return e.strerror.lower()
    return "the connection failed"


def _explain_sqlite(chain: list[BaseException], url: URL) -> str | None:
    path = url.database or ""
    for e in chain:
        if isinstance(e, SchemaOutdated):
            return str(e)
    for e in chain:
        if isinstance(e, sqlite3.DatabaseError):
            text = str(e)
            if "file is not a database" in text or "malformed" in text:
                return f"'{path}' is not an SQLite database"
            if "unable to open" in text:
                where = Path(path).parent
                if not where.is_dir():
                    return f"cannot create the SQLite file '{path}': its directory cannot be made"
                return f"cannot open the SQLite file '{path}' (check its permissions)"
            if "readonly" in text:
                return f"the SQLite file '{path}' is read-only"
    for e in chain:
        if isinstance(e, PermissionError):
            return f"cannot open the SQLite file '{path}': permission denied"
    return None


@contextlib.contextmanager
def database_errors(raw_url: str) -> Iterator[None]:
    """Around every use of the database by a command: a user-caused failure becomes one sentence."""
    try:
        yield
    except (CliError, TenantRefused):  # already the sentence (the driver's RLS error is only its context)
        raise
    except Exception as exc:
        sentence = explain(exc, raw_url)
        if sentence is None:
            raise
        raise CliError(sentence) from None
