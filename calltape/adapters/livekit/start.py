"""Attaching in one call: start the calltape call and the LiveKit session together.

``await start(session, agent, ct)`` replaces ``await session.start(agent)``: it starts the call in
``ct`` (a :func:`calltape.connect` object) with the agent's id, its instructions as its LLM gets
them and the session's modality, attaches the tap, checks the guarded tools, then starts the session.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from livekit.agents import Agent, AgentSession, llm, tts

from calltape.adapters.livekit.context import instructions_of
from calltape.adapters.livekit.tap import LiveKitTap, attach
from calltape.adapters.livekit.tools import unguarded_tools
from calltape.runtime import LiveCall, ToolSpec
from calltape.runtime.protocol import CallStarter

__all__ = ["modality_of", "start"]


def modality_of(session: AgentSession[Any], agent: Agent | None = None) -> str:
    """``voice`` when the session (or the agent) speaks: a TTS, a realtime model or an audio output."""
    voices = [session.tts, agent.tts if agent is not None else None]
    models = [session.llm, agent.llm if agent is not None else None]
    speaks = session.output.audio is not None or any(isinstance(v, tts.TTS) for v in voices)
    speaks = speaks or any(isinstance(m, llm.RealtimeModel) for m in models)
    return "voice" if speaks else "text"


async def start(
    session: AgentSession[Any],
    agent: Agent,
    tape: CallStarter | LiveCall,
    *,
    call_id: str | None = None,
    tools: Mapping[str, ToolSpec] | None = None,
    **start_options: Any,
) -> LiveKitTap:
    """Records ``session`` into a new call and starts it: ``await start(session, agent, ct, room=ctx.room)``.

    ``call_id`` defaults to the room's name (else a new id); ``tools`` are the call's tool specs.
    ``start_options`` go to ``session.start``. A tool given a spec in ``tools`` but registered
    unguarded raises ``TypeError`` before anything starts. Returns the tap (``tap.call`` is the call);
    what ``session.start`` returned is ``tap.start_result`` (a ``RunResult`` with ``capture_run=True``).
    """
    specs = dict(tools or {})
    if isinstance(tape, LiveCall):
        specs = {**tape.tools, **specs}
    unguarded = unguarded_tools([*session.tools, *agent.tools], specs)
    if unguarded:
        raise TypeError(
            f"tools {unguarded} have a ToolSpec but are registered unguarded: register them with "
            "calltape.adapters.livekit.function_tool (or put @guarded under @function_tool)"
        )
    if isinstance(tape, LiveCall):
        call = tape
    else:
        room = start_options.get("room")
        sid = call_id or getattr(room, "name", None) or f"livekit-{uuid.uuid4().hex[:12]}"
        call = await tape.start_call(
            sid,
            agent=agent.id,
            instructions=instructions_of(agent, session),
            modality=modality_of(session, agent),
            framework="livekit",
            tools=specs or None,
        )
    tap = attach(session, call)
    tap.start_result = await session.start(agent, **start_options)
    return tap
