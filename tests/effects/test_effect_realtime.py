"""The effect API from a tool the OpenAI Realtime tap runs (``RealtimeTap.run_tool``): the same
``calltape.effect`` call as on every other adapter; the model asking again under a new call id gets the
recorded output, and the action ran once."""

from __future__ import annotations

import asyncio
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


AUDIO_MS = 400  # the announcement's audio: the server sends it at once, the client plays it for 0.4 s


async def _announce_and_ask(tap: RealtimeTap, n: int) -> Any:
    for e in _user(f"u{n}", "Charge my order, please."):
        tap.server_event(e)
    for e in _assistant(f"resp_{n}", f"a{n}", "Charging 40 dollars for order seven now.", AUDIO_MS):
        tap.server_event(e)
    (fc,) = tap.server_event(_done(f"resp_{n}", "completed", [(f"c{n}", "charge", "{}")]))
    return fc


async def test_heard_first_waits_for_the_audio_to_play_not_for_response_done(recorder: Recorder) -> None:
    """The default playout ("response"): the server's ``response.done`` comes long before the client has
    played the audio; a heard-first effect waits for the audio's length from its first delta."""
    call = await CallSession.start(recorder, "rt-heard", agent="host")
    tap = RealtimeTap(call)
    charged_at: list[float] = []
    loop = asyncio.get_running_loop()

    async def charge() -> dict[str, Any]:
        charged_at.append(loop.time())
        return {"charged": 40}

    asked = loop.time()
    fc = await _announce_and_ask(tap, 1)
    outcome = await tap.run_tool(fc, lambda: calltape.effect("charge", "order-7", charge, heard=True))
    assert outcome.status == "completed" and len(charged_at) == 1
    assert charged_at[0] - asked >= AUDIO_MS / 1000 * 0.9  # not at response.done
    await call.end()
    await recorder.flush()
    events = await recorder.store.read("rt-heard")
    ended = next(e.seq for e in events if e.type == "agent.speech.ended")
    started = next(e.seq for e in events if e.type == "tool.effect")
    assert ended < started and check_events(events) == []


async def test_a_truncate_while_the_audio_plays_means_not_run(recorder: Recorder) -> None:
    """The client cuts the announcement (``conversation.item.truncate``) after the server said
    ``response.done``: the heard-first effect is not run, and the rules agree."""
    call = await CallSession.start(recorder, "rt-cut", agent="host")
    tap = RealtimeTap(call)
    charges: list[int] = []

    async def charge() -> dict[str, Any]:
        charges.append(40)
        return {"charged": 40}

    fc = await _announce_and_ask(tap, 1)
    running = asyncio.ensure_future(tap.run_tool(fc, lambda: calltape.effect("charge", "order-7", charge, heard=True)))
    await asyncio.sleep(AUDIO_MS / 1000 / 4)
    tap.client_event({"type": "conversation.item.truncate", "item_id": "a1", "content_index": 0, "audio_end_ms": 100})
    outcome = await running
    assert charges == [] and outcome.status == "cancelled"
    await call.end()
    await recorder.flush()
    events = await recorder.store.read("rt-cut")
    assert [e.data["outcome"] for e in events if e.type == "tool.cancelled"] == ["not_run"]
    assert not [e for e in events if e.type == "tool.effect"]
    assert check_events(events) == []
