"""Forking a session: its log, or the prefix up to a seq, copied into a new session id.

One implementation behind ``calltape replay SESSION --into NEW [--to N]`` and the test harness's replay
of a recorded call into a changed agent (:mod:`calltape.testing.replay`): events keep their type,
data, times, agents and epochs and get new ids; the copy is one append, so it lands whole or not at all.
"""

from __future__ import annotations

from msgspec.structs import replace

from calltape.errors import ConcurrencyConflict, ForkRefused, SessionNotFound
from calltape.events import new_event_id
from calltape.eventstore.store import EventStore

__all__ = ["ForkRefused", "fork_session"]


async def fork_session(store: EventStore, session: str, into: str, *, to_seq: int | None = None) -> int:
    """Copies ``session`` (its events up to ``to_seq``, or all of them) into the new session ``into``.

    Returns the number of events copied. Raises ``SessionNotFound``, and :class:`ForkRefused` when
    ``into`` is ``session`` or already has events, or ``to_seq`` is past the session's end.
    """
    if into == session:
        raise ForkRefused("the new session must not be the one being copied")
    info = await store.session_info(session)
    if info is None:
        raise SessionNotFound(session)
    if to_seq is not None and to_seq > info.last_seq:
        raise ForkRefused(
            f"seq {to_seq} is past the end of session '{session}', which has {info.last_seq} "
            f"event{'s' if info.last_seq != 1 else ''}"
        )
    existing = await store.session_info(into)
    if existing is not None and existing.last_seq > 0:
        raise ForkRefused(f"session '{into}' already has {existing.last_seq} events; replay needs a new session id")
    events = await store.read(session, to_seq=to_seq)
    copies = [replace(e, session=into, id=new_event_id(), seq=None) for e in events]
    try:
        await store.append(copies, expected_seq=0)
    except ConcurrencyConflict:
        raise ForkRefused(f"session '{into}' received events while the replay ran; nothing was copied") from None
    return len(copies)
