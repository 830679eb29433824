"""Tenants kept apart (SPEC section 6): which tenant a store is opened for, and how each backend holds it there.

On PostgreSQL the database enforces it. Every connection calltape opens (the pool, the COPY paths that
use the pool's connections, the LISTEN connection) starts with the setting ``calltape.tenant`` (empty
when the store declared no tenant), and row-level security on every calltape table (migration 0003)
shows and accepts only the rows of that tenant, whatever SQL runs on the connection. A role that
bypasses row-level security (a superuser, ``BYPASSRLS``) is not held by it, so a store opened for a
tenant refuses such a role instead of pretending. An application role prepared by :func:`grant` sees,
without a tenant, only the sessions that have none.

On SQLite (one file per deployment, whoever can read the file can read every row) calltape filters in
its own queries, the same way: a store opened for a tenant sees and writes only that tenant's sessions,
a store without one only the sessions without a tenant. calltape filters the same way for a PostgreSQL
role that bypasses row-level security, so the API answers alike on both backends (raw SQL on such a
role's connection sees every row: that bypass is the database's).

Seeing every tenant is an explicit choice: the tenant :data:`ALL_TENANTS` (``--all-tenants``,
``CALLTAPE_TENANT=*``), the operator's, for pruning, erasing or exporting across tenants. On PostgreSQL
it needs a role that bypasses row-level security; a role held by it is refused.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence

from msgspec.structs import replace
from sqlalchemy import Connection, text

from calltape.errors import CalltapeError, TenantRefused
from calltape.events import Event
from calltape.eventstore.append_plan import SessionInfo

ENV_TENANT = "CALLTAPE_TENANT"
ALL_TENANTS = "*"
"""The tenant name that opens a store for every tenant (``--all-tenants``, ``CALLTAPE_TENANT=*``): the
operator's explicit choice, for pruning, erasing or exporting across tenants. On PostgreSQL it needs a
role that bypasses row-level security."""
SETTING = "calltape.tenant"
"""The PostgreSQL setting row-level security reads (set at connection start; empty means no tenant)."""

TABLES = ("ct_sessions", "ct_events", "ct_snapshots", "ct_tombstones")
"""Every calltape table holding session data; row-level security covers each one."""

_MAX_TENANT = 200


def execute_each(conn: Connection, *statements: str) -> None:
    """Runs DDL or grant statements one by one, in order, on a synchronous connection (migrations,
    ``db upgrade --grant``, Citus' policies): each is a statement of its own for the server."""
    for statement in statements:
        conn.execute(text(statement))


def resolve_tenant(tenant: str | None) -> str | None:
    """The tenant a store is opened for: ``tenant``, else ``$CALLTAPE_TENANT``, else none (``""`` = none);
    :data:`ALL_TENANTS` for every tenant."""
    value = tenant if tenant is not None else os.environ.get(ENV_TENANT)
    if value is None or value == "":
        return None
    if len(value) > _MAX_TENANT or value != value.strip() or any(ord(c) < 32 for c in value):
        raise CalltapeError(
            f"'{value[:40]}' is not a tenant name (at most {_MAX_TENANT} characters, "
            "no control characters, no leading or trailing spaces)"
        )
    return value


def admit(events: Sequence[Event], tenant: str | None, everyone: bool = False) -> Sequence[Event]:
    """The batch as a store opened for ``tenant`` writes it: a ``session.started`` without a tenant gets
    this one (so exports carry it), one naming another tenant is refused. A store without a tenant starts
    only sessions without one; a store for every tenant (``everyone``) writes what it is given."""
    if everyone or not any(e.type == "session.started" for e in events):
        return events
    admitted: list[Event] = []
    for event in events:
        if event.type == "session.started":
            named = event.data.get("tenant")
            if named is None and tenant is not None:
                event = replace(event, data={**event.data, "tenant": tenant})
            elif named != tenant:
                raise TenantRefused(event.session, tenant)
        admitted.append(event)
    return admitted


def refuse_foreign(rows: Iterable[SessionInfo], tenant: str | None, everyone: bool = False) -> None:
    """The guard where calltape keeps tenants apart itself (SQLite, and a PostgreSQL role that bypasses
    row-level security; the policies refuse the same rows): a store writes only its tenant's sessions,
    a store without a tenant only sessions without one, a store for every tenant any session."""
    if everyone:
        return
    for row in rows:
        if row.tenant != tenant:
            raise TenantRefused(row.session, tenant)


# -- PostgreSQL ------------------------------------------------------------------------------

CHANNEL = "calltape_events"
"""Woken by every commit (LISTEN by stores without a tenant, the operator's)."""

ERASED = "erased"
"""The payload of an erasure's or a redaction's notification (on the all-sessions channel and the
session's tenant's): subscriptions read again the page they hold. Commits notify with an empty payload."""

NOTIFY_TENANTS = (
    f"SELECT pg_notify(c, '') FROM (SELECT '{CHANNEL}' AS c "
    f"UNION SELECT '{CHANNEL}_' || md5(coalesce(tenant, '')) FROM v) AS channels"
)
"""Wakes the all-sessions channel and the channel of each tenant in ``v`` (the written session rows), so a
tenant's subscribers wake for their own tenant's commits only. Wake-ups carry no payload."""


def channel(tenant: str | None) -> str:
    """The channel a store LISTENs on: its tenant's (a hash, so any name fits), or all commits."""
    return f"{CHANNEL}_{hashlib.md5(tenant.encode()).hexdigest()}" if tenant is not None else CHANNEL


def tenant_settings(tenant: str | None) -> dict[str, str]:
    """The connection-start settings of a calltape connection (what row-level security reads)."""
    return {"application_name": "calltape", SETTING: tenant or ""}


BYPASSES = "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
"""Whether the connected role escapes row-level security."""


def quote_role(role: str) -> str:
    """``role`` as a quoted SQL identifier."""
    if not role or len(role) > 63 or "\x00" in role:
        raise CalltapeError(f"'{role[:63]}' is not a PostgreSQL role name")
    return '"' + role.replace('"', '""') + '"'


def grant(conn: Connection, role: str, version_table: str) -> None:
    """Gives ``role`` exactly what the application needs on the calltape tables: read and write rows;
    no DDL, no ownership. Refuses a role that would not be held by row-level security."""
    found = conn.execute(
        text(
            "SELECT r.rolsuper OR r.rolbypassrls, EXISTS (SELECT 1 FROM pg_tables t "
            "WHERE t.tablename = 'ct_events' AND t.schemaname = current_schema() AND t.tableowner = r.rolname) "
            "FROM pg_roles r WHERE r.rolname = :role"
        ),
        {"role": role},
    ).first()
    if found is None:
        raise CalltapeError(f"there is no PostgreSQL role '{role}': create it first (CREATE ROLE … LOGIN)")
    bypasses, owns = found
    if bypasses:
        raise CalltapeError(
            f"role '{role}' bypasses row-level security (a superuser or BYPASSRLS), so tenants would not be "
            "kept apart for it: grant to an ordinary role"
        )
    if owns:
        raise CalltapeError(f"role '{role}' owns the calltape tables: grant to a role that does not own them")
    quoted = quote_role(role)
    schema = conn.execute(text("SELECT quote_ident(current_schema())")).scalar_one()
    sequence = conn.execute(text("SELECT pg_get_serial_sequence('ct_events', 'pos')")).scalar_one()
    execute_each(
        conn,
        f"GRANT USAGE ON SCHEMA {schema} TO {quoted}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {', '.join(TABLES)} TO {quoted}",
        f"GRANT SELECT ON {version_table} TO {quoted}",
        f"GRANT USAGE, SELECT ON SEQUENCE {sequence} TO {quoted}",
    )
