"""One object that owns a store, its recorder and the calls recorded through them.

Recording a call takes a store, a recorder writing to it, and a :class:`~calltape.runtime.CallSession`
per call, closed in the right order (drain the recorder, then close the store). :func:`connect`
returns a :class:`Calltape` that does all of it::

    async with calltape.connect("sqlite:///calls.db") as ct:
        call = await ct.start_call("call-1", agent="booking")
        ...

The adapters take this object too, so attaching a framework is a few lines.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypedDict, Unpack

from calltape.errors import CalltapeError
from calltape.loopclock import settle

if TYPE_CHECKING:
    from calltape.eventstore import EventStore
    from calltape.eventstore.recorder import Recorder, RejectHandler
    from calltape.projections import ContextFold
    from calltape.runtime import CallSession, ResumePlan, ToolSpec
    from calltape.runtime.recovery import RecoveryBus
    from calltape.runtime.session import StartOptions

Modality = Literal["voice", "text"]
"""A session's modality: ``voice`` (replies are heard) or ``text`` (replies are read)."""


class ConnectOptions(TypedDict, total=False):
    """The keyword options of :func:`connect` (what they mean is told there), which hands them to
    :class:`Calltape` (whose defaults apply): stated once, so the two cannot drift apart."""

    upgrade_schema: bool | None
    max_batch: int
    max_delay: float
    max_pending: int
    on_rejected: RejectHandler | None
    close_timeout: float | None
    durable_timeout: float | None
    spill_dir: Path | None
    bus: RecoveryBus | None
    tenant: str | None


class Resumed(NamedTuple):
    """What :meth:`Calltape.resume_call` returns: the plan, and the call attached at the new epoch."""

    plan: ResumePlan
    call: CallSession


class Calltape:
    """A store, the recorder that writes to it, and the calls started or attached through it.

    Made by :func:`connect`. Use it as ``async with connect(url) as ct`` (closed on exit), or
    ``ct = await connect(url)`` and ``await ct.close()``. Closing drains the recorder (every event
    accepted is written) and then closes the store.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        upgrade_schema: bool | None = None,
        max_batch: int = 1000,
        max_delay: float = 0.004,
        max_pending: int = 100_000,
        on_rejected: RejectHandler | None = None,
        close_timeout: float | None = 30.0,
        durable_timeout: float | None = 10.0,
        spill_dir: Path | None = None,
        bus: RecoveryBus | None = None,
        tenant: str | None = None,
    ) -> None:
        self.url = url
        self.tenant = tenant
        """The tenant the store is opened for (None: ``$CALLTAPE_TENANT``, else none)."""
        self._upgrade_schema = upgrade_schema
        self._recorder_options: dict[str, Any] = {
            "max_batch": max_batch,
            "max_delay": max_delay,
            "max_pending": max_pending,
            "close_timeout": close_timeout,
            "durable_timeout": durable_timeout,
        }
        if on_rejected is not None:
            self._recorder_options["on_rejected"] = on_rejected
        self._spill_dir = spill_dir
        self._bus = bus
        self._store: EventStore | None = None
        self._recorder: Recorder | None = None
        self._closed = False
        self.calls: dict[str, CallSession] = {}
        """The calls started, attached or resumed through this object, by session id (the latest)."""

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> Calltape:
        """Opens the store and starts the recorder; returns ``self``. Called by ``async with``."""
        if self._closed:
            raise CalltapeError("this calltape connection is closed; call calltape.connect() again")
        if self._store is not None:
            return self
        from calltape.eventstore import open_store
        from calltape.eventstore.recorder import Recorder

        # settle: on a virtual-clock loop (a test harness) the clock must not jump while the store
        # opens off the loop, or the timers the app already has pending would fire early
        store = await settle(open_store(self.url, upgrade_schema=self._upgrade_schema, tenant=self.tenant))
        try:
            self._recorder = await Recorder(store, **self._recorder_options).start()
        except BaseException:
            await settle(store.close())
            raise
        self._store = store
        return self

    async def close(self) -> None:
        """Drains the recorder (everything emitted is written, or spilled), then closes the store.

        A database that stays unreachable for ``close_timeout`` seconds (30 by default; ``None`` waits
        forever) does not hold shutdown hostage: the unwritten events go to a JSONL file and
        ``RecorderSpilled`` names it (the store is closed all the same). Closing twice is harmless.
        """
        if self._closed:
            return
        self._closed = True
        store, recorder = self._store, self._recorder
        self._store = self._recorder = None
        self.calls.clear()
        try:
            if recorder is not None:
                await settle(recorder.close(spill_dir=self._spill_dir))
        finally:
            if store is not None:
                await settle(store.close())

    async def __aenter__(self) -> Calltape:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __await__(self) -> Generator[Any, None, Calltape]:
        return self.open().__await__()

    @property
    def store(self) -> EventStore:
        """The event store (read sessions, contexts, the feed). Raises until the object is opened."""
        if self._store is None:
            raise CalltapeError(self._not_open())
        return self._store

    @property
    def recorder(self) -> Recorder:
        """The recorder every call of this object writes through. Raises until the object is opened."""
        if self._recorder is None:
            raise CalltapeError(self._not_open())
        return self._recorder

    def _not_open(self) -> str:
        if self._closed:
            return "this calltape connection is closed; call calltape.connect() again"
        return "this calltape connection is not open yet; use `async with calltape.connect(url) as ct`"

    # -- calls -------------------------------------------------------------------------------

    async def start_call(self, session_id: str, *, agent: str, **options: Unpack[StartOptions]) -> CallSession:
        """Starts a new call (``session.started`` is committed when this returns) and returns it.

        ``tenant`` must agree with the store (SPEC section 6): a store opened for a tenant gives the call its
        own, one without a tenant starts only calls without one (``TenantRefused`` otherwise), one opened
        for every tenant (``"*"``) starts a call of any tenant."""
        from calltape.runtime import CallSession

        call = await CallSession.start(self.recorder, session_id, agent=agent, bus=self._bus, **options)
        self.calls[session_id] = call
        return call

    async def attach_call(self, session_id: str, *, tools: Mapping[str, ToolSpec] | None = None) -> CallSession:
        """Continues a call already in the log at its current epoch (another process started it).

        Raises ``SessionNotFound`` when the log has no such session.
        """
        from calltape.runtime import CallSession

        call = await CallSession.attach(self.recorder, session_id, tools=tools, bus=self._bus)
        self.calls[session_id] = call
        return call

    async def resume_call(
        self,
        session_id: str,
        *,
        agent: str,
        tools: Mapping[str, ToolSpec] | None = None,
        instructions: str | None = None,
    ) -> Resumed:
        """Resumes a dropped (or live) call on ``agent`` and attaches to it at the new epoch.

        Settles what the drop left open (``plan.tools`` says which tool calls
        are reused, retried or of unknown outcome) and fences the old writer. Returns the plan and the
        attached call: ``plan, call = await ct.resume_call(...)``. Raises ``SessionNotFound``, and
        ``ConcurrencyConflict`` when another agent resumed the call first.
        """
        from calltape.runtime import CallSession, resume

        await self.recorder.flush()  # our own emitted events are part of what is being settled
        plan = await resume(self.store, session_id, agent, tools=tools, instructions=instructions, bus=self._bus)
        self.recorder.notify_committed(plan.events)  # written beside the recorder: its observers see them too
        call = await CallSession.attach(self.recorder, session_id, tools=tools, bus=self._bus)
        self.calls[session_id] = call
        return Resumed(plan, call)

    async def context(self, session_id: str, *, at: int | str | None = None) -> ContextFold:
        """The fold of a stored call at an instant (a seq, an RFC 3339 time or ``+seconds``; default: now).

        ``.native()`` gives the native context; ``calltape.render(fold.native(), "openai")`` a provider's.
        Events emitted but not yet written are flushed first, so the answer includes them.
        """
        from calltape.projections import build_context

        await self.recorder.flush()
        return await build_context(self.store, session_id, at=at)


def connect(url: str | None = None, **options: Unpack[ConnectOptions]) -> Calltape:
    """Connects to a calltape store: ``async with calltape.connect(url) as ct`` or ``await connect(url)``.

    ``url`` is ``postgresql://…``, ``sqlite:///path/to/calls.db`` or ``sqlite:///:memory:`` (a private
    in-memory database, gone when closed: for tests); default ``$CALLTAPE_DATABASE_URL``, else the
    embedded SQLite file. SQLite stores are upgraded automatically; a PostgreSQL database must be
    upgraded with ``calltape db upgrade`` first (``upgrade_schema=True`` does it here). The recorder
    options are those of :class:`~calltape.eventstore.recorder.Recorder`: ``close_timeout`` bounds
    how long closing waits for an unreachable database before spilling to ``spill_dir``, and
    ``durable_timeout`` how long a durable append waits. ``tenant`` (default ``$CALLTAPE_TENANT``) opens
    the store for one tenant: its calls are that tenant's, and it sees no other tenant's sessions.
    """
    return Calltape(url, **options)
