"""The append-only event log (PostgreSQL in production, SQLite embedded)."""

from calltape.eventstore.append_plan import SessionInfo
from calltape.eventstore.connect import ENV_URL, default_path, open_store, resolve_url, upgrade
from calltape.eventstore.store import START, EventReader, EventStore, EventWriter, FeedPosition, StoreAdmin

__all__ = [
    "ENV_URL",
    "START",
    "EventReader",
    "EventStore",
    "EventWriter",
    "FeedPosition",
    "SessionInfo",
    "StoreAdmin",
    "default_path",
    "open_store",
    "resolve_url",
    "upgrade",
]
