"""Alembic environment: calltape always hands Alembic an open connection (see eventstore.migrate)."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
version_table = context.config.attributes["version_table"]
context.configure(connection=connection, version_table=version_table, transaction_per_migration=True)
with context.begin_transaction():
    context.run_migrations()
