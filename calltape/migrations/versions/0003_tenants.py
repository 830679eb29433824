"""Tenants kept apart (SPEC section 6): row-level security on every calltape table (PostgreSQL).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

Upgrades a v0.1 database in place: existing sessions keep the tenant their ``session.started`` gave
them; tombstones written before this revision belong to no tenant (the erasure guard still refuses
their ids for everyone). On SQLite only the tombstones' tenant column is added: calltape filters there.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TABLES = ("ct_sessions", "ct_events", "ct_snapshots", "ct_tombstones")

# The connection's tenant, '' when it declared none (tenant names are never empty); sessions without
# a tenant form the group of ''.
_OWN_ROW = "coalesce(tenant, '') = coalesce(current_setting('calltape.tenant', true), '')"
# Events and snapshots belong to a session the connection can see: the subquery is itself under
# ct_sessions' policy, so one tenant can neither read nor add rows under another tenant's session id.
_OWN_SESSION = "EXISTS (SELECT 1 FROM ct_sessions s WHERE s.session = {table}.session)"


def _policies() -> list[str]:
    """FORCE makes the tables' owner obey the policies too, except on ct_tombstones: the erasure guard
    (a SECURITY DEFINER trigger run as the owner) must see every tenant's tombstones, or one tenant
    could reuse the id of another tenant's erased session. Tombstones hold no content."""
    statements: list[str] = []
    for table in TABLES:
        check = _OWN_ROW if table in ("ct_sessions", "ct_tombstones") else _OWN_SESSION.format(table=table)
        statements += [
            f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
            f"CREATE POLICY ct_tenant ON {table} USING ({check}) WITH CHECK ({check})",
        ]
        if table != "ct_tombstones":
            statements.append(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
    return statements


def upgrade() -> None:
    """Adds the tombstones' tenant and, on PostgreSQL, the policies keyed on ``calltape.tenant``."""
    op.add_column("ct_tombstones", sa.Column("tenant", sa.Text))
    if op.get_bind().dialect.name != "postgresql":
        return
    # The guard of migration 0002 runs as the tables' owner, so it sees every tenant's tombstones; its
    # search path is fixed to the migration's (what ``FROM CURRENT`` does, spelled out because Citus
    # propagates the function to its workers and refuses ``FROM CURRENT`` there).
    path = op.get_bind().exec_driver_sql("SELECT current_setting('search_path')").scalar()
    op.execute(f"ALTER FUNCTION ct_refuse_erased() SECURITY DEFINER SET search_path TO {path}")
    for statement in _policies():
        op.execute(statement)


def downgrade() -> None:
    """Removes the policies and the tombstones' tenant (tenants are then a label again)."""
    if op.get_bind().dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"DROP POLICY ct_tenant ON {table}")
            op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
            op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
        op.execute("ALTER FUNCTION ct_refuse_erased() SECURITY INVOKER RESET search_path")
    with op.batch_alter_table("ct_tombstones") as batch:
        batch.drop_column("tenant")
