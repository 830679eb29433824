"""The event wire format (SPEC section 1).

Pydantic models are the schema: they validate what enters calltape (emit, import, the API).
Inside, an event travels as an :class:`Event` record — a slotted dataclass with a plain ``data``
dict — because the log is replayed by the hundred thousand and stored events were validated
when they were appended.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, Union

import orjson
import uuid_utils
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from calltape.errors import InvalidEvent

# ---------------------------------------------------------------------------------------------
# Time: RFC 3339 with millisecond precision on the wire, integer milliseconds inside.


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def format_time(at_ms: int) -> str:
    dt = datetime.fromtimestamp(at_ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at_ms % 1000:03d}Z"


def parse_time(value: str) -> int:
    """RFC 3339 (``Z`` or an offset) to epoch milliseconds; a naive time is taken as UTC."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(text)
    except ValueError as exc:
        raise InvalidEvent(f"'{value}' is not an RFC 3339 time") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def new_event_id() -> str:
    return str(uuid_utils.uuid7())


# ---------------------------------------------------------------------------------------------
# The record that flows through the store, the recorder and the projections.


@dataclass(slots=True)
class Event:
    type: str
    data: dict[str, Any]
    session: str
    id: str = field(default_factory=new_event_id)
    at_ms: int = field(default_factory=now_ms)
    agent: str | None = None
    epoch: int | None = None
    seq: int | None = None

    def with_seq(self, seq: int) -> Event:
        return replace(self, seq=seq)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"id": self.id, "session": self.session}
        if self.seq is not None:
            wire["seq"] = self.seq
        wire["type"] = self.type
        wire["at"] = format_time(self.at_ms)
        if self.agent is not None:
            wire["agent"] = self.agent
        if self.epoch is not None:
            wire["epoch"] = self.epoch
        wire["data"] = self.data
        return wire

    def to_json(self) -> bytes:
        """One JSONL line; ``data`` keys sorted, so both backends export byte-identical lines
        (PostgreSQL's jsonb does not keep key order)."""
        wire = self.to_wire()
        wire["data"] = orjson.Fragment(orjson.dumps(self.data, option=orjson.OPT_SORT_KEYS))
        return orjson.dumps(wire)


# ---------------------------------------------------------------------------------------------
# Typed data, one model per event type.


class _Data(BaseModel):
    # Extra fields are kept: adapters attach framework details that projections ignore.
    model_config = ConfigDict(extra="allow", frozen=True)


class SessionStartedData(_Data):
    agent: str
    instructions: str | None = None
    modality: Literal["voice", "text"] = "voice"
    tenant: str | None = None
    framework: str | None = None
    metadata: dict[str, Any] | None = None


class SessionEndedData(_Data):
    reason: str | None = None


class SessionDroppedData(_Data):
    reason: str | None = None


class SessionResumedData(_Data):
    agent: str
    epoch: int = Field(ge=1)
    from_seq: int = Field(ge=0)


class AgentHandoffData(_Data):
    from_: str = Field(alias="from")
    to: str
    instructions: str | None = None
    reason: str | None = None


class AgentInstructionsData(_Data):
    text: str


class UserSpeechStartedData(_Data):
    source: Literal["vad", "api"] | None = None


class EmptyData(_Data):
    pass


class UserTranscriptData(_Data):
    text: str
    final: bool


class UserTextData(_Data):
    text: str


class ReplyData(_Data):
    reply: str


class AgentTextData(_Data):
    reply: str
    text: str


class AgentSpeechProgressData(_Data):
    reply: str
    heard: str


class AgentSpeechEndedData(_Data):
    reply: str
    interrupted: bool
    heard: str | None = None


class InterruptionData(_Data):
    reply: str | None = None
    cause: str | None = None
    heard: str | None = None


class ToolCallData(_Data):
    call: str
    name: str
    arguments: dict[str, Any] | str
    reply: str | None = None

    @field_validator("arguments", mode="before")
    @classmethod
    def _json_arguments(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.strip():
                try:
                    orjson.loads(value)
                except orjson.JSONDecodeError as exc:
                    raise ValueError("arguments is a string that is not valid JSON") from exc
        elif not isinstance(value, Mapping):
            raise ValueError("arguments must be an object or a JSON string")
        return value


class ToolRefData(_Data):
    call: str


class ToolProgressData(_Data):
    call: str
    state: Any
    message: str | None = None


class ToolResultData(_Data):
    call: str
    output: Any
    error: bool | None = None


class ToolCancelledData(_Data):
    call: str
    reason: str
    outcome: Literal["not_run", "unknown"] | None = None


class ExtensionData(_Data):
    pass


DATA_MODELS: dict[str, type[_Data]] = {
    "session.started": SessionStartedData,
    "session.ended": SessionEndedData,
    "session.dropped": SessionDroppedData,
    "session.resumed": SessionResumedData,
    "agent.handoff": AgentHandoffData,
    "agent.instructions": AgentInstructionsData,
    "user.speech.started": UserSpeechStartedData,
    "user.speech.stopped": EmptyData,
    "user.transcript": UserTranscriptData,
    "user.text": UserTextData,
    "agent.reply.started": ReplyData,
    "agent.text": AgentTextData,
    "agent.reply.done": ReplyData,
    "agent.speech.started": ReplyData,
    "agent.speech.progress": AgentSpeechProgressData,
    "agent.speech.ended": AgentSpeechEndedData,
    "interruption": InterruptionData,
    "tool.call": ToolCallData,
    "tool.started": ToolRefData,
    "tool.progress": ToolProgressData,
    "tool.result": ToolResultData,
    "tool.cancelled": ToolCancelledData,
}

EVENT_TYPES: frozenset[str] = frozenset(DATA_MODELS)


def is_extension(event_type: str) -> bool:
    return event_type.startswith("x.") and len(event_type) > 2


# ---------------------------------------------------------------------------------------------
# Envelope models and the discriminated union.


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str | None = Field(default=None, min_length=1)
    session: str = Field(min_length=1)
    seq: int | None = Field(default=None, ge=1)
    at: datetime | None = None
    agent: str | None = None
    epoch: int | None = Field(default=None, ge=1)

    @field_validator("at", mode="before")
    @classmethod
    def _rfc3339(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            try:
                return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
            except ValueError:
                raise ValueError(f"'{value}' is not an RFC 3339 time") from None
        return value


def _envelope(event_type: str, data_model: type[_Data]) -> type[_Envelope]:
    name = "".join(part.capitalize() for part in event_type.split(".")) + "Event"
    model: type[_Envelope] = type(
        name,
        (_Envelope,),
        {
            "__annotations__": {"type": Literal[event_type], "data": data_model},
            "__module__": __name__,
            "__doc__": f"The `{event_type}` event.",
        },
    )
    return model


ENVELOPE_MODELS: dict[str, type[_Envelope]] = {t: _envelope(t, m) for t, m in DATA_MODELS.items()}


class ExtensionEvent(_Envelope):
    """A user extension (`x.<anything>`): stored and exported, ignored by projections."""

    type: str
    data: dict[str, Any] = Field(default_factory=dict)


def _discriminate(value: Any) -> str | None:
    event_type = value.get("type") if isinstance(value, Mapping) else getattr(value, "type", None)
    if not isinstance(event_type, str):
        return None
    if event_type in ENVELOPE_MODELS:
        return event_type
    if is_extension(event_type):
        return "x"
    return None


_TAGGED: tuple[Any, ...] = (
    *(Annotated[m, Tag(t)] for t, m in ENVELOPE_MODELS.items()),
    Annotated[ExtensionEvent, Tag("x")],
)
WireEvent: Any = Annotated[Union[_TAGGED], Discriminator(_discriminate)]  # noqa: UP007 - a runtime-built Union
"""The discriminated union of every wire event (for JSON Schema and strict validation)."""

_WIRE_ADAPTER: TypeAdapter[Any] = TypeAdapter(WireEvent)


# ---------------------------------------------------------------------------------------------
# Validation entry points.


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = list(err["loc"])
    if loc and (loc[0] in ENVELOPE_MODELS or loc[0] == "x"):
        loc = loc[1:]  # the union's tag, not a field
    where = ".".join(str(p) for p in loc)
    where = where.replace("from_", "from")
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"'{where}' is missing"
    if err["type"] == "extra_forbidden":
        return f"'{where}' is not a field of an event"
    return f"'{where}': {msg[0].lower()}{msg[1:]}" if where else msg


def _dump_data(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def validate_data(event_type: str, data: Mapping[str, Any] | None) -> dict[str, Any]:
    """Checks one event's ``data`` against its type; returns the normalized dict."""
    model = DATA_MODELS.get(event_type)
    if model is None:
        if is_extension(event_type):
            return dict(data or {})
        raise InvalidEvent(f"unknown event type '{event_type}' (use 'x.<name>' for extensions)")
    try:
        return _dump_data(model.model_validate(data or {}))
    except ValidationError as exc:
        raise InvalidEvent(f"{event_type}: data {_first_error(exc)}") from None


def parse_event(obj: Any) -> Event:
    """Validates one wire event (a dict or JSON text) into an :class:`Event`.

    Missing ``id`` and ``at`` are generated; ``seq`` is kept only as information (the store assigns
    its own).
    """
    if isinstance(obj, (bytes, str)):
        try:
            obj = orjson.loads(obj)
        except orjson.JSONDecodeError as exc:
            raise InvalidEvent(f"not valid JSON ({exc.args[0].split(':')[0]})") from None
    if not isinstance(obj, Mapping):
        raise InvalidEvent("an event must be a JSON object")
    event_type = obj.get("type")
    if not isinstance(event_type, str):
        raise InvalidEvent("'type' is missing" if event_type is None else "'type' must be a string")
    if _discriminate(obj) is None:
        raise InvalidEvent(f"unknown event type '{event_type}' (use 'x.<name>' for extensions)")
    try:
        model = _WIRE_ADAPTER.validate_python(obj)
    except ValidationError as exc:
        raise InvalidEvent(f"{event_type}: {_first_error(exc)}") from None
    data = model.data if isinstance(model, ExtensionEvent) else _dump_data(model.data)
    at_ms = now_ms()
    if model.at is not None:
        at = model.at if model.at.tzinfo else model.at.replace(tzinfo=UTC)
        at_ms = (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    return Event(
        type=event_type,
        data=data,
        session=model.session,
        id=model.id or new_event_id(),
        at_ms=at_ms,
        agent=model.agent,
        epoch=model.epoch,
        seq=model.seq,
    )


def make_event(
    session: str,
    event_type: str,
    data: Mapping[str, Any] | None = None,
    *,
    id: str | None = None,
    at_ms: int | None = None,
    agent: str | None = None,
    epoch: int | None = None,
) -> Event:
    """Builds a validated event from Python values (the recorder's and the API's entry point)."""
    if not session:
        raise InvalidEvent("an event needs a session id")
    return Event(
        type=event_type,
        data=validate_data(event_type, data),
        session=session,
        id=id or new_event_id(),
        at_ms=now_ms() if at_ms is None else at_ms,
        agent=agent,
        epoch=epoch,
    )


def load_stored(
    *,
    session: str,
    seq: int,
    id: str,
    type: str,
    at_ms: int,
    agent: str | None,
    epoch: int | None,
    data: Any,
) -> Event:
    """Trusts a stored row (validated when it was appended); ``data`` may still be JSON text."""
    if isinstance(data, (str, bytes)):
        data = orjson.loads(data)
    return Event(type=type, data=data, session=session, id=id, at_ms=at_ms, agent=agent, epoch=epoch, seq=seq)


def dumps_jsonl(events: Iterable[Event]) -> bytes:
    return b"".join(e.to_json() + b"\n" for e in events)
