"""``calltape.effect`` from a guarded tool of the OpenAI Realtime API tap (SPEC section 8).

Heard first needs someone who knows when the caller heard the announcement out: the app's player
(``playout="client"``: :meth:`RealtimeTap.playout_finished`) or the server's output audio buffer
(``playout="output_audio_buffer"``, WebRTC/SIP). With the default ``playout="response"`` a reply counts
as heard when its response completes, before the audio has played, so heard first cannot wait for it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from openai.types.realtime import ConversationItemTruncateEvent

import calltape
from calltape.adapters.realtime import FunctionCall, Playout, RealtimeTap
from calltape.checks import check_events
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.runtime import CallSession
from tests.adapters.hosted_support import recorder as recorder  # the fixture
from tests.adapters.test_realtime_timeline import _assistant, _done

ANNOUNCE = "I am charging 40 dollars to your card for order seven now."


def announce(tap: RealtimeTap, rid: str, call_id: str) -> FunctionCall:
    for e in _assistant(rid, f"a_{rid}", ANNOUNCE, 2000):
        tap.server_event(e)
    (fc,) = tap.server_event(_done(rid, "completed", [(call_id, "charge_card", '{"order": "order-7"}')]))
    return fc


def heard_out(tap: RealtimeTap, rid: str) -> None:
    if tap.playout == "client":
        tap.playout_finished(rid)
    else:
        tap.server_event({"type": "output_audio_buffer.stopped", "response_id": rid})


def cut(tap: RealtimeTap, rid: str) -> None:
    if tap.playout == "client":
        truncate = ConversationItemTruncateEvent(
            type="conversation.item.truncate", item_id=f"a_{rid}", content_index=0, audio_end_ms=600
        )
        tap.client_event(truncate)
    else:
        tap.server_event({"type": "output_audio_buffer.cleared", "response_id": rid})


async def events_of(recorder: Recorder, store: EventStore, session_id: str) -> list[Any]:
    await recorder.flush()
    return list(await store.read(session_id))


def effect_rules(events: list[Any]) -> set[str]:
    return {v.rule for v in check_events(events) if v.rule.endswith("-effect")}


@pytest.mark.parametrize("playout", ["client", "output_audio_buffer"])
async def test_heard_first_waits_for_the_playout_the_tap_is_told(
    recorder: Recorder, store: EventStore, playout: Playout
) -> None:
    call = await CallSession.start(recorder, f"rt-effect-{playout}", agent="billing", instructions="Be brief.")
    tap = RealtimeTap(call, playout=playout)
    charges: list[int] = []

    async def bank() -> dict[str, int]:
        charges.append(40)
        return {"charged": 40}

    async def charge_card(order: str) -> dict[str, int]:
        result: dict[str, int] = await calltape.effect("charge", order, bank, heard=True)
        return result

    def run(fc: FunctionCall) -> asyncio.Task[Any]:
        return asyncio.create_task(tap.run_tool(fc, lambda: charge_card(**fc.parsed_arguments())))

    first = run(announce(tap, "r1", "c1"))
    await asyncio.sleep(0.2)  # the caller is still hearing the announcement
    assert charges == []
    cut(tap, "r1")  # "no, wait!"
    assert (await asyncio.wait_for(first, 5)).status == "cancelled"

    second = run(announce(tap, "r2", "c2"))  # asked again under a new call id, and heard out
    await asyncio.sleep(0.1)
    assert charges == []
    heard_out(tap, "r2")
    assert (await asyncio.wait_for(second, 5)).output == {"charged": 40}

    third = run(announce(tap, "r3", "c3"))  # once more: answered from the log
    heard_out(tap, "r3")
    assert (await asyncio.wait_for(third, 5)).output == {"charged": 40}

    events = await events_of(recorder, store, call.session_id)
    assert charges == [40]
    cancelled = [e.data for e in events if e.type == "tool.cancelled"]
    assert [(c["call"], c["reason"], c["outcome"]) for c in cancelled] == [("c1", "interrupted", "not_run")]
    assert [(e.data["call"], e.data["phase"]) for e in events if e.type == "tool.effect"] == [
        ("c2", "started"),
        ("c2", "done"),
    ]
    assert effect_rules(events) == set()


async def test_a_tool_charging_at_once_and_recording_it_by_hand_is_caught(
    recorder: Recorder, store: EventStore
) -> None:
    call = await CallSession.start(recorder, "rt-effect-by-hand", agent="billing", instructions="Be brief.")
    tap = RealtimeTap(call, playout="client")
    charges: list[int] = []

    def body(call_id: str) -> Any:
        async def charge_card() -> dict[str, int]:
            base = {"call": call_id, "name": "charge", "key": "order-7"}
            call.emit("tool.effect", {**base, "phase": "started", "heard": True})
            charges.append(40)
            call.emit("tool.effect", {**base, "phase": "done", "output": {"charged": 40}})
            return {"charged": 40}

        return charge_card

    await tap.run_tool(announce(tap, "r1", "c1"), body("c1"))
    cut(tap, "r1")
    await tap.run_tool(announce(tap, "r2", "c2"), body("c2"))
    events = await events_of(recorder, store, call.session_id)
    assert charges == [40, 40]
    assert effect_rules(events) == {"unheard-effect", "double-effect"}
