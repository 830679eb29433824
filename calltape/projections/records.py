"""The records a :class:`~calltape.projections.fold.ContextFold` keeps, and the per-record rules.

Slotted classes (a call's is a dataclass that compares by identity, like the others): the fold touches
them 100k times per replay. The rules that depend on one record alone live here as functions, so the
fold, the native rendering and the snapshot codec all call the same code: :func:`heard_text` (rule 3)
and :func:`call_outcome` (rule 5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from calltape.canonical_json import canonical_text

INTERRUPTED: Final = "interrupted"
IN_PROGRESS: Final = "in_progress"


class User:
    """One user message: the final pieces joined by single spaces (rule 2)."""

    __slots__ = ("parts", "seq")

    def __init__(self, seq: int, parts: list[str]) -> None:
        self.seq = seq
        self.parts = parts


class Handoff:
    """An ``agent.handoff`` item (rule 7: native only)."""

    __slots__ = ("from_", "seq", "to")

    def __init__(self, seq: int, from_: str, to: str) -> None:
        self.seq = seq
        self.from_ = from_
        self.to = to


class Reply:
    """One LLM generation: its text, playout, interruption and calls."""

    __slots__ = (
        "calls",
        "done",
        "has_text",
        "heard",
        "id",
        "interrupted",
        "parts",
        "seq",
        "speech_ended",
        "speech_started",
        "started",
    )

    def __init__(self, rid: str, seq: int) -> None:
        self.id = rid
        self.seq = seq
        self.started = False
        self.done = False
        self.parts: list[str] = []
        self.has_text = False
        self.interrupted = False
        self.heard: str | None = None
        self.speech_started = False
        self.speech_ended = False
        self.calls: list[Call] = []


@dataclass(slots=True, eq=False)
class Call:
    """One tool call, attached to its reply (rule 4)."""

    id: str
    name: str
    arguments: str
    reply: Reply
    seq: int
    included: bool
    order: int = 0
    started: bool = field(default=False, init=False)
    has_result: bool = field(default=False, init=False)
    output: Any = field(default=None, init=False)
    error: bool = field(default=False, init=False)
    cancel_reason: str | None = field(default=None, init=False)
    cancel_outcome: str | None = field(default=None, init=False)
    has_progress: bool = field(default=False, init=False)
    progress: Any = field(default=None, init=False)


Item = User | Reply | Handoff


def heard_text(r: Reply) -> str:
    """Rule 3: the assistant text of a reply is what the user heard."""
    if r.heard is not None:
        return r.heard
    if r.interrupted and not r.speech_started:
        return ""
    return "".join(r.parts)


def call_status(c: Call) -> str:
    """Rule 5: the status of a call's one output.

    ``completed``/``error`` (its ``tool.result``), else ``timeout``, ``unknown``, ``cancelled`` (any
    other ``tool.cancelled``, and a call of an interrupted reply that never started) or
    ``in_progress``. The fold's clean check, the native rendering and the runtime's view all read
    this one function.
    """
    if c.has_result:
        return "error" if c.error else "completed"
    reason = c.cancel_reason
    if reason is not None:
        if reason == "timeout":
            return "timeout"
        if c.cancel_outcome == "unknown":
            return "unknown"
        return "cancelled"
    if c.reply.interrupted and not c.started:
        return "cancelled"
    return IN_PROGRESS


def call_outcome(c: Call) -> tuple[str, Any]:
    """Rule 5: ``(status, output)``: the tool's own output, else a synthetic ``{"status": ...}`` object
    (``cancelled`` carries its ``reason``: ``interrupted`` for a call that never started)."""
    status = call_status(c)
    if c.has_result:
        return status, c.output
    if status == "cancelled":
        return status, {"status": status, "reason": c.cancel_reason or INTERRUPTED}
    return status, {"status": status}


def call_open(c: Call) -> bool:
    """An included call whose output is still ``in_progress`` (it keeps the state unclean)."""
    return c.included and call_status(c) == IN_PROGRESS


def arguments_text(value: Any) -> str:
    """Tool arguments as the JSON string every provider format carries (a blank string is ``{}``)."""
    if isinstance(value, str):
        return value if value.strip() else "{}"
    return canonical_text(value)


# ---------------------------------------------------------------------------------------------
# Read-only views for the runtime (resume, guarded tools).


@dataclass(frozen=True, slots=True)
class ToolCallState:
    """One tool call as folded so far (the runtime's exactly-once, resume and never-start checks)."""

    call_id: str
    name: str
    arguments: str
    reply: str
    included: bool
    started: bool
    status: str
    output: Any
    progress: Any
    has_progress: bool


@dataclass(frozen=True, slots=True)
class ReplyState:
    """One reply as folded so far (what :mod:`calltape.adapters.replies` and the runtime read)."""

    reply: str
    generating: bool
    awaiting_playout: bool
    interrupted: bool
    speech_started: bool
    heard: str
    """The context's text for the reply (rule 3)."""
    seq: int = 0
    """The seq at which the reply began."""
    done: bool = False
    """``agent.reply.done`` was folded."""
    speech_ended: bool = False
    generated: str = ""
    """Every ``agent.text`` delta kept (late tokens of an interrupted reply excluded)."""
    reported_heard: str | None = None
    """The latest ``heard`` given by an event, None when none was."""

    @property
    def played(self) -> bool:
        """Played to its end uninterrupted (SPEC section 8): its speech ended, or, with nothing to play,
        it is done. What a heard-first effect and a wait for playout wait for. A step's reply whose
        speech ended counts even before it is done (LiveKit marks it done only after the step's tools
        ran: waiting for that would be a deadlock)."""
        if self.interrupted:
            return False
        return self.speech_ended or not (self.generating or self.awaiting_playout)


def call_state(c: Call) -> ToolCallState:
    """The public view of one call."""
    status, output = call_outcome(c)
    return ToolCallState(
        call_id=c.id,
        name=c.name,
        arguments=c.arguments,
        reply=c.reply.id,
        included=c.included,
        started=c.started,
        status=status,
        output=output,
        progress=c.progress,
        has_progress=c.has_progress,
    )
