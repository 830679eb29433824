"""An index of the event log by session and type, for the reads that want a few types of a long call.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28

The effect API (SPEC section 8) reads a session's ``tool.effect`` events each time a tool asks, and again
while another run holds the claim: on the voice loop's path. Filtered by type on ``(session, seq)``
alone, the database still visits every row of the call (a one-hour call is about 50,000): 10 ms of
server time per read. ``ct_events_session_type`` on ``(session, type, seq)`` finds them directly, already
in seq order. Same index on PostgreSQL, Citus (created on the coordinator, it reaches every shard) and
SQLite.

The upgrade builds one index, on a large log a few seconds per million events with writes held.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Adds ``ct_events_session_type``."""
    op.create_index("ct_events_session_type", "ct_events", ["session", "type", "seq"])


def downgrade() -> None:
    """Drops ``ct_events_session_type``."""
    op.drop_index("ct_events_session_type", table_name="ct_events")
