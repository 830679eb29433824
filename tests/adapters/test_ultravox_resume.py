"""A dropped Ultravox call resumed as a new Ultravox call seeded from calltape's context: the create-call
body's ``initialMessages`` are the context ``calltape context --format ultravox`` gives after the resume
(heard text, every settled tool outcome), its ``systemPrompt`` the call's, and the new call names the
session it continues."""

from __future__ import annotations

import json

from calltape.adapters.postcall import postcall_events
from calltape.adapters.ultravox import RESUMED_FROM, initial_messages, resume_call_body
from calltape.checks.context import context_problems
from calltape.eventstore import EventStore
from calltape.projections import build_context, fold_events, render
from calltape.runtime import resume
from tests.adapters import postcall_payloads as p


async def test_a_dropped_call_continues_as_a_new_ultravox_call(store: EventStore, session_id: str) -> None:
    sid = f"{session_id}-uv"
    await store.append(postcall_events("ultravox", p.ultravox_saved(sid))[0])
    plan = await resume(store, sid, "bistro-2")
    body = resume_call_body(plan.context, session=sid)
    after = (await build_context(store, sid)).native()
    assert body["initialMessages"] == render(after, "ultravox")  # the same context as calltape's
    assert body["systemPrompt"] == "You book tables." and body["metadata"] == {RESUMED_FROM: sid}
    assert [(m["role"], m.get("invocationId")) for m in body["initialMessages"]] == [
        ("MESSAGE_ROLE_AGENT", None),
        ("MESSAGE_ROLE_USER", None),
        ("MESSAGE_ROLE_TOOL_CALL", "uv-inv-1"),
        ("MESSAGE_ROLE_TOOL_RESULT", "uv-inv-1"),
        ("MESSAGE_ROLE_AGENT", None),
        ("MESSAGE_ROLE_USER", None),
        ("MESSAGE_ROLE_TOOL_CALL", "uv-inv-2"),
        ("MESSAGE_ROLE_TOOL_RESULT", "uv-inv-2"),
    ]
    settled = body["initialMessages"][-1]
    # the reminder may or may not have been sent: the new call is told so, never that it was done
    assert json.loads(settled["text"])["status"] == "unknown" and settled["toolName"] == "send_reminder"
    assert json.loads(body["initialMessages"][3]["text"]) == {"confirmation": "BK-42"}
    assert [t.decision for t in plan.tools] == ["unknown"]
    assert context_problems(after) == []

    # the new call, when it reports, is a session of its own that names the one it continues
    new_call = {**p.ultravox_call(f"{sid}-2", end_reason="hangup"), "metadata": body["metadata"]}
    events = postcall_events("ultravox", {"call": new_call, "messages": {"results": []}})[0]
    assert events[0].data["metadata"]["ultravox_metadata"] == {RESUMED_FROM: sid}


def test_an_interrupted_reply_seeds_what_was_heard() -> None:
    events = postcall_events("elevenlabs", p.elevenlabs_webhook())[0]
    native = fold_events(events, events[0].session).native()
    agent_lines = [m["text"] for m in initial_messages(native) if m["role"] == "MESSAGE_ROLE_AGENT"]
    assert p.EL_HEARD in agent_lines and p.EL_GENERATED not in agent_lines
    assert "systemPrompt" not in resume_call_body(native)  # the conversation carried no prompt
