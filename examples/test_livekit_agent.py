"""Testing a LiveKit agent under barge-in, offline: copy this file into your agent's tests.

Run: pytest examples/test_livekit_agent.py   (needs `pip install 'calltape[livekit]' pytest-asyncio`;
no keys, no room, no network)

``ClinicAgent`` stands for your ``Agent``: it runs in a real ``AgentSession`` whose STT, LLM and TTS
are calltape's offline stand-ins (``ScriptedSTT``, ``ScriptedLLM``, ``ScriptedTTS``): the caller speaks
through the STT, so LiveKit's own turn detection takes the turns and a barge-in interrupts the agent
the way a caller's voice does. The test plays one call, then replays it once per event boundary with
the caller cutting in exactly there, and checks every run: the
``calltape check`` rules, the context invariants, and the assertion below. A failure names the instant
and prints the call's timeline.
"""

from __future__ import annotations

from typing import Any

import pytest
from livekit.agents import Agent, AgentSession, RunContext

import calltape
from calltape import CallSession, Event
from calltape.adapters.livekit import function_tool
from calltape.testing.explore import Run, explore
from calltape.testing.livekit import Call, LiveKitCaller, Say, ScriptedLLM, ScriptedSTT, ScriptedTTS, speaking_caller

# ---------------------------------------------------------------------------------------------
# Your agent (in your project: `from my_agent import ClinicAgent`)


class Clinic:
    """The clinic's booking system (in a test: one per call, to see what each run did)."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    async def cancel(self, appointment: str) -> str:
        self.cancelled.append(appointment)
        return "cancelled"


class ClinicAgent(Agent):
    """A clinic line: cancels an appointment once the caller has heard which one."""

    def __init__(self, clinic: Clinic) -> None:
        super().__init__(instructions="You are a clinic's phone agent.")
        self.clinic = clinic

    # calltape's function_tool: LiveKit's, with the body under calltape's guard (durable start,
    # timeout, exactly once per call id).
    @function_tool
    async def cancel_appointment(self, ctx: RunContext[Any], appointment: str) -> str:
        """Cancels an appointment after telling the caller which one."""
        # The action is an effect named by the appointment: run once, and only once the reply that
        # announced it has played to its end (LiveKit's ctx.wait_for_playout() returns as if it had even
        # when the caller cut it off). If the caller barges in first, it is not run.
        return str(await calltape.effect("cancel", appointment, lambda: self.clinic.cancel(appointment), heard=True))


# ---------------------------------------------------------------------------------------------
# The test

CLINICS: dict[str, Clinic] = {}  # per run (each run is a call of its own)


async def one_call(call: CallSession) -> None:
    """The scenario: a scripted caller and LLM drive the real session, recorded into ``call``."""
    llm = ScriptedLLM(
        [
            [
                Say("I am cancelling your appointment on Monday at nine."),
                Call("cancel_appointment", "c1", {"appointment": "mon-9"}),
            ],
            [Say("Done. Anything else?")],
        ]
    )
    # speaking_caller(): STT turn detection, no VAD and no echo-cancellation warm-up (there is no audio)
    session: AgentSession[Any] = AgentSession(stt=ScriptedSTT(), llm=llm, tts=ScriptedTTS(), **speaking_caller())
    clinic = CLINICS[call.session_id] = Clinic()
    async with LiveKitCaller(session, ClinicAgent(clinic), call) as caller:
        await caller.says("please cancel my Monday appointment")
        await caller.settled()


def reply_of(run: Run, call_id: str) -> str | None:
    """The reply that carried a tool call (the announcement the caller must hear)."""
    return next((e.data.get("reply") for e in run.events if e.type == "tool.call" and e.data["call"] == call_id), None)


def played_out(events: list[Event], reply: str | None) -> bool:
    """Whether the reply played to its end, uninterrupted."""
    return any(
        e.type == "agent.speech.ended" and e.data["reply"] == reply and not e.data["interrupted"] for e in events
    )


def cancelled_once_and_only_when_heard(run: Run) -> None:
    """Your own checks of each run, per reply: the clinic cancelled at most once, and only when the
    reply announcing the cancellation played to its end."""
    cancelled = CLINICS[run.events[0].session].cancelled
    assert len(cancelled) <= 1, f"cancelled {len(cancelled)} times"
    if cancelled:
        announcing = reply_of(run, "c1")
        assert played_out(run.events, announcing), f"cancelled although reply {announcing} was cut off"


@pytest.mark.asyncio
async def test_every_barge_in_instant() -> None:
    CLINICS.clear()
    exploration = await explore(
        one_call,
        assertions=cancelled_once_and_only_when_heard,
        concurrency=8,  # runs at a time: on a small CI machine, fewer keep latencies realistic
        virtual_time=True,  # LiveKit's timers (playout, endpointing) run on a virtual clock: seconds, not minutes
    )
    exploration.assert_ok()
    print(f"{len(exploration.runs)} runs in {exploration.seconds:.1f} s")
