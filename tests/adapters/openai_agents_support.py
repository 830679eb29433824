"""The OpenAI Agents SDK's own scripted realtime model as the network stand-in: the SDK's session,
runner, agent and tool classes are real; ``ScriptedRealtimeModel`` (``agents.realtime.testing``)
answers each send with the normalized events the OpenAI transport would emit for the server's reply.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

from agents.realtime.items import (
    AssistantAudio,
    AssistantMessageItem,
    InputText,
    RealtimeToolCallItem,
    UserMessageItem,
)
from agents.realtime.model_events import (
    RealtimeModelAudioEvent,
    RealtimeModelAudioInterruptedEvent,
    RealtimeModelEvent,
    RealtimeModelItemUpdatedEvent,
    RealtimeModelRawServerEvent,
    RealtimeModelToolCallEvent,
    RealtimeModelTranscriptDeltaEvent,
    RealtimeModelTurnEndedEvent,
    RealtimeModelTurnStartedEvent,
)
from agents.realtime.model_inputs import RealtimeModelSendEvent, RealtimeModelSendToolOutput
from agents.realtime.testing import ScriptedRealtimeModel

BYTES_PER_MS = 48  # pcm16 mono at 24 kHz, the Realtime API's default output format


def user_text(item_id: str, text: str) -> list[RealtimeModelEvent]:
    """The server's echo of a typed user message (``conversation.item.added``), as the SDK surfaces it."""
    return [RealtimeModelItemUpdatedEvent(item=UserMessageItem(item_id=item_id, content=[InputText(text=text)]))]


def spoken_reply(response: str, item: str, text: str, audio_ms: int) -> list[RealtimeModelEvent]:
    """A reply spoken in full: its transcript and its audio (``audio_ms`` of pcm16), not yet ended."""
    return [
        RealtimeModelTurnStartedEvent(response_id=response),
        RealtimeModelItemUpdatedEvent(
            item=AssistantMessageItem(item_id=item, status="in_progress", content=[AssistantAudio(transcript="")])
        ),
        RealtimeModelTranscriptDeltaEvent(item_id=item, delta=text, response_id=response),
        RealtimeModelAudioEvent(
            data=b"\0" * (audio_ms * BYTES_PER_MS), response_id=response, item_id=item, content_index=0
        ),
    ]


def function_call(call_id: str, name: str, arguments: str, item: str) -> RealtimeModelEvent:
    return RealtimeModelToolCallEvent(name=name, call_id=call_id, arguments=arguments, id=item)


def raw(**event: Any) -> RealtimeModelRawServerEvent:
    """A server event as the OpenAI transport forwards it before its normalized ones."""
    return RealtimeModelRawServerEvent(data=event)


def call_in_open_response(
    response: str, call_id: str, name: str, arguments: str, item: str
) -> list[RealtimeModelEvent]:
    """A response that opened and sent a call's arguments, not yet done (it may still be cancelled)."""
    return [
        raw(type="response.created", response={"id": response}),
        raw(
            type="response.function_call_arguments.done",
            response_id=response,
            item_id=item,
            call_id=call_id,
            name=name,
            arguments=arguments,
        ),
        function_call(call_id, name, arguments, item),
    ]


def tool_output_echo(event: RealtimeModelSendEvent, item: str) -> list[RealtimeModelEvent]:
    """What the OpenAI transport emits when the session sends a tool output: the call item with it."""
    assert isinstance(event, RealtimeModelSendToolOutput)
    call = event.tool_call
    return [
        RealtimeModelItemUpdatedEvent(
            item=RealtimeToolCallItem(
                item_id=item,
                call_id=call.call_id,
                status="completed",
                arguments=call.arguments,
                name=call.name,
                output=event.output,
            )
        )
    ]


async def ask_tool(
    model: ScriptedRealtimeModel, response: str, call_id: str, name: str, arguments: str, text: str, audio_ms: int
) -> None:
    """A spoken reply ``text`` that calls tool ``name``, completed (the call becomes runnable)."""
    await model.emit(
        *spoken_reply(response, f"a_{response}", text, audio_ms),
        function_call(call_id, name, arguments, f"f_{call_id}"),
        turn_ended(response),
    )


async def logged(ct: Any, session_id: str) -> list[Any]:
    """The call's events in the store, once the recorder wrote what it holds."""
    await ct.recorder.flush()
    return list(await ct.store.read(session_id))


def data_of(events: list[Any], kind: str) -> list[dict[str, Any]]:
    return [e.data for e in events if e.type == kind]


def turn_ended(response: str) -> RealtimeModelEvent:
    return RealtimeModelTurnEndedEvent(response_id=response)


def audio_interrupted(item: str) -> RealtimeModelEvent:
    return RealtimeModelAudioInterruptedEvent(item_id=item, content_index=0)


async def until(predicate: Callable[[], Any], timeout: float = 5.0) -> None:
    """Waits (on the loop) until ``predicate()`` is true."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110  (polls the SDK's state: no event to wait on)
            await asyncio.sleep(0.005)


def sent(model: ScriptedRealtimeModel, kind: type[Any]) -> list[Any]:
    return [e for e in model.sent_events if isinstance(e, kind)]


class FakeRealtimeServer:
    """The Realtime API's end of the WebSocket, played by the test, for the SDK's real OpenAI transport
    (``OpenAIRealtimeWebSocketModel``) to connect to: the network is the only fake.

    It greets with ``session.created``, keeps every client event, and answers a
    ``conversation.item.truncate`` with ``conversation.item.truncated`` as the API does; the test sends
    the rest (:meth:`send`)."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self._conn: Any = None
        self._n = 0

    async def __aenter__(self) -> FakeRealtimeServer:
        from websockets.asyncio.server import serve

        self._server = await serve(self._handle, "127.0.0.1", 0)
        port = next(iter(self._server.sockets)).getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}/v1/realtime"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, conn: Any) -> None:
        self._conn = conn
        session = {
            "type": "realtime",
            "object": "realtime.session",
            "id": "sess_1",
            "model": "gpt-realtime",
            "output_modalities": ["audio"],
            "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}}},
        }
        await self.send({"type": "session.created", "session": session})
        async for message in conn:
            event = json.loads(message)
            self.received.append(event)
            if event["type"] == "conversation.item.truncate":
                await self.send(
                    {
                        "type": "conversation.item.truncated",
                        "item_id": event["item_id"],
                        "content_index": event.get("content_index", 0),
                        "audio_end_ms": event["audio_end_ms"],
                    }
                )

    async def send(self, *events: dict[str, Any]) -> None:
        for event in events:
            self._n += 1
            await self._conn.send(json.dumps({"event_id": f"evt_{self._n}", **event}))

    def got(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        """The client events of ``kind`` received so far (whose item has the ``match`` fields)."""
        found = [e for e in self.received if e["type"] == kind]
        return [e for e in found if all((e.get("item") or {}).get(k) == v for k, v in match.items())]


def server_reply(response: str, item: str, text: str, audio_ms: int, output_index: int = 0) -> list[dict[str, Any]]:
    """A spoken reply as the Realtime API streams it (created, its item, transcript and audio)."""
    audio = base64.b64encode(b"\0" * (audio_ms * BYTES_PER_MS)).decode()
    where = {"response_id": response, "item_id": item, "output_index": output_index, "content_index": 0}
    return [
        {
            "type": "response.created",
            "response": {"id": response, "object": "realtime.response", "status": "in_progress", "output": []},
        },
        {
            "type": "response.output_item.added",
            "response_id": response,
            "output_index": output_index,
            "item": {"id": item, "type": "message", "role": "assistant", "status": "in_progress", "content": []},
        },
        {"type": "response.output_audio_transcript.delta", **where, "delta": text},
        {"type": "response.output_audio.delta", **where, "delta": audio},
    ]


def server_done(
    response: str, status: str = "completed", *output: dict[str, Any], reason: str | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"id": response, "object": "realtime.response", "status": status, "output": list(output)}
    if reason is not None:
        body["status_details"] = {"type": status, "reason": reason}
    return {"type": "response.done", "response": body}
