"""What a scripted LLM says, and when a scripted call has settled: shared by the framework stand-ins
(:mod:`calltape.testing.pipecat`, :mod:`calltape.testing.livekit`), which need no framework here.

A turn of a scripted LLM is a list of steps: ``[Say("Checking."), Call("check_balance", "c1")]``
streams the words, then asks for the call, the way a real model's stream does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calltape.runtime import CallSession

__all__ = ["Call", "Pause", "Say", "Step", "settled"]


@dataclass
class Say:
    """Stream ``text`` word by word (``gap`` seconds between words)."""

    text: str
    gap: float = 0.0


@dataclass
class Call:
    """Ask for a tool call."""

    name: str
    call_id: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class Pause:
    """Think for ``seconds`` (time to first token, or a pause mid-stream)."""

    seconds: float


Step = Say | Call | Pause
"""One step of a scripted LLM turn."""


async def settled(call: CallSession, *, quiet: float = 0.5, follow_up: float = 3.0, timeout: float = 30.0) -> None:
    """Waits until ``call`` has recorded nothing for ``quiet`` seconds and no tool call is open (asked
    for and without an output yet): the agent has answered and nothing is left in flight. When the
    latest reply's tools have all returned, the agent owes a follow-up reply (the LLM runs again on
    the results): that wait is allowed ``follow_up`` seconds of quiet, for a busy machine.

    Quiet is counted in polls as well as in seconds, so an event loop starved by a busy machine (no
    poll ran, so nothing could be recorded either) does not pass for a quiet call. Raises
    ``TimeoutError`` when the call is still busy after ``timeout`` seconds (a call that never gets
    its output is a finding: the run's checks report it as ``orphan-call``)."""
    loop = asyncio.get_running_loop()
    poll = 0.02
    deadline = loop.time() + timeout
    seen, since, polls = call.fold.seq, loop.time(), 0
    while loop.time() < deadline:
        await asyncio.sleep(poll)
        now = loop.time()
        if call.fold.seq != seen or any(t.included and t.status == "in_progress" for t in call.fold.tool_calls()):
            seen, since, polls = call.fold.seq, now, 0
            continue
        polls += 1
        needed = max(quiet, follow_up) if _owes_follow_up(call) else quiet
        if now - since >= needed and polls * poll >= needed / 2:
            return
    raise TimeoutError(f"the call did not settle within {timeout} s")


def _owes_follow_up(call: CallSession) -> bool:
    """The latest reply asked for tools and every one returned: the LLM is due to run on the results."""
    replies = call.fold.replies()
    if not replies or replies[-1].interrupted or not replies[-1].done:
        return False
    calls = [t for t in call.fold.tool_calls() if t.reply == replies[-1].reply]
    return bool(calls) and all(t.status == "completed" for t in calls)


async def settled_through_drops(
    carried: asyncio.Event, current: Callable[[], CallSession], *, quiet: float = 0.5, timeout: float = 30.0
) -> None:
    """:func:`settled` for a framework caller that carries drops: ``carried`` is clear while the call is
    lost, and ``current()`` is the call to watch (the resumed one after a drop)."""
    while True:
        await carried.wait()
        await settled(current(), quiet=quiet, timeout=timeout)
        if carried.is_set():
            return
