"""The LiveKit STT stand-in: a scripted caller speaks to a real ``AgentSession`` through LiveKit's STT
path, so LiveKit's turn detection takes the turns and a barge-in interrupts the agent by audio
activity (not ``session.interrupt()``), and the tap ends the cut speech when its audio stops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession

from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.runtime import CallSession
from calltape.testing import invariant_violations
from calltape.testing.livekit import LiveKitCaller, Say, ScriptedLLM, ScriptedSTT, ScriptedTTS, speaking_caller

pytestmark = pytest.mark.livekit


async def test_the_caller_speaks_and_cuts_in_through_the_stt(calltape_store: EventStore) -> None:
    llm = ScriptedLLM([[Say("Your balance is ten pounds and twenty pence, and your next bill is due on Friday.")]])
    session: AgentSession[Any] = AgentSession(
        stt=ScriptedSTT(), llm=llm, tts=ScriptedTTS(word_secs=0.1), **speaking_caller()
    )
    programmatic: list[Any] = []
    session.interrupt = lambda *a, **k: programmatic.append(a)  # type: ignore[method-assign,assignment]
    async with Recorder(calltape_store) as recorder:
        call = await CallSession.start(recorder, "stt-1", agent="bank")
        async with LiveKitCaller(session, Agent(instructions="You are a bank."), call) as caller:
            await caller.says("what is my balance")
            for _ in range(200):  # until the answer is playing
                if any(r.speech_started for r in call.fold.replies()):
                    break
                await asyncio.sleep(0.01)
            await caller.barge_in("stop there")
            await caller.settled()
    events = await calltape_store.read("stt-1")
    types = [e.type for e in events]
    assert programmatic == []  # LiveKit interrupted the agent itself, from the caller's speech
    # the first turn: speech edges from the STT, the final transcript LiveKit committed, the reply
    first = types.index("agent.reply.started")
    assert types[1:first] == ["user.speech.started", "user.transcript", "user.speech.stopped", "user.transcript"]
    assert [e.data["text"] for e in events[1:first] if e.type == "user.transcript"][-1] == "what is my balance"
    # the barge-in: the caller starts talking, LiveKit cuts the reply on the interim transcript
    cut = types.index("interruption")
    assert types[cut - 2 : cut] == ["user.speech.started", "user.transcript"]
    assert events[cut - 1].data == {"text": "stop there", "final": False}  # the interim: its first words
    assert events[cut].data["cause"] == "user_speech"
    ended = next(e for e in events if e.type == "agent.speech.ended" and e.data["reply"] == events[cut].data["reply"])
    assert ended.data["interrupted"] is True and ended.at_ms - events[cut].at_ms < 200
    # and the caller's words are the next user turn
    finals = [e.data["text"] for e in events if e.type == "user.transcript" and e.data["final"]]
    assert finals == ["what is my balance", "stop there"]
    assert invariant_violations(events) == []
