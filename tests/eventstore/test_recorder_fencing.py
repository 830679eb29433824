"""Writers that carry no epoch are fenced (issue 16): a recorder's session tape is the call's first writer
(epoch 1) unless told otherwise, so once the call is resumed its events go to ``on_rejected``, never into
the resumed call, never retried; ``epoch=None`` is the explicit opt-out."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from calltape.errors import CalltapeError, FencedWrite
from calltape.events import Event
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.runtime import resume

AFTER_RESUME = 11


async def _resumed_call(store: EventStore, session: str) -> None:
    rec = await Recorder(store).start()
    try:
        tape = rec.session(session, agent="triage")
        tape.emit("session.started", {"agent": "triage"})
        tape.emit("user.text", {"text": "hello"})
        await tape.append("session.dropped", {"reason": "agent lost"})
    finally:
        await rec.close()
    plan = await resume(store, session, "rescue")
    assert plan.epoch == 2


async def test_a_tape_without_an_epoch_is_refused_after_a_resume(store: EventStore, session_id: str) -> None:
    await _resumed_call(store, session_id)
    before = (await store.session_info(session_id)).last_seq  # type: ignore[union-attr]
    refused: list[tuple[Event, CalltapeError]] = []

    def on_rejected(events: Sequence[Event], error: CalltapeError) -> None:
        refused.extend((e, error) for e in events)

    rec = await Recorder(store, on_rejected=on_rejected, retry_initial=0.01).start()
    try:
        zombie = rec.session(session_id, agent="triage")  # no epoch given: the call's first writer
        for k in range(AFTER_RESUME - 1):
            zombie.emit("user.text", {"text": f"late {k}"})
        durable = asyncio.ensure_future(zombie.append("user.text", {"text": "late durable"}))
        await asyncio.wait_for(rec.flush(), 20)
        error = await asyncio.wait_for(asyncio.gather(durable, return_exceptions=True), 20)
        assert isinstance(error[0], FencedWrite)
        # none of the 11 writes got in; each one reached on_rejected once, as fenced
        assert (await store.session_info(session_id)).last_seq == before  # type: ignore[union-attr]
        assert len(refused) == AFTER_RESUME and rec.stats.rejected == AFTER_RESUME
        assert all(isinstance(err, FencedWrite) and err.current == 2 and err.epoch == 1 for _, err in refused)
        assert rec.stats.retries == 0  # a verdict, not an outage: nothing retried

        resumed = rec.session(session_id, agent="rescue", epoch=2)  # the new agent carries its epoch
        unfenced = rec.session(session_id, agent="ops", epoch=None)  # the explicit opt-out
        await resumed.append("user.text", {"text": "after resume"})
        note = await unfenced.append("x.note", {"text": "operator note"})
        assert note.epoch is None and note.seq == before + 2
    finally:
        await asyncio.wait_for(rec.close(), 20)
    assert len(refused) == AFTER_RESUME


async def test_a_tape_records_its_epoch(store: EventStore, session_id: str) -> None:
    rec = await Recorder(store).start()
    try:
        stored = await rec.session(session_id, agent="a").append("session.started", {"agent": "a"})
    finally:
        await rec.close()
    assert stored.epoch == 1
