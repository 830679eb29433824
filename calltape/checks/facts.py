"""What the check rules read: the read model of the call (:mod:`calltape.projections.callrecord`).

The rules (:mod:`calltape.checks.rules`) used to have a pass of their own over the events; they now
read the same :class:`~calltape.projections.callrecord.CallRecord` as ``calltape show`` and the
timeline picture, so "included", "interrupted", the epoch and the talk-over interval mean exactly
what they mean there and in SPEC section 2: a rule can never disagree with the projection about
which reply a barge-in cancelled.

Memory is one session: the record keeps a few seqs and times per call, reply and interruption (and a
call's arguments and output); the conversation's text is in its fold.
"""

from __future__ import annotations

from collections.abc import Iterable

from calltape.events import Event
from calltape.projections.callrecord import CallRecord, read_call

SessionFacts = CallRecord
"""The name the rules (and rules users register) know the read model by."""


def collect(events: Iterable[Event], session: str | None = None) -> SessionFacts:
    """Reads the events once into the call's read model (its fold included, for the context checks)."""
    return read_call(events, session)
