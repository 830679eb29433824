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
import enum
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, Unpack, cast

from msgspec.structs import replace

from calltape.errors import CalltapeError, DurableAppendTimeout, Interrupted
from calltape.events import Event, EventData, make_event
from calltape.eventstore.recorder import Recorder
from calltape.loopclock import settle
from calltape.projections import ContextFold, ToolCallState, build_context, render
from calltape.projections.context import DEFAULT_POLICY, SnapshotPolicy
from calltape.runtime.livesnap import LiveSnapshots
from calltape.runtime.protocol import LiveCall
from calltape.runtime.recovery import RECOVERY_EVENT_TYPE, Recovery, RecoveryBus, recoveries, report_fenced_writes
from calltape.runtime.tools import ToolRunner
from calltape.runtime.toolspec import ToolBody, ToolOptions, ToolOutcome, ToolSpec
from calltape.runtime.waits import PlayoutWaiters

log = logging.getLogger(__name__)

_Part = TypeVar("_Part")

EventListener = Callable[[Event], None]
"""Told of each event once it is folded into the live context (:meth:`CallSession.add_listener`)."""


class Verdict(enum.Enum):
    """What a :class:`CallInterceptor` does with an event the call is about to append."""

    RECORD = "record"
    """To the log as usual."""
    HOLD = "hold"
    """Folded now (the live context and the listeners go on), appended on :meth:`CallSession.release`."""
    DISCARD = "discard"
    """Neither folded nor appended: as if the process that wrote it had lost its connection."""


class CallInterceptor:
    """Stands between a live call and its log, to simulate what a real call meets (a dropped
    connection, a lost write) without patching the session: subclass it, override what you need and
    install it with :meth:`CallSession.intercept`. The defaults change nothing."""

    def intercept(self, event: Event) -> Verdict:
        """Decides what happens to ``event`` (built, not yet folded or appended)."""
        return Verdict.RECORD

    async def around_tool(self, call_id: str, name: str, run: Callable[[], Awaitable[ToolOutcome]]) -> ToolOutcome:
        """Wraps one :meth:`CallSession.run_tool`: ``run()`` asks the call's current tool runner
        (it may be awaited again, e.g. on the resumed call after a drop)."""
        return await run()


class StartOptions(TypedDict, total=False):
    """The keyword options of a new call (:meth:`CallSession.start`, ``Calltape.start_call``), beside
    its ``agent``: stated once, so the two cannot drift apart. What is given lands in ``session.started``."""

    instructions: str | None
    """The agent's system instructions (the context's first item)."""
    modality: Literal["voice", "text"]
    """``voice`` (replies are heard: the default) or ``text`` (replies are read)."""
    tenant: str | None
    """The call's tenant; it must agree with the store (SPEC section 6)."""
    framework: str | None
    """The framework that runs the agent (an adapter sets it)."""
    metadata: Mapping[str, Any] | None
    """The application's own data about the call."""
    tools: Mapping[str, ToolSpec] | None
    """The call's tool specs by tool name."""
    snapshots: SnapshotPolicy | None
    """How often the live call saves a snapshot of what it committed, as it runs (default: every 1,000
    events, at the next clean point); None: never, and a resume after a drop folds the whole call."""


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
        snapshots: SnapshotPolicy | None = DEFAULT_POLICY,
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
        self.playout_reported = True
        """Whether something reports to this call when a reply played to its end (``agent.speech.ended``).
        An adapter of a platform that never says so sets it False: a heard-first effect (SPEC section 8)
        then refuses at once (``EffectNotRun``) instead of waiting for a playout nobody will report."""
        self.runner = ToolRunner(self)
        self._refused: set[str] = set()  # ids the store refused that the fold still holds
        self._refold_task: asyncio.Task[None] | None = None
        self._refold_again = False
        self._journal: list[Event] | None = None  # what is folded while a refold reads the log
        self._interceptor: CallInterceptor | None = None
        self._held: list[tuple[Event, asyncio.Future[tuple[Event, Awaitable[Event]]] | None]] = []
        self._listeners: list[tuple[EventListener, frozenset[str] | None]] = []
        # event type -> its listeners, in the order they were added; other types get _any
        self._by_type: dict[str, tuple[EventListener, ...]] = {}
        self._any: tuple[EventListener, ...] = ()
        self._parts: dict[Callable[[Any], Any], Any] = {}
        # The runtime's own reactions are listeners like any other, added first.
        self.add_listener(self._on_interruption, "interruption")
        self.add_listener(self._on_speech_ended, "agent.speech.ended")
        self.add_listener(self._on_reply_done, "agent.reply.done")
        self.add_listener(self._on_handoff, "agent.handoff")
        self.add_listener(self._on_call_over, "session.ended", "session.dropped")
        # The recorder holds the call only weakly: a call that is gone stops being told.
        method = weakref.WeakMethod(self._on_refused)

        def on_refused(events: Sequence[Event], error: CalltapeError) -> None:
            handler = method()
            if handler is not None:
                handler(events, error)

        weakref.finalize(self, recorder.watch(session_id, on_refused))
        self.snapshots = None if snapshots is None else LiveSnapshots(recorder, session_id, snapshots, base=fold.seq)
        """Saves snapshots of the session as its events commit (:mod:`calltape.runtime.livesnap`); None: off."""

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        recorder: Recorder,
        session_id: str,
        *,
        agent: str,
        bus: RecoveryBus | None = None,
        **options: Unpack[StartOptions],
    ) -> CallSession:
        """Opens a new session (epoch 1); ``session.started`` is durable when this returns."""
        tools = options.get("tools")
        snapshots = options.get("snapshots", DEFAULT_POLICY)
        call = cls(
            recorder,
            session_id,
            ContextFold(session_id),
            agent=agent,
            epoch=1,
            tools=tools,
            bus=bus,
            snapshots=snapshots,
        )
        data: dict[str, Any] = {"agent": agent, "modality": options.get("modality", "voice")}
        given: Mapping[str, Any] = options
        for key in ("instructions", "tenant", "framework", "metadata"):
            value = given.get(key)
            if value is not None:
                data[key] = dict(value) if key == "metadata" else value
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
        snapshots: SnapshotPolicy | None = DEFAULT_POLICY,
    ) -> CallSession:
        """Continues an existing session (e.g. after :func:`calltape.runtime.resume`) at its current epoch."""
        await recorder.flush()
        fold = await build_context(recorder.store, session_id)
        return cls(
            recorder, session_id, fold, agent=fold.agent, epoch=fold.epoch, tools=tools, bus=bus, snapshots=snapshots
        )

    # -- recording ---------------------------------------------------------------------------

    @property
    def agent(self) -> str | None:
        """The agent currently holding the call (changes on handoff and resume)."""
        return self.fold.agent

    @property
    def epoch(self) -> int | None:
        """This writer's epoch: a writer of an older epoch is refused by the store."""
        return self._epoch

    def _make(self, event_type: str, data: EventData, at_ms: int | None, id: str | None) -> Event:
        return make_event(
            self.session_id, event_type, data, id=id, agent=self.writer_agent, epoch=self._epoch, at_ms=at_ms
        )

    def emit(
        self, event_type: str, data: EventData = None, *, at_ms: int | None = None, id: str | None = None
    ) -> Event:
        """Records one event without waiting (the voice loop's call) and folds it into the live context.

        A fixed ``id`` makes re-emitting the same fact harmless: the store and the fold skip duplicates."""
        # make_event spelled out rather than self._make: this is the voice loop's hot path
        event = make_event(
            self.session_id, event_type, data, id=id, agent=self.writer_agent, epoch=self._epoch, at_ms=at_ms
        )
        if id is not None and self.fold.knows(id):
            return event
        if self._interceptor is not None and self._set_aside(event, None) is not Verdict.RECORD:
            return event
        self.recorder.emit(event)  # raises (RecorderFull, RecorderClosed) before anything is folded
        self._fold(event)
        return event

    async def emit_durable(
        self, event_type: str, data: EventData = None, *, at_ms: int | None = None, id: str | None = None
    ) -> Event:
        """Records one event and returns once it has committed (after everything emitted before it).

        If the store refuses it (:class:`~calltape.errors.FencedWrite` after a resume elsewhere, an
        erased session…), the error is raised once the live context no longer holds the event.
        An event an interceptor holds commits (and this returns) after :meth:`release`."""
        event = self._make(event_type, data, at_ms, id)
        if self._interceptor is not None:
            waiter: asyncio.Future[tuple[Event, Awaitable[Event]]] = asyncio.get_running_loop().create_future()
            verdict = self._set_aside(event, waiter)
            if verdict is Verdict.HOLD:
                event, committed = await waiter
                return await self._committed(event, committed)
            if verdict is Verdict.DISCARD:
                return event
        committed = self.recorder.submit(event)  # queued now: folded in the log's order
        self._fold(event)
        return await self._committed(event, committed)

    async def _committed(self, event: Event, committed: Awaitable[Event]) -> Event:
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
        for listener in self._by_type.get(event.type, self._any):
            try:
                listener(event)
            except Exception as exc:  # a listener must not fail the write it was told of
                log.error(
                    "calltape: a listener of session %s failed on %s (%s)",
                    self.session_id,
                    event.type,
                    type(exc).__name__,
                )

    # -- the runtime's own reactions (listeners) ---------------------------------------------

    def _on_interruption(self, event: Event) -> None:
        self.playout.interrupt(event.data.get("reply"), event.data.get("cause"))
        self.runner.on_interruption()

    def _on_speech_ended(self, event: Event) -> None:
        reply = event.data["reply"]
        if event.data.get("interrupted"):
            self.playout.interrupt(reply, "playout cut")
            self.runner.on_interruption()
        else:
            self.playout.finish(reply)

    def _on_reply_done(self, event: Event) -> None:
        # A reply with nothing to play (text session, or only tool calls) is over once generated.
        reply = event.data["reply"]
        if self.playout.has(reply):
            state = self.fold.reply_state(reply)
            if state is not None and state.played:
                self.playout.finish(reply)

    def _on_handoff(self, event: Event) -> None:
        self.writer_agent = event.data["to"]

    def _on_call_over(self, event: Event) -> None:
        self.playout.interrupt(None, event.type)

    def report(self, recovery: Recovery) -> None:
        """Reports a recovery to the sinks and records it in the session's log (``x.recovery``)."""
        self.bus.report(recovery)
        try:
            event = self._make(RECOVERY_EVENT_TYPE, recovery.as_data(), None, None)
            if self._interceptor is not None and self._set_aside(event, None) is not Verdict.RECORD:
                return
            self.recorder.emit(event)
        except CalltapeError:
            return  # a full or closed recorder: the sinks have it; the call must go on
        # Folded like every other event it writes (the fold skips x. types but counts them), so the
        # live context's seq / last_clean_seq stay those of the log.
        self._fold(event)

    # -- the hook: listeners and an interceptor ------------------------------------------------

    def add_listener(self, listener: EventListener, *types: str) -> None:
        """Tells ``listener`` of each event (of ``types``, or every event) once it is folded into the
        live context: in the log's order, on the writer's own thread, before ``emit`` returns. It must
        not block (the voice loop waits); an exception it raises is logged, never the writer's.

        This is how the runtime reacts to its own events (playout waiters, the tool runner, the
        writer's agent), and how a harness follows a call without patching it."""
        self._listeners.append((listener, frozenset(types) if types else None))
        self._dispatch()

    def remove_listener(self, listener: EventListener) -> None:
        """Stops telling ``listener`` (every registration of it); ValueError if it was never added."""
        kept = [entry for entry in self._listeners if entry[0] != listener]
        if len(kept) == len(self._listeners):
            raise ValueError("not a listener of this call")
        self._listeners = kept
        self._dispatch()

    def _dispatch(self) -> None:
        # Built once per change, so emit does one dict lookup and no filtering.
        entries = self._listeners
        types = {kind for _, kinds in entries if kinds for kind in kinds}
        self._by_type = {kind: tuple(fn for fn, kinds in entries if kinds is None or kind in kinds) for kind in types}
        self._any = tuple(fn for fn, kinds in entries if kinds is None)

    def part(self, kind: Callable[[CallSession], _Part]) -> _Part:
        """The one ``kind(self)`` of this call, made on first use.

        Where an adapter or the test harness keeps its per-call object (the Pipecat adapter's
        observer, tool guard and context fixer, a scripted caller's barge-in): the call owns it, so
        it lives exactly as long as the call and no registry outside the call maps calls to state."""
        found = self._parts.get(kind)
        if found is None:
            found = self._parts[kind] = kind(self)
        return cast("_Part", found)

    def intercept(self, interceptor: CallInterceptor | None) -> None:
        """Installs ``interceptor`` (one at a time: ValueError if another one is installed), or with
        None removes it after releasing what it held. Every event the call writes (``emit``,
        ``emit_durable``, recoveries) is put to it before it is folded or appended, and every
        :meth:`run_tool` goes through its :meth:`~CallInterceptor.around_tool`."""
        if interceptor is None:
            self.release()
        elif self._interceptor is not None and self._interceptor is not interceptor:
            raise ValueError("the call already has an interceptor")
        self._interceptor = interceptor

    def _set_aside(self, event: Event, waiter: asyncio.Future[tuple[Event, Awaitable[Event]]] | None) -> Verdict:
        assert self._interceptor is not None
        verdict = self._interceptor.intercept(event)
        if verdict is Verdict.HOLD:
            self._held.append((event, waiter))
            self._fold(event)  # the live context goes on; the log gets it on release
        return verdict

    @property
    def held(self) -> int:
        """How many events an interceptor holds back (:data:`Verdict.HOLD`) until :meth:`release`."""
        return len(self._held)

    def release(self) -> int:
        """Appends the held events in the order they were written, at the writer's current epoch
        (after :meth:`reattach`, the resumed one); returns how many. A durable write among them
        returns once it has committed."""
        held, self._held = self._held, []
        epoch = self._epoch
        for event, waiter in held:
            if event.epoch != epoch:
                event = replace(event, epoch=epoch)
            if waiter is None:
                self.recorder.emit(event)
                continue
            try:
                waiter.set_result((event, self.recorder.submit(event)))
            except CalltapeError as exc:
                waiter.set_exception(exc)
        return len(held)

    async def reattach(self) -> None:
        """Makes this call object the writer of the session's current epoch after a resume elsewhere
        (:func:`calltape.runtime.resume`) moved the log on, for whoever holds on to the object across
        a simulated drop: the live context is rebuilt from the log (plus what is held), the playout
        waiters and the tool runner start afresh (the old ones stay with the lost writer)."""
        await self.recorder.flush()
        await self._refolded()
        fold = await build_context(self.recorder.store, self.session_id)
        for event, _ in self._held:
            fold.apply(event)
        self.fold = fold
        self._epoch = fold.epoch
        self.writer_agent = fold.agent
        self.playout = PlayoutWaiters()
        self.runner = ToolRunner(self)

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
        self, call_id: str, name: str, arguments: Any, body: ToolBody, **options: Unpack[ToolOptions]
    ) -> ToolOutcome:
        """Runs a tool call under the log's protection (SPEC section 3): ``reply=`` names the reply that
        asked for it, ``spec=`` overrides the spec registered for ``name`` (see :class:`ToolOptions`)."""
        if self._interceptor is None:
            return await self.runner.run(call_id, name, arguments, body, **options)
        return await self._interceptor.around_tool(
            call_id, name, lambda: self.runner.run(call_id, name, arguments, body, **options)
        )

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
        if state is None or state.played:
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
        """The session's ``tool.effect`` events in the log, once everything emitted so far has committed.

        Settled (:func:`~calltape.loopclock.settle`): on a virtual-clock test loop the read, done off the
        loop, must not let the clock jump to the next timer (the tool's timeout, a scripted barge-in)."""
        await settle(self.recorder.flush())
        # Only those events, filtered by the database: a one-hour call is ~50k events, and this read is on
        # the tool's path (and repeated while another run holds the claim).
        return await settle(self.recorder.store.read(self.session_id, types=("tool.effect",)))

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
