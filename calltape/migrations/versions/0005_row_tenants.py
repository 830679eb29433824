"""Events and snapshots carry their session's tenant, so each row is held by its own columns.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

Citus accepts only row-level-security policies that read the row itself, and those of ``ct_events`` and
``ct_snapshots`` (migration 0003) read ``ct_sessions`` in a subquery. Both tables gain a ``tenant``
column, copied from the session's summary row by every write and here backfilled for existing rows; on
Citus the policies then compare that column (see :mod:`calltape.eventstore.citus`). A single PostgreSQL
keeps migration 0003's policies (they also refuse rows under another tenant's session id), and SQLite
gains the columns too: one schema everywhere.

The backfill rewrites every event row once (on a large log, about as long as an import of it), with
writes held. Row-level security is lifted for the tables' owner meanwhile (``FORCE`` holds it to one
tenant at a time) and restored before the transaction commits.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TABLES = ("ct_events", "ct_snapshots")
_FORCED = "SELECT relname FROM pg_class WHERE relforcerowsecurity AND relname = ANY(:t) AND relkind IN ('r', 'p')"


def upgrade() -> None:
    """Adds ``tenant`` to ``ct_events`` and ``ct_snapshots`` and copies it from ``ct_sessions``."""
    for table in TABLES:
        op.add_column(table, sa.Column("tenant", sa.Text))
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        for table in TABLES:
            op.execute(
                f"UPDATE {table} SET tenant = (SELECT s.tenant FROM ct_sessions s WHERE s.session = {table}.session)"
            )
        return
    # Only this transaction's own ALTERs see the lifted FORCE; other connections wait on the table lock.
    forced = list(bind.execute(sa.text(_FORCED), {"t": ["ct_sessions", *TABLES]}).scalars())
    for table in forced:
        op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
    for table in TABLES:
        op.execute(
            f"UPDATE {table} t SET tenant = s.tenant FROM ct_sessions s "
            "WHERE s.session = t.session AND s.tenant IS NOT NULL"
        )
    for table in forced:
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")


def downgrade() -> None:
    """Drops the columns (on Citus only before the per-row policies that read them: see ``distribute``)."""
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("tenant")
