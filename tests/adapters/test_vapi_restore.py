"""Vapi after a restart: the ingest continues from the fold of the stored log, event for event."""

from __future__ import annotations

from typing import Any

from calltape.adapters.vapi import VapiIngest
from calltape.eventstore import EventStore
from calltape.projections import build_context

CALL = {"id": "vapi-restart", "type": "webCall"}


def msg(kind: str, **fields: Any) -> dict[str, Any]:
    return {"message": {"type": kind, "call": CALL, **fields}}


MESSAGES: list[dict[str, Any]] = [
    msg("status-update", status="in-progress", assistant={"name": "host"}),
    msg("speech-update", role="user", status="started"),
    msg("transcript", role="user", transcriptType="partial", transcript="Book a"),
    msg("transcript", role="user", transcriptType="final", transcript="Book a table for two."),
    msg("speech-update", role="user", status="stopped"),
    msg("model-output", output="One moment "),
    msg("model-output", output="while I check."),
    msg("tool-calls", toolCallList=[{"id": "tc-1", "function": {"name": "book", "arguments": '{"people": 2}'}}]),
    msg("speech-update", role="assistant", status="started"),
    msg("transcript", role="assistant", transcriptType="final", transcript="One moment"),
    msg("user-interrupted"),
    msg("speech-update", role="assistant", status="stopped"),
    msg("transcript", role="user", transcriptType="final", transcript="Make it three."),
    msg("model-output", output="Three it is."),
    msg("speech-update", role="assistant", status="started"),
    msg("transcript", role="assistant", transcriptType="final", transcript="Three it is."),
    msg("speech-update", role="assistant", status="stopped"),
    msg("status-update", status="ended", endedReason="customer-ended-call"),
    msg("model-output", output="after the end: ignored"),
    msg("end-of-call-report", endedReason="customer-ended-call"),
]


async def _ingest(store: EventStore, ingest: VapiIngest, messages: list[dict[str, Any]], first: int = 0) -> None:
    for i, body in enumerate(messages, start=first):
        await store.append(ingest.events({"message": {**body["message"], "timestamp": 1_000 + i}}))


async def test_a_restarted_ingest_writes_what_an_uninterrupted_one_does(store: EventStore) -> None:
    session = CALL["id"]
    for split in range(1, len(MESSAGES)):
        one = f"{session}-whole-{split}"
        two = f"{session}-split-{split}"
        await _ingest(store, VapiIngest(session_prefix=f"{one}:"), MESSAGES)
        await _ingest(store, VapiIngest(session_prefix=f"{two}:"), MESSAGES[:split])
        restarted = VapiIngest(session_prefix=f"{two}:")
        info = await store.session_info(f"{two}:{session}")
        assert info is not None
        restarted.restore(
            f"{two}:{session}", await build_context(store, f"{two}:{session}"), ended=info.status == "ended"
        )
        await _ingest(store, restarted, MESSAGES[split:], split)
        whole = [(e.type, e.data, e.at_ms) for e in await store.read(f"{one}:{session}")]
        resumed = [(e.type, e.data, e.at_ms) for e in await store.read(f"{two}:{session}")]
        assert resumed == whole, f"restart after message {split}"
    types = [t for t, _, _ in whole]
    assert types.count("agent.reply.started") == 2
    assert types[-1] == "session.ended" and types.count("session.ended") == 1
    context = (await build_context(store, f"{one}:{session}")).render("openai")
    assert [m["role"] for m in context] == ["system", "user", "assistant", "tool", "user", "assistant"][
        0 if context[0]["role"] == "system" else 1 :
    ]
