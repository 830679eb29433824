"""The event log, the session summaries and the fold snapshots.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Creates the event log: events, sessions, snapshots."""
    postgres = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "ct_sessions",
        sa.Column("session", sa.Text, primary_key=True),
        sa.Column("agent", sa.Text),
        sa.Column("tenant", sa.Text),
        sa.Column("modality", sa.Text),
        sa.Column("framework", sa.Text),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("last_seq", sa.Integer, nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("first_at_ms", sa.BigInteger),
        sa.Column("last_at_ms", sa.BigInteger),
        sa.Column("started", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_index("ct_sessions_last_at", "ct_sessions", ["last_at_ms"])
    if postgres:
        # txid orders the global feed (see docs/architecture.md, "The global feed").
        op.execute(
            """
            CREATE TABLE ct_events (
                pos     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                session text    NOT NULL,
                seq     integer NOT NULL,
                id      text    NOT NULL,
                type    text    NOT NULL,
                at_ms   bigint  NOT NULL,
                agent   text,
                epoch   integer,
                data    jsonb   NOT NULL,
                txid    xid8    NOT NULL DEFAULT pg_current_xact_id(),
                CONSTRAINT ct_events_session_seq UNIQUE (session, seq),
                CONSTRAINT ct_events_session_id UNIQUE (session, id)
            )
            """
        )
        op.execute("CREATE INDEX ct_events_feed ON ct_events (txid, pos)")
    else:
        op.create_table(
            "ct_events",
            sa.Column("pos", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("session", sa.Text, nullable=False),
            sa.Column("seq", sa.Integer, nullable=False),
            sa.Column("id", sa.Text, nullable=False),
            sa.Column("type", sa.Text, nullable=False),
            sa.Column("at_ms", sa.BigInteger, nullable=False),
            sa.Column("agent", sa.Text),
            sa.Column("epoch", sa.Integer),
            sa.Column("data", sa.Text, nullable=False),
            sa.UniqueConstraint("session", "seq", name="ct_events_session_seq"),
            sa.UniqueConstraint("session", "id", name="ct_events_session_id"),
            sqlite_autoincrement=True,
        )
    op.create_table(
        "ct_snapshots",
        sa.Column("session", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("state", sa.LargeBinary, nullable=False),
        sa.Column("created_at_ms", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("session", "version", "seq"),
    )


def downgrade() -> None:
    """Drops the event log."""
    op.drop_table("ct_snapshots")
    op.drop_table("ct_events")
    op.drop_index("ct_sessions_last_at", table_name="ct_sessions")
    op.drop_table("ct_sessions")
