"""The effect API from a tool the OpenAI Realtime tap runs (``RealtimeTap.run_tool``): the same
``calltape.effect`` call as on every other adapter; the model asking again under a new call id gets the
recorded output, and the action ran once."""

from __future__ import annotations

from typing import Any

import calltape
from calltape.adapters.realtime import RealtimeTap
from calltape.checks import check_events
from calltape.eventstore.recorder import Recorder
from calltape.runtime import CallSession
from tests.adapters.hosted_support import recorder as recorder  # the fixture
from tests.adapters.test_realtime_timeline import _assistant, _done, _user


async def test_a_realtime_tool_books_once_across_call_ids(recorder: Recorder) -> None:
    call = await CallSession.start(recorder, "rt-effect", agent="host")
    tap = RealtimeTap(call)
    bookings: list[int] = []

    async def book(people: int) -> dict[str, Any]:
        bookings.append(people)
        return {"booked": True, "people": people}

    outputs = []
    for n in (1, 2):  # the model asks, is cut off, and asks again under a new call id
        for e in _user(f"u{n}", "A table for two, please."):
            tap.server_event(e)
        for e in _assistant(f"resp_{n}", f"a{n}", "Booking it.", 500):
            tap.server_event(e)
        (fc,) = tap.server_event(_done(f"resp_{n}", "completed", [(f"c{n}", "book", '{"people": 2}')]))
        outcome = await tap.run_tool(fc, lambda: calltape.effect("book", "table-2-at-8", lambda: book(2)))
        outputs.append(outcome.output)
    await call.end()
    await recorder.flush()
    assert bookings == [2] and outputs[0] == outputs[1] == {"booked": True, "people": 2}
    events = await recorder.store.read("rt-effect")
    assert [(e.data["call"], e.data["phase"]) for e in events if e.type == "tool.effect"] == [
        ("c1", "started"),
        ("c1", "done"),
    ]
    assert check_events(events) == []
