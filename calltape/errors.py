"""Every error calltape raises on purpose, in one module; each message is one readable sentence.

This is the only home of calltape's exception classes (as in httpx): every layer may import it, and it
imports nothing of calltape. Catch :class:`CalltapeError` for all of them; the tree::

    Exception
    ├── CalltapeError                  base: a user can act on it, its message is one sentence
    │   │  the event and its store
    │   ├── InvalidEvent               (also ValueError) an event that breaks the wire format
    │   ├── ConcurrencyConflict        another writer appended first (``expected_seq``)
    │   ├── FencedWrite                a writer with an older epoch (a zombie agent) appended
    │   ├── SessionNotFound            no such session (a typo, another tenant, an erased call)
    │   ├── SessionErased              a write to an erased session
    │   ├── TenantRefused              a write to another tenant's session
    │   ├── SchemaOutdated             the database schema is older or newer than this calltape
    │   ├── StoreUnavailable           the database cannot be reached (the recorder retries)
    │   │   └── DurableAppendTimeout   a durable append did not commit in time
    │   ├── RecorderFull               ``emit`` at ``max_pending``: the event was not accepted
    │   ├── RecorderClosed             ``emit`` after ``close``
    │   ├── RecorderSpilled            closing saved the unwritten events to a JSONL file
    │   ├── ImportRefused              the store refused one event of an import
    │   ├── ForkRefused                a fork into the source, a used id, or past the end
    │   │  the context
    │   ├── InvalidInstant             (also ValueError) an ``--at`` that is no seq, time or offset
    │   ├── UnknownFormat              (also ValueError) a context format calltape does not know
    │   ├── SnapshotMismatch           a snapshot of other fold rules (or damaged)
    │   │  the live call
    │   ├── Interrupted                the reply being waited on was interrupted
    │   ├── AlreadyResumed             the call already has a live resumed agent
    │   ├── EffectNotRun               a heard-first effect whose announcement the caller cut off
    │   ├── EffectUnknown              an effect that may have happened: not run again
    │   │  tools around the log
    │   ├── CheckInputError            events that cannot be checked
    │   ├── RedactionError             a redaction rule that cannot be used
    │   ├── MissingExtra               (also ImportError) an optional dependency is not installed
    │   ├── UnrecordedCall             a replayed agent called a tool the record cannot answer
    │   └── CliError                   a user error found by the CLI itself
    └── RecordedToolError              a replayed tool's recorded failure, raised again

:class:`RecordedToolError` stands for the *tool's* failure in a replay (the user's code, not calltape),
so a handler of :class:`CalltapeError` never takes it for one of calltape's own.

The old homes (``calltape.runtime``, ``calltape.projections``, ``calltape.checks``,
``calltape.eventstore.recorder``, ``.bulk``, ``.fork``, ``calltape.redaction``, ``calltape.testing.replay``)
re-export their errors from here. Turning driver errors into these is
:mod:`calltape.eventstore.errors`' work; exceptions used for control flow inside one module stay private
to it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "AlreadyResumed",
    "CalltapeError",
    "CheckInputError",
    "CliError",
    "ConcurrencyConflict",
    "DurableAppendTimeout",
    "EffectNotRun",
    "EffectUnknown",
    "FencedWrite",
    "ForkRefused",
    "ImportRefused",
    "Interrupted",
    "InvalidEvent",
    "InvalidInstant",
    "MissingExtra",
    "RecordedToolError",
    "RecorderClosed",
    "RecorderFull",
    "RecorderSpilled",
    "RedactionError",
    "SchemaOutdated",
    "SessionErased",
    "SessionNotFound",
    "SnapshotMismatch",
    "StoreUnavailable",
    "TenantRefused",
    "UnknownFormat",
    "UnrecordedCall",
]


class CalltapeError(Exception):
    """Base of every error calltape raises on purpose."""


# The event and its store ------------------------------------------------------------------------------


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


class DurableAppendTimeout(StoreUnavailable):
    """A durable append did not commit within its timeout (the database is slow or unreachable).

    ``withdrawn`` tells the outcome: ``True`` when the event was still queued and has been taken back
    (it will never be written), ``False`` when it was already being written (it commits as soon as
    the database answers; its id makes a retry harmless).
    """

    def __init__(self, timeout: float, withdrawn: bool) -> None:
        outcome = (
            "it was taken back and will not be written"
            if withdrawn
            else "it is being written and commits when the database answers"
        )
        super().__init__(f"a durable append did not commit within {timeout:g}s; {outcome}")
        self.timeout, self.withdrawn = timeout, withdrawn


class RecorderFull(CalltapeError):
    """The recorder holds ``max_pending`` unwritten events; this event was not accepted."""


class RecorderClosed(CalltapeError):
    """The recorder was closed; it accepts no more events."""


class RecorderSpilled(CalltapeError):
    """Closing gave up waiting for the database; the unwritten events were saved to a JSONL file."""

    def __init__(self, path: Path, count: int) -> None:
        super().__init__(
            f"the database stayed unreachable, so {count} unwritten event(s) were saved to {path}; "
            f"load them with `calltape import {path}`"
        )
        self.path, self.count = path, count


class ImportRefused(CalltapeError):
    """The store refused one event of an import (its rules, not its format); nothing was written.

    ``index`` is the event's position in the batch given to ``BulkImport.add``."""

    def __init__(self, index: int, cause: CalltapeError) -> None:
        super().__init__(str(cause))
        self.index = index
        self.cause = cause


class ForkRefused(CalltapeError):
    """The fork cannot be made: the new id is the source, already has events, or the seq is past the end."""


# The context ------------------------------------------------------------------------------------------


class InvalidInstant(CalltapeError, ValueError):
    """An ``--at`` value that is neither a seq, an RFC 3339 time nor ``+SECONDS``."""


class UnknownFormat(CalltapeError, ValueError):
    """A context format name calltape does not know."""


class SnapshotMismatch(CalltapeError):
    """A snapshot written by other fold rules (or damaged) cannot be restored."""


# The live call ----------------------------------------------------------------------------------------


class Interrupted(CalltapeError):
    """The reply being waited on was interrupted (barge-in, API cancel, or a dropped call)."""

    def __init__(self, reply: str | None, cause: str | None = None) -> None:
        what = f"reply '{reply}'" if reply else "the reply"
        super().__init__(f"{what} was interrupted" + (f" ({cause})" if cause else ""))
        self.reply, self.cause = reply, cause
        self.at = time.perf_counter()
        """When the interruption was taken (to measure how fast waiters were released)."""


class EffectNotRun(CalltapeError):
    """A heard-first effect (SPEC section 8) was not run: the caller barged in before the reply that
    announced it had played to its end. The guarded runner records the call as ``tool.cancelled``
    (``interrupted``, ``not_run``)."""

    def __init__(self, name: str, reply: str | None, why: str = "was interrupted") -> None:
        super().__init__(f"effect '{name}' was not run: its announcing reply '{reply}' {why}")
        self.name, self.reply = name, reply


class EffectUnknown(CalltapeError):
    """Whether an effect happened is unknown (cut off by a drop, timed out, or said so by its action):
    it is never run again automatically. The guarded runner records the call as ``tool.cancelled``
    (``effect_unknown``, ``unknown``); a reconcile hook that asks the real system can settle it.

    An action may raise it itself to say it cannot tell whether it took effect."""

    def __init__(self, name: str, why: str = "its outcome is unknown") -> None:
        super().__init__(f"effect '{name}' was not run again: {why}")
        self.name = name


class AlreadyResumed(CalltapeError):
    """The call already has a live resumed agent; resuming again would take it over."""

    def __init__(self, session: str, agent: str | None, epoch: int) -> None:
        super().__init__(
            f"session '{session}' was already resumed by agent '{agent}' (epoch {epoch}) and that agent is live; "
            "pass --take-over (take_over=True) to move the call anyway"
        )
        self.session, self.agent, self.epoch = session, agent, epoch


# Tools around the log ---------------------------------------------------------------------------------


class CheckInputError(CalltapeError):
    """Events that cannot be checked: an unreadable file, an invalid line, a mix of sessions."""


class RedactionError(CalltapeError):
    """A redaction rule cannot be used (an unknown kind, a pattern that does not compile)."""


class MissingExtra(CalltapeError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it and what needs it
    (``calltape.extras.missing_extra`` builds it)."""

    def __init__(self, extra: str, feature: str, module: str | None = None) -> None:
        self.extra, self.feature, self.module = extra, feature, module
        missing = f" ({module} is not installed)" if module else ""
        super().__init__(
            f"{feature} needs the '{extra}' extra{missing}: pip install 'calltape[{extra}]'",
            name=module,
        )


class UnrecordedCall(CalltapeError):
    """A replayed agent called a tool with arguments the recorded call never used (or more often than it
    did): the record has no output to answer with. The guarded runner gives the LLM ``{"error": …}``."""


class CliError(CalltapeError):
    """A user error found by the CLI itself (bad option value, unreadable file, …)."""


class RecordedToolError(Exception):
    """Raised in a replay to reproduce a recorded tool error (``tool.result`` with ``error: true``).

    Not a :class:`CalltapeError`: it stands for the tool's own failure."""
