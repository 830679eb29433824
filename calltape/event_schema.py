"""Each event type's ``data``, defined once (SPEC section 1's second table), as msgspec Structs.

This table is the single source of the event schema. :mod:`calltape.events` generates from it the
compiled check every event of a known type passes on the hot path (``msgspec.convert`` into the
type's Struct, strict), and the pydantic models at the public edge (``SessionStartedData`` …), which
give lax coercion and the one-sentence error messages. A field added here is checked on every path
at once; ``tests/test_event_schema.py`` holds the generated models to these Structs field by field.

Structs only check: ``data`` stays a plain dict inside calltape, because adapters attach fields of
their own that a Struct would drop (extra fields are kept, stored and exported).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal

import msgspec
import orjson

Count = Annotated[int, msgspec.Meta(ge=0)]
"""A whole number from 0 (a seq before the first event, a number of spans)."""
Positive = Annotated[int, msgspec.Meta(ge=1)]
"""A whole number from 1 (an epoch)."""


def json_arguments(value: Any) -> Any:
    """``tool.call`` arguments: an object, or a string that is blank or JSON (what providers send)."""
    if isinstance(value, str):
        if value.strip():
            try:
                orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                raise ValueError("arguments is a string that is not valid JSON") from exc
    elif not isinstance(value, Mapping):
        raise ValueError("arguments must be an object or a JSON string")
    return value


class Data(msgspec.Struct, kw_only=True, gc=False):
    """The base of every type's data: fields by keyword, and ``checks``, the per-field rules a
    type annotation cannot say. A Struct with checks runs them in ``__post_init__`` (msgspec calls it
    after converting the fields); the pydantic model runs the same functions as before-validators.
    Only such a Struct defines ``__post_init__``: a Python call per event costs the others nothing."""

    checks: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}


class SessionStarted(Data):
    """``session.started``: the agent, its instructions, the modality, the tenant and where it came from."""

    agent: str
    instructions: str | None = None
    modality: Literal["voice", "text"] = "voice"
    tenant: str | None = None
    framework: str | None = None
    metadata: dict[str, Any] | None = None


class SessionEnded(Data):
    """``session.ended``: the call ended normally."""

    reason: str | None = None


class SessionDropped(Data):
    """``session.dropped``: the transport or the agent process was lost mid-call."""

    reason: str | None = None


class SessionRedacted(Data):
    """``session.redacted``: which kinds were redacted and how many spans (never the values)."""

    kinds: list[str]
    spans: Count


class SessionResumed(Data):
    """``session.resumed``: the new agent and epoch, and the seq the resume settled from."""

    agent: str
    epoch: Positive
    from_seq: Count


class AgentHandoff(Data):
    """``agent.handoff``: another agent takes the call, with its instructions."""

    from_: str = msgspec.field(name="from")
    to: str
    instructions: str | None = None
    reason: str | None = None


class AgentInstructions(Data):
    """``agent.instructions``: the current agent's system prompt changed."""

    text: str


class UserSpeechStarted(Data):
    """``user.speech.started``: a VAD edge (or an API signal) that the user began speaking."""

    source: Literal["vad", "api"] | None = None


class Empty(Data):
    """Types that carry no data (``user.speech.stopped``)."""


class UserTranscript(Data):
    """``user.transcript``: an STT result; interims replace each other, finals add up."""

    text: str
    final: bool


class UserText(Data):
    """``user.text``: typed or injected user input, final at once."""

    text: str


class Reply(Data):
    """Types that name one reply (an LLM generation): reply started/done, speech started."""

    reply: str


class AgentText(Data):
    """``agent.text``: a chunk of generated text of a reply."""

    reply: str
    text: str


class AgentSpeechProgress(Data):
    """``agent.speech.progress``: everything the user has heard of the reply so far."""

    reply: str
    heard: str


class AgentSpeechEnded(Data):
    """``agent.speech.ended``: playout stopped; ``heard`` is the final word on what was heard."""

    reply: str
    interrupted: bool
    heard: str | None = None


class Interruption(Data):
    """``interruption``: a barge-in cancels the reply (default: the latest) and stops its playout."""

    reply: str | None = None
    cause: str | None = None
    heard: str | None = None


class ToolCall(Data):
    """``tool.call``: the LLM asked for a tool call within a reply."""

    checks: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"arguments": json_arguments}

    call: str
    name: str
    arguments: dict[str, Any] | str
    reply: str | None = None

    def __post_init__(self) -> None:
        """Runs :attr:`checks`."""
        for name, check in self.checks.items():
            check(getattr(self, name))


class ToolRef(Data):
    """Types that name one tool call (``tool.started``): from here on it may have had side effects."""

    call: str


class ToolProgress(Data):
    """``tool.progress``: a checkpoint inside a tool, the state a resume hands back."""

    call: str
    state: Any
    message: str | None = None


class ToolResult(Data):
    """``tool.result``: the tool finished with this output (``error`` when it failed)."""

    call: str
    output: Any
    error: bool | None = None


class ToolCancelled(Data):
    """``tool.cancelled``: the tool was stopped or will never report, and whether it may have run."""

    call: str
    reason: str
    outcome: Literal["not_run", "unknown"] | None = None


class ToolEffect(Data):
    """``tool.effect``: one phase of a real-world action ``(name, key)`` run for the call ``call``
    (SPEC section 8). The key names the action itself, so a new call id asking for it again finds it."""

    call: str
    name: str
    key: str
    phase: Literal["started", "done", "failed", "unknown"]
    output: Any = None
    heard: bool | None = None


SCHEMA: dict[str, type[Data]] = {
    "session.started": SessionStarted,
    "session.ended": SessionEnded,
    "session.dropped": SessionDropped,
    "session.resumed": SessionResumed,
    "session.redacted": SessionRedacted,
    "agent.handoff": AgentHandoff,
    "agent.instructions": AgentInstructions,
    "user.speech.started": UserSpeechStarted,
    "user.speech.stopped": Empty,
    "user.transcript": UserTranscript,
    "user.text": UserText,
    "agent.reply.started": Reply,
    "agent.text": AgentText,
    "agent.reply.done": Reply,
    "agent.speech.started": Reply,
    "agent.speech.progress": AgentSpeechProgress,
    "agent.speech.ended": AgentSpeechEnded,
    "interruption": Interruption,
    "tool.call": ToolCall,
    "tool.started": ToolRef,
    "tool.progress": ToolProgress,
    "tool.result": ToolResult,
    "tool.cancelled": ToolCancelled,
    "tool.effect": ToolEffect,
}
"""Every known event type and the Struct its ``data`` is checked against (``x.*`` extensions: none)."""
