"""The event log's primary key includes the session, so the same schema distributes on Citus.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

Citus shards every calltape table by ``session`` and accepts a unique constraint only when it includes
that column. ``ct_events`` was keyed by ``pos`` alone; on PostgreSQL it is now keyed by
``(session, pos)``. ``pos`` stays an identity, so it is still unique, and the global feed keeps reading
its own index (``ct_events_feed`` on ``txid, pos``). The other tables already lead with ``session``.
SQLite keeps ``pos`` as its rowid key (it is never distributed): nothing changes there.

The upgrade rebuilds one index, on a large log a few seconds per million events with writes held.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _key(columns: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE ct_events DROP CONSTRAINT ct_events_pkey, "
            f"ADD CONSTRAINT ct_events_pkey PRIMARY KEY ({columns})"
        )


def upgrade() -> None:
    """Re-keys ``ct_events`` by ``(session, pos)`` (PostgreSQL)."""
    _key("session, pos")


def downgrade() -> None:
    """Keys ``ct_events`` by ``pos`` again (only possible before the table was distributed)."""
    _key("pos")
