"""Live reconciliation of the Realtime conversation (issue 11): a guarded call always has its one output.

The Realtime server's conversation is modelled from the events that change it (its function calls from
``response.done``, the client's ``conversation.item.create`` / ``delete``), and checked at every point
where the live model reads it (each ``response.created``) and at the end against calltape's context.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from openai.types.realtime import ConversationItemTruncateEvent, InputAudioBufferSpeechStartedEvent

from calltape.adapters.realtime import RealtimeTap
from calltape.eventstore.recorder import Recorder
from calltape.runtime import CallSession, ToolSpec
from tests.adapters.hosted_support import recorder as recorder  # the fixture
from tests.adapters.test_realtime_timeline import _assistant, _done, _id, _user


class LiveConversation:
    """The Realtime server's conversation items, as far as function calls and their outputs go."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.sent: list[dict[str, Any]] = []
        self.responses_checked = 0

    async def send(self, event: dict[str, Any]) -> None:
        """The tap's ``send``: applies one client event as the server would."""
        self.sent.append(event)
        if event["type"] == "conversation.item.create":
            item = event["item"]
            after = event.get("previous_item_id")
            ids = [i.get("id") for i in self.items]
            self.items.insert(ids.index(after) + 1 if after in ids else len(self.items), item)
        elif event["type"] == "conversation.item.delete":
            self.items = [i for i in self.items if i.get("id") != event["item_id"]]

    def server(self, tap: RealtimeTap, event: Any) -> list[Any]:
        kind = event.type if hasattr(event, "type") else event["type"]
        if kind == "response.created":
            self.check()  # the model reads the conversation now
            self.responses_checked += 1
        if kind == "response.done" and event.response.status == "completed":
            self.items += [o.model_dump(exclude_none=True) for o in event.response.output or []]
        return tap.server_event(event)

    def outputs(self) -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        for item in self.items:
            if item["type"] == "function_call_output":
                found.setdefault(item["call_id"], []).append(json.loads(item["output"]))
        return found

    def check(self) -> None:
        outputs = self.outputs()
        for item in self.items:
            if item["type"] == "function_call":
                assert len(outputs.get(item["call_id"], [])) == 1, f"{item['call_id']} in {self.items}"


@pytest.mark.parametrize("policy", ["finish", "cancel"])
async def test_a_call_landing_after_a_barge_in_has_its_one_real_output_live(recorder: Recorder, policy: str) -> None:
    call = await CallSession.start(recorder, f"rt-live-{policy}", agent="host", instructions="Be brief.")
    live = LiveConversation()
    tap = RealtimeTap(call, send=live.send)
    release, entered = asyncio.Event(), asyncio.Event()

    async def book(people: int) -> dict[str, Any]:
        entered.set()
        await release.wait()
        return {"booked": True, "people": people}

    for e in _user("u1", "A table for two, please."):
        live.server(tap, e)
    for e in _assistant("resp_1", "a1", "Let me book that for you.", 2000):
        live.server(tap, e)
    (fc,) = live.server(tap, _done("resp_1", "completed", [("c1", "book", '{"people": 2}')]))
    spec = ToolSpec(on_interrupt="cancel") if policy == "cancel" else None
    task = asyncio.create_task(tap.run_tool(fc, lambda: book(**fc.parsed_arguments()), spec=spec))
    await asyncio.wait_for(entered.wait(), 5)  # tool.started committed: the body runs
    assert live.sent == []  # nobody has spoken: nothing to reconcile yet

    # the user barges in while the booking runs; the server will answer this turn by itself
    live.server(
        tap,
        InputAudioBufferSpeechStartedEvent(
            type="input_audio_buffer.speech_started", event_id=_id("e"), item_id="u2", audio_start_ms=2600
        ),
    )
    truncate = ConversationItemTruncateEvent(
        type="conversation.item.truncate", item_id="a1", content_index=0, audio_end_ms=600
    )
    tap.client_event(truncate)
    await asyncio.sleep(0.01)
    if policy == "finish":
        assert live.outputs() == {"c1": [{"status": "in_progress"}]}  # calltape's own output for a running call
        assert live.items[0]["id"] == "it_c1" and live.items[1]["call_id"] == "c1"  # right after its call
    for e in _user("u2", "Actually, make it three.")[1:]:
        live.server(tap, e)
    for e in _assistant("resp_2", "a2", "Sure.", 500):  # response.created: checked
        live.server(tap, e)
    live.server(tap, _done("resp_2", "completed"))

    release.set()
    outcome = await task  # returns once the real output is in the live conversation
    live.check()
    await recorder.flush()
    expected = {
        i["call_id"]: json.loads(i["output"])
        for i in (e["item"] for e in call.context("realtime"))
        if i["type"] == "function_call_output"
    }
    assert {k: v[0] for k, v in live.outputs().items()} == expected
    if policy == "finish":
        assert outcome.status == "completed"
        assert expected == {"c1": {"booked": True, "people": 2}}
        # the placeholder was replaced, never doubled: delete, then create after the call's item
        kinds = [e["type"] for e in live.sent]
        assert kinds == ["conversation.item.create", "conversation.item.delete", "conversation.item.create"]
        assert live.sent[1]["item_id"] == live.sent[0]["item"]["id"]
        assert live.sent[2]["previous_item_id"] == "it_c1"
        assert tap.live_output_item("c1") == live.sent[2]["item"]["id"]
    else:
        assert outcome.status != "completed"
        assert expected["c1"]["status"] in ("cancelled", "unknown")
    # the next response the app asks for sees the same tool output as calltape's context
    for e in _assistant("resp_3", "a3", "Done.", 300):
        live.server(tap, e)
    assert live.responses_checked == 3


async def test_a_call_without_a_barge_in_gets_one_output_and_no_placeholder(recorder: Recorder) -> None:
    call = await CallSession.start(recorder, "rt-live-plain", agent="host")
    live = LiveConversation()
    tap = RealtimeTap(call, send=live.send)
    for e in _user("u1", "What time is it?"):
        live.server(tap, e)
    for e in _assistant("resp_1", "a1", "Checking.", 500):
        live.server(tap, e)
    (fc,) = live.server(tap, _done("resp_1", "completed", [("c1", "clock", "{}")]))

    async def clock() -> dict[str, str]:
        return {"time": "noon"}

    await tap.run_tool(fc, clock)
    assert [e["type"] for e in live.sent] == ["conversation.item.create"]  # one output, no placeholder
    assert live.outputs() == {"c1": [{"time": "noon"}]}
    live.check()
    await tap.reconcile()  # nothing due
    assert len(live.sent) == 1

    quiet = RealtimeTap(await CallSession.start(recorder, "rt-live-quiet", agent="host"))
    await quiet.reconcile()  # without send the application sends outputs itself (output_item)
    assert quiet.live_output_item("c1") is None
