"""Tombstones of erased sessions (SPEC section 6): id, time and event count, never content.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


# The guard lives in the database, beside the session summaries: every write path (the store's append,
# the recorder, imports, the receiver, a user's own SQL) creates the session's summary row first, so no
# path can recreate an erased session. Existing sessions pay one primary-key probe per append batch.
_PG_GUARD = """
CREATE FUNCTION ct_refuse_erased() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ct_tombstones WHERE session = NEW.session) THEN
        RAISE EXCEPTION 'calltape: session erased' USING ERRCODE = 'P0001', HINT = 'calltape-erased';
    END IF;
    RETURN NEW;
END $$
"""
_PG_TRIGGER = (
    "CREATE TRIGGER ct_sessions_not_erased BEFORE INSERT ON ct_sessions "
    "FOR EACH ROW EXECUTE FUNCTION ct_refuse_erased()"
)
_SQLITE_TRIGGER = """
CREATE TRIGGER ct_sessions_not_erased BEFORE INSERT ON ct_sessions
WHEN EXISTS (SELECT 1 FROM ct_tombstones WHERE session = NEW.session)
BEGIN SELECT RAISE(ABORT, 'calltape: session erased'); END
"""


def upgrade() -> None:
    """Adds the tombstones and the trigger that refuses a session id once it has one."""
    op.create_table(
        "ct_tombstones",
        sa.Column("session", sa.Text, primary_key=True),
        sa.Column("erased_at_ms", sa.BigInteger, nullable=False),
        sa.Column("events", sa.Integer, nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_GUARD)
        op.execute(_PG_TRIGGER)
    else:
        op.execute(_SQLITE_TRIGGER)


def downgrade() -> None:
    """Removes the guard and the tombstones (erased sessions could then be written again)."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER ct_sessions_not_erased ON ct_sessions")
        op.execute("DROP FUNCTION ct_refuse_erased()")
    else:
        op.execute("DROP TRIGGER ct_sessions_not_erased")
    op.drop_table("ct_tombstones")
