"""Errors a user can act on; every message is one readable sentence."""

from __future__ import annotations


class CalltapeError(Exception):
    """Base of every error calltape raises on purpose."""


class InvalidEvent(CalltapeError, ValueError):
    """An event that does not follow the wire format."""


class ConcurrencyConflict(CalltapeError):
    """Another writer appended to the session first (optimistic concurrency)."""

    def __init__(self, session: str, expected: int, actual: int) -> None:
        super().__init__(f"session '{session}' is at seq {actual}, not {expected}: another writer appended first")
        self.session, self.expected, self.actual = session, expected, actual


class FencedWrite(CalltapeError):
    """A writer holding an older epoch (a zombie agent) tried to append."""

    def __init__(self, session: str, epoch: int, current: int) -> None:
        super().__init__(f"session '{session}' is at epoch {current}; a write with epoch {epoch} was rejected")
        self.session, self.epoch, self.current = session, epoch, current


class SessionNotFound(CalltapeError):
    """The store has no session with this id (a typo, another tenant, or an erased call)."""

    def __init__(self, session: str) -> None:
        super().__init__(f"there is no session '{session}'")
        self.session = session


class SessionErased(CalltapeError):
    """The write names a session that was erased (SPEC section 6): it can never receive events again."""

    def __init__(self, session: str | None = None) -> None:
        which = f"session '{session}'" if session else "a session in this write"
        super().__init__(f"{which} was erased; an erased session cannot receive events again")
        self.session = session


class TenantRefused(CalltapeError):
    """A write names a session of another tenant than the store's (SPEC section 6): nothing was written."""

    def __init__(self, session: str | None, tenant: str | None) -> None:
        which = f"session '{session}'" if session else "a session in this write"
        store = f"a store opened for tenant '{tenant}'" if tenant else "a store that declared no tenant"
        super().__init__(f"{which} belongs to another tenant, and {store} writes only its own sessions")
        self.session, self.tenant = session, tenant


class SchemaOutdated(CalltapeError):
    """The database schema is older (or newer) than this calltape."""


class StoreUnavailable(CalltapeError):
    """The database cannot be reached; the recorder retries these."""
