"""Drop and resume mid-tool, for barge-in exploration: the call is lost while one tool call runs, the
session is resumed from the log (SPEC section 4), and the scenario carries on on the resumed call.

What a drop run does, deterministically whatever the machine's speed:

* it lands at the scenario's first ``await`` after the chosen call's ``tool.started`` (the tool is
  running: its side effects may have happened, its result is not in the log);
* **the writer stops**: nothing the old writer does from then on reaches the log. A tool run under
  ``call.run_tool`` keeps running (the worst case: its side effect happens, its result is lost) but its
  runner is cut off from the call; the outcome events of the dropped call that the scenario writes
  itself (an agent running its tools by hand) are lost with the writer, until the call is started again;
* ``session.dropped`` is recorded and :func:`calltape.runtime.resume` settles what was in flight
  (``unknown`` for a started call, ``retry`` for one declared idempotent, ``reuse`` for a result in the
  log); the same ``call`` object then writes at the new epoch, from a context rebuilt from the log;
* the scenario carries on: what it emits meanwhile (the caller, the LLM) lands on the resumed call, in
  order, once the resume is done; a ``run_tool`` that was cut off is asked again on the resumed call,
  which answers as a resumed agent's guarded runner does (the stored outcome, or one more run for a
  ``retry``); a durable write, or a new ``run_tool``, waits for the resume.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from calltape.errors import CalltapeError, Interrupted, StoreUnavailable
from calltape.events import Event, EventData, make_event
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.loopclock import settle
from calltape.projections import ToolCallState
from calltape.runtime import CallInterceptor, CallSession, Recovery, ResumePlan, ToolOutcome, ToolSpec, Verdict, resume
from calltape.testing.script import settled_through_drops

__all__ = ["DropCarrier", "DropCarrying", "DropHook", "carries_drops", "set_drop_carrier", "started_calls"]

_OUTCOMES = frozenset({"tool.progress", "tool.result", "tool.cancelled"})


class DropCarrier(Protocol):
    """How a framework's scripted caller carries a drop over to the resumed call (the framework
    runs the agent, so the framework's session is what is lost and started again)."""

    def lose(self) -> None:
        """The agent's process is lost, now: nothing its framework session does reaches the call any
        more (the session is cut off from the call and closed)."""

    async def carry_on(self, plan: ResumePlan) -> None:
        """The call was resumed (``plan``; the call now writes at the new epoch): a new framework
        session, seeded with the plan's context, takes the call on and the caller talks to it."""


class DropCarrying:
    """The drop bookkeeping every framework caller (:class:`calltape.testing.pipecat.PipecatCaller`,
    :class:`calltape.testing.livekit.LiveKitCaller`) shares: whether its agent runs, the closing of a
    lost agent, and the gate its speech waits on until a new agent carries the call on."""

    call: CallSession

    def __init__(self) -> None:
        self._running = False
        self._lost: asyncio.Future[None] | None = None
        self._carried = asyncio.Event()
        self._carried.set()

    def _cut_off(self, closing: Awaitable[None]) -> None:
        """The agent is lost: it stops, the caller's speech waits, and ``closing`` closes the old agent."""
        self._running = False
        self._carried.clear()
        self._lost = asyncio.ensure_future(closing)

    async def _closed(self) -> None:
        """Returns once the lost agent (if any) has closed."""
        if self._lost is not None:
            await self._lost
            self._lost = None

    async def _leave(self) -> None:
        """The caller hangs up: the agent stops and a lost one finishes closing."""
        self._running = False
        await self._closed()

    async def settled(self, *, quiet: float = 0.5, timeout: float = 30.0) -> None:
        """Waits until the agent has answered and nothing is in flight (:func:`calltape.testing.script.settled`),
        on the new agent when the call was dropped meanwhile."""
        await settled_through_drops(self._carried, lambda: self.call, quiet=quiet, timeout=timeout)


class _CarrierPart:
    """The call's own slot (:meth:`CallSession.part`) for the framework caller that carries its drops."""

    def __init__(self, call: CallSession) -> None:
        self.carrier: DropCarrier | None = None


def set_drop_carrier(call: CallSession, carrier: DropCarrier) -> None:
    """Makes a drop of ``call`` (exploration's drop runs) lose the framework session ``carrier`` runs
    and carry the call on on a new one after the resume."""
    call.part(_CarrierPart).carrier = carrier


def carries_drops(call: CallSession) -> bool:
    """Whether a framework caller of ``call`` carries drops over (:func:`set_drop_carrier`)."""
    return call.part(_CarrierPart).carrier is not None


def started_calls(events: list[Event]) -> list[str]:
    """The call ids that started in a run, in order: one drop run each."""
    return list(dict.fromkeys(e.data["call"] for e in events if e.type == "tool.started"))


class _Severed:
    """The dropped writer as a tool runner sees it: it keeps its old view of the call, and nothing it
    writes goes anywhere (the process lost its connection to the call)."""

    def __init__(self, call: CallSession) -> None:
        self.fold = call.fold
        self.tools: Mapping[str, ToolSpec] = call.tools
        self.session_id = call.session_id
        self.playout_reported = call.playout_reported
        self._agent, self._epoch = call.writer_agent, call.epoch

    def emit(
        self, event_type: str, data: EventData = None, *, at_ms: int | None = None, id: str | None = None
    ) -> Event:
        event = make_event(self.session_id, event_type, data, id=id, agent=self._agent, epoch=self._epoch, at_ms=at_ms)
        self.fold.apply(event)
        return event

    async def emit_durable(
        self, event_type: str, data: EventData = None, *, at_ms: int | None = None, id: str | None = None
    ) -> Event:
        return self.emit(event_type, data, at_ms=at_ms, id=id)

    def call_state(self, call_id: str) -> ToolCallState | None:
        return self.fold.tool_call(call_id)

    def reply_interrupted(self, reply: str) -> bool:
        state = self.fold.reply_state(reply)
        return state is not None and state.interrupted

    def report(self, recovery: Recovery) -> None:
        return None

    async def wait_for_playout(self, reply: str | None = None, timeout: float | None = None) -> None:
        raise Interrupted(reply, "session.dropped")

    async def effect_events(self) -> list[Event]:
        # A lost writer cannot read the log, so it cannot claim an effect: the action is not run
        # (its durable `started` could never have been written either).
        raise StoreUnavailable("the call was lost: its writer cannot reach the log")


class DropHook(CallInterceptor):
    """Drops ``call`` while the tool call ``call_id`` runs, resumes it, and carries the scenario on.

    It uses the call's public hook only: a listener follows the events, and as the call's
    interceptor it holds back what the scenario writes while the call is lost."""

    def __init__(self, call: CallSession, store: EventStore, recorder: Recorder, call_id: str, agent: str) -> None:
        self.call, self.store, self.recorder = call, store, recorder
        self.call_id, self.agent = call_id, agent
        self.after: str | None = None
        """Where the drop landed (None: the call never started in this run)."""
        self.plan: ResumePlan | None = None
        self.error: BaseException | None = None
        self._count = 1  # session.started
        self._holding = False
        self._lost = False  # the dropped call's own outcome events are lost until it starts again
        self._ended = False
        self._resumed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._carrier: DropCarrier | None = None
        call.add_listener(self._folded)
        call.intercept(self)

    def _folded(self, event: Event) -> None:
        if not event.type.startswith("x."):
            self._count += 1
        if event.type == "session.ended":
            self._ended = True
        if (
            event.type == "tool.started"
            and event.data.get("call") == self.call_id
            and self.after is None
            and not self._holding
        ):
            self.after = f"tool.started of {self.call_id}, event {self._count}"
            asyncio.get_running_loop().call_soon(self._land)

    # -- the drop ------------------------------------------------------------------------------

    def _land(self) -> None:
        call = self.call
        state = call.fold.tool_call(self.call_id)
        if self._ended or call.fold.dropped or state is None or state.status != "in_progress":
            self.after = None  # the tool (or the call) finished before a drop could land
            return
        self._holding = self._lost = True
        call.runner.call = _Severed(call)
        call.playout.interrupt(None, "session.dropped")
        self._carrier = call.part(_CarrierPart).carrier
        if self._carrier is not None:
            self._carrier.lose()
        self._task = asyncio.ensure_future(self._drop_and_resume())

    async def _drop_in_the_log(self) -> ResumePlan:
        """``session.dropped``, the resume, and this call object made the resumed call's writer."""
        call = self.call
        await self.recorder.flush()  # what the writer emitted before the drop is in the log
        dropped = make_event(call.session_id, "session.dropped", {"reason": "exploration"}, epoch=call.epoch)
        await self.store.append([dropped])
        plan = await resume(self.store, call.session_id, self.agent, tools=call.tools, bus=call.bus)
        # The same object becomes the resumed call's writer: the scenario holds it. The old runner
        # and playout waiters stay with the dropped writer (severed, released).
        await call.reattach()
        return plan

    async def _drop_and_resume(self) -> None:
        call = self.call
        try:
            # settled: the store's work is off the loop, and a virtual clock must not jump meanwhile to
            # the scenario's next timer (a barge-in, a tool's timeout), or runs would differ by chance
            self.plan = await settle(self._drop_in_the_log())
            self._holding = False
            call.release()  # what the scenario said meanwhile, now on the resumed call, in order
            if self._carrier is not None:
                # the resume is done: the lost session's cut-off tool is answered on the resumed call
                # (so the lost session can close) while a new session takes the call on
                self._resumed.set()
                await self._carrier.carry_on(self.plan)
        except BaseException as exc:  # reported as the run's problem; the scenario must not hang
            self.error = exc
            self._holding = False
            with contextlib.suppress(CalltapeError):  # what was held goes on if it can; the error stands
                call.release()
        finally:
            self._resumed.set()

    async def finish(self) -> None:
        """Waits for the drop and resume, if one landed."""
        if self._task is not None:
            await self._task

    # -- the call as the scenario sees it (the interceptor) ------------------------------------

    def intercept(self, event: Event) -> Verdict:
        """Loses the dropped tool call's outcome events until it starts again; holds the rest of what
        the call writes while it is lost (recoveries go on as they would)."""
        if self._lost and event.data.get("call") == self.call_id:
            if event.type == "tool.started":
                self._lost = False  # started again on the resumed call: its outcome counts from here
            elif event.type in _OUTCOMES:
                return Verdict.DISCARD
        if self._holding and not event.type.startswith("x."):
            return Verdict.HOLD
        return Verdict.RECORD

    async def around_tool(self, call_id: str, name: str, run: Callable[[], Awaitable[ToolOutcome]]) -> ToolOutcome:
        """A tool run waits for the resume; one the drop cut off is asked again on the resumed call."""
        if self._holding:
            await self._resumed.wait()
        runner = self.call.runner
        outcome = await run()
        if runner.call is self.call:
            return outcome
        await self._resumed.wait()  # cut off by the drop: the resumed call answers the same ask
        return await run()
