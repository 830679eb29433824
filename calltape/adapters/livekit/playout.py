"""An interruption-aware ``wait_for_playout`` for LiveKit speeches and tool contexts.

Upstream ``SpeechHandle.wait_for_playout()`` waits for the speech to be *done*, which after a barge-in
takes as long as the speech's running tools, capped by ``INTERRUPTION_TIMEOUT`` (5 s; livekit/agents
#5359, closed without a fix); ``RunContext.wait_for_playout()`` returns as if the preamble had played.
"""

from __future__ import annotations

import asyncio
from typing import Any

from livekit.agents import RunContext
from livekit.agents.voice import SpeechHandle

from calltape.adapters.livekit.tap import LiveKitTap, tap_of
from calltape.errors import Interrupted

__all__ = ["wait_for_playout"]


def _interrupted_error(handle: SpeechHandle, tap: LiveKitTap | None, reply: str | None) -> Interrupted:
    return Interrupted(reply or handle.id, tap.interruption_cause() if tap is not None else None)


async def wait_for_playout(target: RunContext[Any] | SpeechHandle, *, timeout: float | None = None) -> None:
    """Waits like ``target.wait_for_playout()``; raises ``Interrupted`` within ms of an interruption.

    ``RunContext``: the playout of the reply that called the tool. ``SpeechHandle``: the whole speech.
    Upstream only resolves once the speech is done, which after a barge-in waits for the speech's
    running tools, up to LiveKit's 5 s interruption timeout.
    """
    handle = target.speech_handle if isinstance(target, RunContext) else target
    tap = tap_of(target.session) if isinstance(target, RunContext) else None
    reply = tap.reply_of_handle(handle) if tap is not None else None
    if handle.interrupted:
        raise _interrupted_error(handle, tap, reply)
    waiter = asyncio.ensure_future(target.wait_for_playout())
    try:
        async with asyncio.timeout(timeout):
            await handle.wait_if_not_interrupted([waiter])
    finally:
        if not waiter.done():
            waiter.cancel()
    if not waiter.done():
        raise _interrupted_error(handle, tap, reply)
    waiter.result()
