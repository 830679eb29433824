"""Offline: an Inworld/OpenAI Realtime session recorded by calltape (no network; events replayed)."""

import asyncio
import tempfile

from calltape.adapters.realtime import InworldEndpoint, RealtimeTap
from calltape.eventstore import open_store
from calltape.eventstore.recorder import Recorder
from calltape.runtime import CallSession

SERVER_EVENTS = [
    {"type": "input_audio_buffer.speech_started", "item_id": "u1", "audio_start_ms": 0},
    {"type": "input_audio_buffer.speech_stopped", "item_id": "u1", "audio_end_ms": 900},
    {"type": "conversation.item.input_audio_transcription.completed", "item_id": "u1", "transcript": "Hi!"},
    {"type": "response.created", "response": {"id": "resp_1"}},
    {"type": "response.output_audio_transcript.delta", "response_id": "resp_1", "item_id": "a1", "delta": "Hello!"},
    {"type": "response.done", "response": {"id": "resp_1", "status": "completed", "output": []}},
]


async def main() -> None:
    endpoint = InworldEndpoint(api_key="aWQ6c2VjcmV0", session_key="demo")
    print("connect to", endpoint.url, "with", list(endpoint.headers))  # live: websockets.connect(url, ...)
    store = await open_store(f"sqlite:///{tempfile.mkdtemp()}/demo.db")
    async with Recorder(store) as recorder:
        call = await CallSession.start(recorder, "inworld-demo", agent="concierge", framework="inworld")
        tap = RealtimeTap(call)
        for event in SERVER_EVENTS:
            tap.server_event(event)
        print(call.context("openai"))
    await store.close()


if __name__ == "__main__":
    asyncio.run(main())
