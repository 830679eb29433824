"""What tools and adapters need of "the call", as protocols, so none of them imports the session.

Four layers, each a superset of the one before:

- :class:`EventSink`: somewhere events go (``emit(type, data) -> Event``). A test sink, or the
  webhook ingest's :class:`calltape.adapters.replies.EventCollector`, is one.
- :class:`FoldedSink`: an event sink that also keeps the fold of what it wrote (``.fold``), so a
  reader (the adapters' reply tracker) reads the live context instead of keeping a second one.
- :class:`ToolHost`: what the guarded tool runner (:class:`calltape.runtime.tools.ToolRunner`) needs:
  durable writes, the tool specs, the state of a call and of a reply, a place to report recoveries,
  and for effects (:mod:`calltape.runtime.effects`) playout waits and the log's effect events.
- :class:`LiveCall`: the live call as adapters and servers use it: the above plus the agent, the
  epoch, the context in a provider's format, guarded execution, barge-in, handoff and the end of
  the call.

:class:`calltape.runtime.CallSession` is the one real :class:`LiveCall`. The module imports only
the layers below the runtime and the runtime's value modules (``toolspec``, ``recovery``), never
``session`` or ``tools``: both of those import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, Unpack, runtime_checkable

from calltape.events import Event, EventData
from calltape.projections import ContextFold, ToolCallState
from calltape.runtime.recovery import Recovery
from calltape.runtime.toolspec import ToolBody, ToolOptions, ToolOutcome, ToolSpec

__all__ = ["CallStarter", "EventSink", "FoldedSink", "HasParts", "LiveCall", "ToolHost"]

_Part = TypeVar("_Part")


@runtime_checkable
class EventSink(Protocol):
    """Where an adapter writes; the least a recording-only adapter needs."""

    def emit(self, event_type: str, data: Mapping[str, Any], /) -> Event:
        """Records one event without waiting and returns it (validated)."""
        ...


@runtime_checkable
class FoldedSink(EventSink, Protocol):
    """An event sink that folds what it writes: readers use its fold as the live context."""

    @property
    def fold(self) -> ContextFold:
        """The fold of every event written so far, in log order."""
        ...


@runtime_checkable
class ToolHost(FoldedSink, Protocol):
    """What guarded tool execution (SPEC section 3) needs of the call it runs in."""

    @property
    def session_id(self) -> str:
        """The session the call writes to."""
        ...

    @property
    def tools(self) -> Mapping[str, ToolSpec]:
        """The call's tool specs by name (a tool without one runs with ``ToolSpec()``)."""
        ...

    @property
    def playout_reported(self) -> bool:
        """Whether something tells this call when a reply has played to its end. False (a platform that
        reports no playout): a heard-first effect whose reply has not played out is refused at once."""
        ...

    def emit(
        self, event_type: str, data: EventData = None, *, at_ms: int | None = None, id: str | None = None
    ) -> Event:
        """Records one event without waiting; a fixed ``id`` makes re-emitting the same fact harmless."""
        ...

    async def emit_durable(
        self, event_type: str, data: EventData = None, *, at_ms: int | None = None, id: str | None = None
    ) -> Event:
        """Records one event and returns once it has committed (after everything emitted before it)."""
        ...

    def call_state(self, call_id: str) -> ToolCallState | None:
        """A tool call as the live fold has it (None: unknown call id)."""
        ...

    def reply_interrupted(self, reply: str) -> bool:
        """Whether the live fold has this reply interrupted."""
        ...

    def report(self, recovery: Recovery) -> None:
        """Reports a recovery to the sinks and records it in the session's log."""
        ...

    async def wait_for_playout(self, reply: str | None = None, timeout: float | None = None) -> None:
        """Returns when the reply's playout ends; raises ``Interrupted`` within milliseconds of a barge-in."""
        ...

    async def effect_events(self) -> list[Event]:
        """The session's ``tool.effect`` events as the log holds them, after everything this writer
        emitted has committed (SPEC section 8: the effect API decides from the log, not from memory)."""
        ...


@runtime_checkable
class LiveCall(ToolHost, Protocol):
    """The live call as adapters and servers use it; :class:`calltape.runtime.CallSession` is one."""

    @property
    def agent(self) -> str | None:
        """The agent now holding the call (changes on a handoff)."""
        ...

    @property
    def epoch(self) -> int | None:
        """The writer's epoch; a write at an older epoch than the log's is rejected (fenced)."""
        ...

    def context(self, format: str = "native") -> Any:
        """The live context rendered for a provider (``native``, ``openai``, ``anthropic``, ``realtime``)."""
        ...

    async def run_tool(
        self, call_id: str, name: str, arguments: Any, body: ToolBody, **options: Unpack[ToolOptions]
    ) -> ToolOutcome:
        """Runs a tool call under the log's protection (SPEC section 3)."""
        ...

    def interrupt(self, reply: str | None = None, *, cause: str = "user_speech", heard: str | None = None) -> Event:
        """Barge-in: records ``interruption`` and releases every playout waiter at once."""
        ...

    async def handoff(
        self, to: str, *, instructions: str | None = None, reason: str | None = None, format: str = "native"
    ) -> Any:
        """Hands the call to another agent and returns the context for it."""
        ...

    async def end(self, reason: str | None = None) -> None:
        """Records ``session.ended`` (durable)."""
        ...

    async def drop(self, reason: str | None = None) -> None:
        """Records ``session.dropped`` (durable)."""
        ...


@runtime_checkable
class HasParts(Protocol):
    """A call that keeps per-call objects for adapters and harnesses (:meth:`calltape.runtime.CallSession.part`), so
    they find each other through the call instead of through a module-global registry."""

    def part(self, kind: Callable[[Any], _Part]) -> _Part:
        """The one ``kind(call)`` of this call, made on first use."""
        ...


class CallStarter(Protocol):
    """What an adapter's one-call attach needs to open a call: :class:`calltape.Calltape` (from
    ``calltape.connect``)."""

    async def start_call(
        self,
        session_id: str,
        *,
        agent: str,
        instructions: str | None = ...,
        modality: Any = ...,
        framework: str | None = ...,
        tools: Mapping[str, ToolSpec] | None = ...,
    ) -> LiveCall:
        """Starts a new call (``session.started`` committed) and returns it."""
        ...
