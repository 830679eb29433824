"""The OpenAI Agents SDK's own scripted realtime model as the network stand-in: the SDK's session,
runner, agent and tool classes are real; ``ScriptedRealtimeModel`` (``agents.realtime.testing``)
answers each send with the normalized events the OpenAI transport would emit for the server's reply.
"""

from __future__ import annotations

import asyncio
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
