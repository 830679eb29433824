"""The live call: one session's writer, its live context, its waiters and its tools.

Every event goes one way: built once (:func:`~calltape.events.make_event`, stamped with the
writer's agent and epoch), queued on the recorder (no I/O) and folded at once into the live
:class:`~calltape.projections.ContextFold` in the order it was queued, which is the log's order, so
the context the agent gets now is the context the log will rebuild later. A write the store refuses
(a fenced zombie, an erased session) must not stay in that fold: the recorder tells the session
(:meth:`~calltape.eventstore.recorder.Recorder.watch`), and the session refolds its log without it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from calltape.errors import CalltapeError, DurableAppendTimeout, Interrupted
from calltape.events import Event, make_event
from calltape.eventstore.recorder import Recorder
from calltape.loopclock import settle
from calltape.projections import ContextFold, ToolCallState, build_context, render
from calltape.runtime.protocol import LiveCall
from calltape.runtime.recovery import RECOVERY_EVENT_TYPE, Recovery, RecoveryBus, recoveries, report_fenced_writes
from calltape.runtime.tools import ToolRunner
from calltape.runtime.toolspec import ToolBody, ToolOutcome, ToolSpec
from calltape.runtime.waits import PlayoutWaiters

log = logging.getLogger(__name__)


class CallSession:
    """One live call: its writer, its live context, its playout waiters and its guarded tools.

    Every event goes through :meth:`emit` (no I/O) and is folded at once, so the context the
    agent gets now is the context the log will rebuild later. Open one with :meth:`start` or
    :meth:`attach` (or ``calltape.connect(...).start_call``).
    """

    def __init__(
        self,
        recorder: Recorder,
        session_id: str,
        fold: ContextFold,
        *,
        agent: str | None,
        epoch: int | None,
        tools: Mapping[str, ToolSpec] | None = None,
        bus: RecoveryBus | None = None,
    ) -> None:
        self.recorder = recorder
        self.session_id = session_id
        self.fold = fold
        self.writer_agent = agent
        """The agent stamped on the events this call writes (moves on a handoff)."""
        self._epoch = epoch
        self.tools: dict[str, ToolSpec] = dict(tools or {})
        self.bus = bus or recoveries
        self.playout = PlayoutWaiters()
        self.runner = ToolRunner(self)
        self._refused: set[str] = set()  # ids the store refused that the fold still holds
        self._refold_task: asyncio.Task[None] | None = None
        self._refold_again = False
        self._journal: list[Event] | None = None  # what is folded while a refold reads the log
        # The recorder holds the call only weakly: a call that is gone stops being told.
        method = weakref.WeakMethod(self._on_refused)

        def on_refused(events: Sequence[Event], error: CalltapeError) -> None:
            handler = method()
            if handler is not None:
                handler(events, error)

        weakref.finalize(self, recorder.watch(session_id, on_refused))

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        recorder: Recorder,
        session_id: str,
        *,
        agent: str,
        instructions: str | None = None,
        modality: str = "voice",
        tenant: str | None = None,
        framework: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        tools: Mapping[str, ToolSpec] | None = None,
        bus: RecoveryBus | None = None,
    ) -> CallSession:
        """Opens a new session (epoch 1); ``session.started`` is durable when this returns."""
        call = cls(recorder, session_id, ContextFold(session_id), agent=agent, epoch=1, tools=tools, bus=bus)
        data: dict[str, Any] = {"agent": agent, "modality": modality}
        for key, value in (
            ("instructions", instructions),
            ("tenant", tenant),
            ("framework", framework),
            ("metadata", dict(metadata) if metadata is not None else None),
        ):
            if value is not None:
                data[key] = value
        await call.emit_durable("session.started", data)
        return call

    @classmethod
    async def attach(
        cls,
        recorder: Recorder,
        session_id: str,
        *,
        tools: Mapping[str, ToolSpec] | None = None,
        bus: RecoveryBus | None = None,
    ) -> CallSession:
        """Continues an existing session (e.g. after :func:`calltape.runtime.resume`) at its current epoch."""
        await recorder.flush()
        fold = await build_context(recorder.store, session_id)
        return cls(recorder, session_id, fold, agent=fold.agent, epoch=fold.epoch, tools=tools, bus=bus)

    # -- recording ---------------------------------------------------------------------------

    @property
    def agent(self) -> str | None:
        """The agent currently holding the call (changes on handoff and resume)."""
        return self.fold.agent

    @property
    def epoch(self) -> int | None:
        """This writer's epoch: a writer of an older epoch is refused by the store."""
        return self._epoch

    def _make(self, event_type: str, data: Mapping[str, Any] | None, at_ms: int | None, id: str | None) -> Event:
        return make_event(
            self.session_id, event_type, data, id=id, agent=self.writer_agent, epoch=self._epoch, at_ms=at_ms
        )

    def emit(
        self,
        event_type: str,
        data: Mapping[str, Any] | None = None,
        *,
        at_ms: int | None = None,
        id: str | None = None,
    ) -> Event:
        """Records one event without waiting (the voice loop's call) and folds it into the live context.

        A fixed ``id`` makes re-emitting the same fact harmless: the store and the fold skip duplicates."""
        # make_event spelled out rather than self._make: this is the voice loop's hot path
        event = make_event(
            self.session_id, event_type, data, id=id, agent=self.writer_agent, epoch=self._epoch, at_ms=at_ms
        )
        if id is not None and self.fold.knows(id):
            return event
        self.recorder.emit(event)  # raises (RecorderFull, RecorderClosed) before anything is folded
        self._fold(event)
        return event

    async def emit_durable(
        self,
        event_type: str,
        data: Mapping[str, Any] | None = None,
        *,
        at_ms: int | None = None,
        id: str | None = None,
    ) -> Event:
        """Records one event and returns once it has committed (after everything emitted before it).

        If the store refuses it (:class:`~calltape.errors.FencedWrite` after a resume elsewhere, an
        erased session…), the error is raised once the live context no longer holds the event."""
        event = self._make(event_type, data, at_ms, id)
        committed = self.recorder.submit(event)  # queued now: folded in the log's order
        self._fold(event)
        try:
            # settle: a virtual-clock test loop (LiveKit's) must not jump ahead while the commit is made
            return await settle(committed)
        except DurableAppendTimeout as exc:
            if exc.withdrawn:  # taken back: it will never be in the log (the refold waits for the store)
                self._on_refused([event], exc)
            raise
        except CalltapeError:
            await self._refolded()  # the recorder told _on_refused before it failed the append
            raise

    def _fold(self, event: Event) -> None:
        self.fold.apply(event)
        journal = self._journal
        if journal is not None:
            journal.append(event)
        kind = event.type
        if kind == "interruption":
            self.playout.interrupt(event.data.get("reply"), event.data.get("cause"))
            self.runner.on_interruption()
        elif kind == "agent.speech.ended":
            reply = event.data["reply"]
            if event.data.get("interrupted"):
                self.playout.interrupt(reply, "playout cut")
                self.runner.on_interruption()
            else:
                self.playout.finish(reply)
        elif kind == "agent.reply.done":
            # A reply with nothing to play (text session, or only tool calls) is over once generated.
            reply = event.data["reply"]
            if self.playout.has(reply):
                state = self.fold.reply_state(reply)
                if state is not None and not (state.generating or state.awaiting_playout or state.interrupted):
                    self.playout.finish(reply)
        elif kind == "agent.handoff":
            self.writer_agent = event.data["to"]
        elif kind in ("session.ended", "session.dropped"):
            self.playout.interrupt(None, kind)

    def report(self, recovery: Recovery) -> None:
        """Reports a recovery to the sinks and records it in the session's log (``x.recovery``)."""
        self.bus.report(recovery)
        try:
            event = self._make(RECOVERY_EVENT_TYPE, recovery.as_data(), None, None)
            self.recorder.emit(event)
        except CalltapeError:
            return  # a full or closed recorder: the sinks have it; the call must go on
        # Folded like every other event it writes (the fold skips x. types but counts them), so the
        # live context's seq / last_clean_seq stay those of the log.
        self._fold(event)

    # -- refused writes ---------------------------------------------------------------------

    def _on_refused(self, events: Sequence[Event], error: CalltapeError) -> None:
        """The recorder's word that the store refused some of this session's events (writer task)."""
        report_fenced_writes(self.recorder, self.bus, events, error)
        folded = [e.id for e in events if self.fold.knows(e.id)]
        if not folded:
            return
        self._refused.update(folded)
        if self._refold_task is None or self._refold_task.done():
            self._refold_task = asyncio.get_running_loop().create_task(self._refold(), name="calltape-refold")
        else:
            self._refold_again = True

    async def _refolded(self) -> None:
        """Waits for the refold under way, if any."""
        while self._refold_task is not None and not self._refold_task.done():
            await asyncio.shield(self._refold_task)

    async def _refold(self) -> None:
        """Rebuilds the live fold without the refused events: the log as this writer's epoch sees it
        (a zombie does not take in its successor's events), then what was folded while reading it.

        Refused writes are rare (a fenced zombie, an erased session), so this reads the whole log."""
        while True:
            self._refold_again = False
            journal = self._journal = []
            try:
                await self.recorder.flush()  # everything queued so far is committed or refused now
                stored = await self.recorder.store.read(self.session_id)
            except Exception as exc:  # never fail the call: the fold keeps the refused event
                log.error("calltape: could not refold session %s (%s)", self.session_id, type(exc).__name__)
                self._journal = None
                return
            refused, epoch = self._refused, self._epoch
            fresh = ContextFold(self.session_id)
            fresh.apply_many([e for e in stored if e.epoch is None or epoch is None or e.epoch <= epoch])
            for event in journal:
                if event.id not in refused:
                    fresh.apply(event)
            self._journal = None
            self.fold.adopt(fresh)
            refused.clear()
            if not self._refold_again:
                return

    # -- reading the live context -------------------------------------------------------------

    def context(self, format: str = "native") -> Any:
        """The live context in ``format`` (``native``, ``openai``, ``anthropic`` or ``realtime``)."""
        return render(self.fold.native(), format)

    def call_state(self, call_id: str) -> ToolCallState | None:
        """What the live fold knows about a tool call, or None for an unknown call id."""
        return self.fold.tool_call(call_id)

    def reply_interrupted(self, reply: str) -> bool:
        """Whether the reply was interrupted (so its unstarted tool calls must never start)."""
        state = self.fold.reply_state(reply)
        return state is not None and state.interrupted

    # -- the runtime --------------------------------------------------------------------------

    async def run_tool(
        self,
        call_id: str,
        name: str,
        arguments: Any,
        body: ToolBody,
        *,
        reply: str | None = None,
        spec: ToolSpec | None = None,
    ) -> ToolOutcome:
        """Runs a tool call under the log's protection (SPEC section 3)."""
        return await self.runner.run(call_id, name, arguments, body, reply=reply, spec=spec)

    def interrupt(self, reply: str | None = None, *, cause: str = "user_speech", heard: str | None = None) -> Event:
        """Barge-in: records ``interruption`` and releases every playout waiter at once."""
        data: dict[str, Any] = {"cause": cause}
        if reply is not None:
            data["reply"] = reply
        if heard is not None:
            data["heard"] = heard
        return self.emit("interruption", data)

    async def wait_for_playout(self, reply: str | None = None, timeout: float | None = None) -> None:
        """Returns when the reply's playout ends; raises :class:`Interrupted` within milliseconds of a
        barge-in. ``reply`` defaults to the latest one. ``timeout`` only bounds a playout that never ends."""
        rid = reply or self.fold.latest_reply()
        if rid is None:
            return
        state = self.fold.reply_state(rid)
        if state is not None and state.interrupted:
            raise Interrupted(rid)
        if state is None or not (state.generating or state.awaiting_playout):
            return
        future = self.playout.add(rid)
        started = time.perf_counter()
        try:
            if timeout is None:
                await future
            else:
                async with asyncio.timeout(timeout):
                    await future
        except Interrupted as exc:
            now = time.perf_counter()
            figures = {
                "reply": rid,
                "release_ms": round((now - exc.at) * 1000, 3),
                "waited_ms": round((now - started) * 1000, 3),
            }
            self.report(Recovery("waiter_released", self.session_id, figures))
            raise
        finally:
            self.playout.discard(rid, future)

    async def effect_events(self) -> list[Event]:
        """The session's ``tool.effect`` events in the log, once everything emitted so far has committed."""
        await self.recorder.flush()
        return [e for e in await self.recorder.store.read(self.session_id) if e.type == "tool.effect"]

    async def handoff(
        self, to: str, *, instructions: str | None = None, reason: str | None = None, format: str = "native"
    ) -> Any:
        """Hands the live call to another agent: ``agent.handoff`` (durable), then its context.

        Calls and outputs stay in the context even if the new agent lacks those tools."""
        data: dict[str, Any] = {"from": self.agent or "", "to": to}
        if instructions is not None:
            data["instructions"] = instructions
        if reason is not None:
            data["reason"] = reason
        await self.emit_durable("agent.handoff", data)
        self.report(Recovery("handoff", self.session_id, {"from": data["from"], "to": to}))
        return self.context(format)

    async def end(self, reason: str | None = None) -> None:
        """Ends the call normally (``session.ended``, durable)."""
        await self.emit_durable("session.ended", {"reason": reason} if reason else {})

    async def drop(self, reason: str | None = None) -> None:
        """Records that the call was lost mid-call (``session.dropped``, durable), so it can be resumed."""
        await self.emit_durable("session.dropped", {"reason": reason} if reason else {})


if TYPE_CHECKING:

    def _is_a_live_call(call: CallSession) -> LiveCall:
        return call  # mypy checks here that CallSession satisfies the LiveCall protocol
