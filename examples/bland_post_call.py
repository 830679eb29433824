"""Bland: turn a post-call webhook into a calltape session (offline, embedded SQLite in a temp dir).

Bland reports a call after it ended (``transcripts[]``), so the session is marked reconstructed:
it has what was said, not the live timing of barge-ins. Redelivered webhooks append nothing.

    python examples/bland_post_call.py
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from calltape.adapters.bland import bland_events
from calltape.eventstore import open_store
from calltape.projections import build_context, render

WEBHOOK = {  # the shape Bland POSTs to your webhook URL after the call
    "call_id": "bland-example-1",
    "started_at": "2026-11-22T10:00:00.000Z",
    "end_at": "2026-11-22T10:00:40.000Z",
    "completed": True,
    "call_ended_by": "USER",
    "transcripts": [
        {
            "id": 1,
            "created_at": "2026-11-22T10:00:01.000Z",
            "text": "Hi, this is Ava from Bistro.",
            "user": "assistant",
        },
        {"id": 2, "created_at": "2026-11-22T10:00:05.000Z", "text": "Can I move my booking?", "user": "user"},
        {"id": 3, "created_at": "2026-11-22T10:00:06.000Z", "text": "Looked up BK-1042", "user": "agent-action"},
        {"id": 4, "created_at": "2026-11-22T10:00:09.000Z", "text": "Sure, to which day?", "user": "assistant"},
        {"id": 5, "created_at": "2026-11-22T10:00:12.000Z", "text": "Friday at eight.", "user": "user"},
    ],
}


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(f"sqlite:///{Path(tmp) / 'calltape.db'}")
        try:
            await store.append(bland_events(WEBHOOK))  # attach: one line in your webhook handler
            await store.append(bland_events(WEBHOOK))  # Bland retried: nothing new is written
            events = await store.read("bland-example-1")
            started = events[0].data
            print(f"events stored: {len(events)} (reconstructed: {started['metadata']['reconstructed']})")
            for message in render((await build_context(store, "bland-example-1")).native(), "openai"):
                print(f"  {message['role']:9} {message.get('content')!r}")
        finally:
            await store.close()


if __name__ == "__main__":
    asyncio.run(main())
