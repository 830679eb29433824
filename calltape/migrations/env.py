"""Alembic environment: calltape always hands Alembic an open connection (see eventstore.migrate)."""

from __future__ import annotations

from alembic import context

from calltape.migrations import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table=VERSION_TABLE, transaction_per_migration=True)
with context.begin_transaction():
    context.run_migrations()
