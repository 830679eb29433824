"""The event wire format (SPEC section 1).

Each type's ``data`` is defined once, as a msgspec Struct in :mod:`calltape.event_schema`. From it
come both checks of what enters calltape (emit, import, the API): the usual event is converted into
its Struct by msgspec (strict, compiled) and walked once for the limits both databases share; the
rest (a lax coercion, a fault) goes through the pydantic models generated from the same Structs,
which are the public edge and the source of every error sentence. :func:`make_event` (every emit)
first tries a plain Python check generated per type from the same Struct, which decides only the
plain case (about half the CPU of the msgspec conversion and walk) and hands anything else on.
Inside, an event travels as an :class:`Event` record — a ``msgspec.Struct`` the cyclic GC does not
track, with a plain ``data`` dict, built once — because the log is replayed by the hundred thousand,
stored events were validated when they were appended, and a Struct for ``data`` would drop the extra
fields adapters attach. The
row's ``data`` is encoded by orjson (a dict with extras; msgspec's encoder measured slower on those).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec
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
    create_model,
    field_validator,
)
from pydantic_core import PydanticSerializationError

from calltape.canonical_json import canonical_bytes
from calltape.errors import InvalidEvent
from calltape.event_schema import (
    SCHEMA,
    AgentHandoff,
    AgentInstructions,
    AgentSpeechEnded,
    AgentSpeechProgress,
    AgentText,
    Data,
    Empty,
    Interruption,
    Reply,
    SessionDropped,
    SessionEnded,
    SessionRedacted,
    SessionResumed,
    SessionStarted,
    ToolCall,
    ToolCancelled,
    ToolEffect,
    ToolProgress,
    ToolRef,
    ToolResult,
    UserSpeechStarted,
    UserText,
    UserTranscript,
)

# ---------------------------------------------------------------------------------------------
# Time: RFC 3339 with millisecond precision on the wire, integer milliseconds inside.


def now_ms() -> int:
    """Now, in integer epoch milliseconds (the unit of ``at`` inside calltape)."""
    return time.time_ns() // 1_000_000


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def format_time(at_ms: int) -> str:
    """RFC 3339 with milliseconds; years below 1000 keep four digits (``strftime`` drops them on Linux)."""
    dt = _EPOCH + timedelta(milliseconds=at_ms)
    return (
        f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}.{at_ms % 1000:03d}Z"
    )


def to_datetime(value: str) -> datetime:
    """RFC 3339 (``Z`` or an offset) as an aware datetime; a naive time is taken as UTC.
    Raises ``ValueError``: the one parser every time on the wire goes through."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    dt = datetime.fromisoformat(text)
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def datetime_ms(dt: datetime) -> int:
    """An aware datetime as epoch milliseconds."""
    return (dt - _EPOCH) // timedelta(milliseconds=1)


def parse_time(value: str) -> int:
    """RFC 3339 (``Z`` or an offset) to epoch milliseconds; a naive time is taken as UTC."""
    try:
        return datetime_ms(to_datetime(value))
    except ValueError as exc:
        raise InvalidEvent(f"'{value}' is not an RFC 3339 time") from exc


def new_event_id() -> str:
    """A fresh event id: a UUIDv7, so ids sort roughly by creation time."""
    return str(uuid_utils.uuid7())


_uuid7 = uuid_utils.uuid7
_time_ns = time.time_ns


# ---------------------------------------------------------------------------------------------
# The record that flows through the store, the recorder and the projections.


class Event(msgspec.Struct, gc=False, eq=False):
    """One event as calltape handles it inside: a slotted record, validated once at the boundary.

    ``at_ms`` is integer milliseconds (RFC 3339 only on the wire); ``seq`` is set by the store.
    Not tracked by the cyclic GC (``gc=False``): an event never refers back to itself, and a call's
    events in flight (queued, in a batch, in a fold) were most of what each collection walked and most
    of what got promoted to the oldest generation, whose full collections paused a busy recorder
    (issue 32). Its ``data`` is tracked as any dict is. Equal when every field but the two marks is.
    """

    type: str
    data: dict[str, Any]
    session: str
    id: str = msgspec.field(default_factory=new_event_id)
    at_ms: int = msgspec.field(default_factory=now_ms)
    agent: str | None = None
    epoch: int | None = None
    seq: int | None = None
    checked: bool = False
    """Passed :func:`check_event` (built by :func:`make_event`/:func:`parse_event`, or read from the store)."""
    redacted: bool = False
    """Already passed the writer's redaction rules (the store does not run them again)."""

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Event:
            return NotImplemented
        assert isinstance(other, Event)
        return (
            self.id == other.id
            and self.seq == other.seq
            and self.session == other.session
            and self.type == other.type
            and self.at_ms == other.at_ms
            and self.agent == other.agent
            and self.epoch == other.epoch
            and self.data == other.data
        )

    __hash__ = None  # type: ignore[assignment]  # mutable (seq is set by the store), as before

    def with_seq(self, seq: int) -> Event:
        """A copy with the store-assigned ``seq``."""
        return msgspec.structs.replace(self, seq=seq)

    def to_wire(self) -> dict[str, Any]:
        """The event as a wire-format dict (what export writes and import reads)."""
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
        wire["data"] = orjson.Fragment(canonical_bytes(self.data))
        return orjson.dumps(wire)


# ---------------------------------------------------------------------------------------------
# Limits: what both databases store and what round-trips through export and import. PostgreSQL
# refuses NUL in text and jsonb, keeps epochs and seqs in a 4-byte integer, and indexes ids in a
# B-tree whose entries must stay under about 2.7 KB; orjson writes only 64-bit integers and no NaN;
# RFC 3339 has four-digit years. Checking here, once, means SQLite never accepts what PostgreSQL
# would refuse, and no database error ever surfaces as "unexpected".

MAX_ID_CHARS = 256
"""Longest session id, event id or agent name."""
MAX_TYPE_CHARS = 128
"""Longest event type (``x.`` extensions included)."""
MAX_DEPTH = 64
"""Deepest nesting of objects and arrays inside ``data``."""
MAX_DATA_BYTES = 4_000_000
"""Largest ``data`` once encoded as JSON."""
MAX_EPOCH = 2**31 - 1
"""Largest epoch or seq (a PostgreSQL ``integer``)."""
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
_INF = float("inf")
MIN_AT_MS = -62_135_596_800_000
"""0001-01-01T00:00:00.000Z, the earliest RFC 3339 time."""
MAX_AT_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z, the latest RFC 3339 time."""


def _text_fault(value: str) -> str | None:
    """What keeps ``value`` out of both databases (a NUL, a lone surrogate), or None."""
    if "\x00" in value:
        return "contains a NUL character"
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            return "is not valid Unicode (a lone surrogate)"
    return None


def _check_text(what: str, value: object, limit: int | None) -> None:
    if type(value) is not str:
        if not isinstance(value, str):
            raise InvalidEvent(f"{what} must be a string")
    elif limit is not None and len(value) > limit:
        raise InvalidEvent(f"{what} is longer than {limit} characters")
    fault = _text_fault(value)
    if fault is not None:
        raise InvalidEvent(f"{what} {fault}")


_BASES: tuple[tuple[Any, Any], ...] = (
    (str, str),
    (int, int),
    (float, float),
    (Mapping, dict),
    ((list, tuple), list),
)


def _not_json(type_name: str) -> InvalidEvent:
    """The one sentence for a Python value in ``data`` that JSON cannot hold, named by its type."""
    article = "an" if type_name.lstrip("_")[:1].lower() in ("a", "e", "i", "o", "u") else "a"
    return InvalidEvent(f"'data' holds {article} {type_name}, which is not a JSON value")


def _check_value(value: Any, depth: int, strict: bool = False) -> int:
    """Walks ``data`` and returns a bound on its JSON size (a character takes at most six bytes, an
    escape). A message names where, never what: content stays out of errors. The common types are
    tested first and no message is built unless there is a fault: this runs for every event.
    ``strict`` (the fast reader) refuses anything but the exact JSON types (a tuple, a subclass)."""
    kind = type(value)
    if kind is str:
        if "\x00" in value or not value.isascii():
            fault = _text_fault(value)
            if fault is not None:
                raise InvalidEvent(f"a string in 'data' {fault}")
        return 6 * len(value) + 2
    if kind is dict:
        if depth >= MAX_DEPTH:
            raise InvalidEvent(f"'data' is nested deeper than {MAX_DEPTH} levels")
        size = 2
        for key, item in value.items():
            if type(key) is not str:
                raise InvalidEvent("a key in 'data' is not a string")
            if "\x00" in key or not key.isascii():
                fault = _text_fault(key)
                if fault is not None:
                    raise InvalidEvent(f"a key in 'data' {fault}")
            size += 6 * len(key) + 4 + _check_value(item, depth + 1, strict)
        return size
    if kind is bool or value is None:
        return 5
    if kind is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise InvalidEvent("a number in 'data' does not fit in 64 bits")
        return 20
    if kind is float:
        if value != value or value in (_INF, -_INF):
            raise InvalidEvent("a number in 'data' is not finite")
        return 24
    if kind is list or (kind is tuple and not strict):
        if depth >= MAX_DEPTH:
            raise InvalidEvent(f"'data' is nested deeper than {MAX_DEPTH} levels")
        size = 2
        for item in value:
            size += 1 + _check_value(item, depth + 1, strict)
        return size
    for base, convert in () if strict else _BASES:  # subclasses (a str enum, a Mapping): as their base type
        if isinstance(value, base):
            return _check_value(convert(value), depth)
    raise _not_json(kind.__name__)


def _check_envelope_text(event: Event) -> None:
    _check_text("'session'", event.session, MAX_ID_CHARS)
    if not event.session:
        raise InvalidEvent("an event needs a session id")
    _check_text("'id'", event.id, MAX_ID_CHARS)
    if not event.id:
        raise InvalidEvent("'id' must not be empty")
    _check_text("'type'", event.type, MAX_TYPE_CHARS)
    if event.agent is not None:
        _check_text("'agent'", event.agent, MAX_ID_CHARS)


def check_event(event: Event) -> Event:
    """Checks an event against the limits both databases share; marks it checked and returns it."""
    _check_envelope(event)
    if not isinstance(event.data, dict):
        raise InvalidEvent("'data' must be an object")
    if _check_value(event.data, 0) > MAX_DATA_BYTES:  # measured only when it might be too big
        if len(orjson.dumps(event.data)) > MAX_DATA_BYTES:
            raise InvalidEvent(f"'data' is larger than {MAX_DATA_BYTES} bytes as JSON")
    event.checked = True
    return event


def _check_envelope(event: Event) -> None:
    """The limits on everything but ``data``."""
    session, event_id, event_type, agent = event.session, event.id, event.type, event.agent
    if not (  # the usual case in one pass; anything else gets the detailed checks and their message
        type(session) is str
        and type(event_id) is str
        and type(event_type) is str
        and (agent is None or (type(agent) is str and len(agent) <= MAX_ID_CHARS))
        and 0 < len(session) <= MAX_ID_CHARS
        and 0 < len(event_id) <= MAX_ID_CHARS
        and len(event_type) <= MAX_TYPE_CHARS
        and (joined := f"{session}{event_id}{event_type}{agent or ''}").isascii()
        and "\x00" not in joined
    ):
        _check_envelope_text(event)
    if type(event.at_ms) is not int:
        raise InvalidEvent("'at' must be a time (integer milliseconds inside calltape)")
    if not MIN_AT_MS <= event.at_ms <= MAX_AT_MS:
        raise InvalidEvent("'at' must lie within the years 1 to 9999")
    for name, number in (("epoch", event.epoch), ("seq", event.seq)):
        if number is not None and (type(number) is not int or not 1 <= number <= MAX_EPOCH):
            raise InvalidEvent(f"'{name}' must be a whole number from 1 to {MAX_EPOCH}")


def ensure_checked(event: Event) -> Event:
    """The store's gate: an event that did not come through :func:`make_event` or :func:`parse_event`
    (an :class:`Event` built by hand) is validated in full before it can be written."""
    if event.checked:
        return event
    if not isinstance(event.type, str):
        raise InvalidEvent("'type' must be a string")
    if not isinstance(event.data, dict):
        raise InvalidEvent("'data' must be an object")
    event.data = validate_data(event.type, event.data)
    return check_event(event)


# ---------------------------------------------------------------------------------------------
# Typed data: the pydantic models at the public edge, generated from the one schema.


class _Data(BaseModel):
    # Extra fields are kept: adapters attach framework details that projections ignore.
    model_config = ConfigDict(extra="allow", frozen=True)


_META_CONSTRAINTS = ("gt", "ge", "lt", "le", "multiple_of", "min_length", "max_length", "pattern")


def _edge_type(annotation: Any) -> Any:
    """A Struct field's type as pydantic reads it: msgspec's ``Meta`` constraints become a ``Field``."""
    if get_origin(annotation) is not Annotated:
        return annotation
    base, *metadata = get_args(annotation)
    constraints = {
        name: getattr(meta, name)
        for meta in metadata
        if isinstance(meta, msgspec.Meta)
        for name in _META_CONSTRAINTS
        if getattr(meta, name) is not None
    }
    return Annotated[base, Field(**constraints)]


def _before(check: Any) -> Any:
    """A Struct's per-field check as a pydantic before-validator (the same function, one message)."""
    return classmethod(lambda cls, value: check(value))


def _edge_model(struct: type[Data]) -> type[_Data]:
    """The pydantic model of one Struct: the same fields, wire names, defaults, constraints and checks."""
    fields: dict[str, Any] = {}
    for spec in msgspec.structs.fields(struct):
        default = ... if spec.required else spec.default
        alias = spec.encode_name if spec.encode_name != spec.name else None
        fields[spec.name] = (_edge_type(spec.type), Field(default, alias=alias))
    validators = {
        f"_check_{name}": field_validator(name, mode="before")(_before(check)) for name, check in struct.checks.items()
    }
    model: type[_Data] = create_model(
        f"{struct.__name__}Data",
        __base__=_Data,
        __doc__=struct.__doc__,
        __module__=__name__,
        __validators__=validators,
        **fields,
    )
    return model


_EDGE: dict[type[Data], type[_Data]] = {s: _edge_model(s) for s in dict.fromkeys(SCHEMA.values())}

DATA_MODELS: dict[str, type[_Data]] = {t: _EDGE[s] for t, s in SCHEMA.items()}
"""Each known type's pydantic model (generated from :data:`calltape.event_schema.SCHEMA`)."""

EVENT_TYPES: frozenset[str] = frozenset(SCHEMA)

SessionStartedData = _EDGE[SessionStarted]
SessionEndedData = _EDGE[SessionEnded]
SessionDroppedData = _EDGE[SessionDropped]
SessionRedactedData = _EDGE[SessionRedacted]
SessionResumedData = _EDGE[SessionResumed]
AgentHandoffData = _EDGE[AgentHandoff]
AgentInstructionsData = _EDGE[AgentInstructions]
UserSpeechStartedData = _EDGE[UserSpeechStarted]
EmptyData = _EDGE[Empty]
UserTranscriptData = _EDGE[UserTranscript]
UserTextData = _EDGE[UserText]
ReplyData = _EDGE[Reply]
AgentTextData = _EDGE[AgentText]
AgentSpeechProgressData = _EDGE[AgentSpeechProgress]
AgentSpeechEndedData = _EDGE[AgentSpeechEnded]
InterruptionData = _EDGE[Interruption]
ToolCallData = _EDGE[ToolCall]
ToolRefData = _EDGE[ToolRef]
ToolProgressData = _EDGE[ToolProgress]
ToolResultData = _EDGE[ToolResult]
ToolCancelledData = _EDGE[ToolCancelled]
ToolEffectData = _EDGE[ToolEffect]


class ExtensionData(_Data):
    """``x.*`` events: any data, stored and exported, never folded."""

    pass


EventType = Literal[
    "session.started",
    "session.ended",
    "session.dropped",
    "session.resumed",
    "session.redacted",
    "agent.handoff",
    "agent.instructions",
    "user.speech.started",
    "user.speech.stopped",
    "user.transcript",
    "user.text",
    "agent.reply.started",
    "agent.text",
    "agent.reply.done",
    "agent.speech.started",
    "agent.speech.progress",
    "agent.speech.ended",
    "interruption",
    "tool.call",
    "tool.started",
    "tool.progress",
    "tool.result",
    "tool.cancelled",
    "tool.effect",
]
"""The event types of the wire format, for annotations and completion (``x.*`` extensions are
plain strings). A test keeps this in step with :data:`EVENT_TYPES`."""


def is_extension(event_type: str) -> bool:
    """Whether ``event_type`` is a user extension (``x.<anything>``), which projections ignore."""
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
            try:
                return to_datetime(value)
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


def _check_loose(value: Any, depth: int) -> None:
    """What the typed models' JSON dump would hide or fail on, refused as :func:`_check_value` refuses
    it in an extension's data: a number that is not finite (the dump would write ``null``), nesting
    deeper than :data:`MAX_DEPTH` (the dump would fail on recursion), bytes (not a JSON value). Other
    Python values (a date, a model, an enum) are left to the dump, which turns them into JSON."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return
    if isinstance(value, float):
        if value != value or value in (_INF, -_INF):
            raise InvalidEvent("a number in 'data' is not finite")
        return
    if isinstance(value, Mapping):
        items: Iterable[Any] = value.values()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raise _not_json(kind.__name__)
    else:
        return
    if depth >= MAX_DEPTH:
        raise InvalidEvent(f"'data' is nested deeper than {MAX_DEPTH} levels")
    for item in items:
        _check_loose(item, depth + 1)


def _unserializable(exc: Exception) -> InvalidEvent:
    """A value the typed dump could not turn into JSON, named by its type (never by its content)."""
    found = re.search(r"<class '([\w.]+)'>", str(exc)) if isinstance(exc, PydanticSerializationError) else None
    if found is not None:
        return _not_json(found.group(1).rsplit(".", 1)[-1])
    if isinstance(exc, RecursionError) or "depth" in str(exc):
        return InvalidEvent(f"'data' is nested deeper than {MAX_DEPTH} levels")
    return InvalidEvent("'data' holds a value that cannot be written as JSON")


def unknown_type(event_type: str) -> InvalidEvent:
    """The error for a type that is neither a known type nor an extension, naming the nearest type
    when there is one (a typo: ``user.transcrpt``)."""
    import difflib

    nearest = difflib.get_close_matches(event_type, DATA_MODELS, n=1, cutoff=0.75)
    hint = f"; did you mean '{nearest[0]}'?" if nearest else ""
    return InvalidEvent(f"unknown event type '{event_type}' (use 'x.<name>' for extensions){hint}")


def validate_data(event_type: str, data: Mapping[str, Any] | None) -> dict[str, Any]:
    """Checks one event's ``data`` against its type; returns the normalized dict. Anything wrong is an
    :class:`~calltape.errors.InvalidEvent` whose one sentence names where, never the value."""
    compiled = _COMPILED.get(event_type)
    if compiled is not None and (data is None or type(data) is dict):
        checked = _schema_data(compiled, data or {})
        if checked is not None:
            return checked
    model = DATA_MODELS.get(event_type)
    if model is None:
        if is_extension(event_type):
            return dict(data or {})
        raise unknown_type(event_type)
    _check_loose(data or {}, 0)
    try:
        return _dump_data(model.model_validate(data or {}))
    except ValidationError as exc:
        raise InvalidEvent(f"{event_type}: data {_first_error(exc)}") from None
    except (PydanticSerializationError, ValueError, TypeError, RecursionError) as exc:
        raise _unserializable(exc) from None


_WIRE_FIELDS = frozenset({"id", "session", "seq", "type", "at", "agent", "epoch", "data"})


# -- The compiled check, generated from the schema ----------------------------------------------
# The usual ``data`` (exact JSON types, as orjson gives them or a caller builds them) is checked by
# msgspec against its type's Struct, strict, and walked once for the limits; what passes is exactly
# what the edge model would validate and dump. Anything else (a coercion, a fault, a foreign type)
# returns None and goes through the pydantic models, which give the same result for what they accept
# and the error message for what they refuse. A property test holds the two paths equal.


@dataclass(frozen=True, slots=True)
class _Compiled:
    """One Struct as the hot path runs it: the Struct msgspec converts into, and the dump's shape
    (every field by wire name in declared order, with the default the dump writes when it is absent)."""

    struct: type[Data]
    fields: tuple[tuple[str, Any], ...]
    names: frozenset[str]
    exact: tuple[str, ...] | None
    """The field names when every field is required and never None: data with exactly these keys,
    in this order, is its own dump (the hot types: a reply's text, a transcript, a tool reference)."""
    flat: bool
    """Every field is a string or a boolean: a line the import's reader trusts needs no walk of it."""


def _never_none(kind: msgspec.inspect.Type) -> bool:
    if isinstance(kind, (msgspec.inspect.AnyType, msgspec.inspect.NoneType)):
        return False
    if isinstance(kind, msgspec.inspect.UnionType):
        return all(_never_none(member) for member in kind.types)
    return True


def _compile(struct: type[Data]) -> _Compiled:
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    fields = tuple((spec.encode_name, None if spec.required else spec.default) for spec in info.fields)
    total = all(spec.required and _never_none(spec.type) for spec in info.fields)
    exact = tuple(name for name, _ in fields) if total else None
    flat = all(isinstance(spec.type, (msgspec.inspect.StrType, msgspec.inspect.BoolType)) for spec in info.fields)
    return _Compiled(struct, fields, frozenset(name for name, _ in fields), exact, flat)


_COMPILED: dict[str, _Compiled] = {t: _compile(s) for t, s in SCHEMA.items()}

_TRUSTED_LINE = MAX_DATA_BYTES // 8
"""A line up to this long cannot hold ``data`` over the limit (a number re-encodes at most 8 times longer)."""


def _schema_data(compiled: _Compiled | None, data: dict[str, Any], trusted: bool = False) -> dict[str, Any] | None:
    """``data`` checked and shaped as its edge model would validate and dump it (None values left out,
    declared fields first, defaults filled), an extension's (``compiled`` None) as it is; None for
    anything only pydantic decides.

    ``trusted``: read by orjson from a line of at most :data:`_TRUSTED_LINE` bytes without a ``\\u0000``
    escape, so every string is valid Unicode without NUL, every number finite and the size within the
    limit; only nested values and integers are walked."""
    if compiled is None:
        out = dict(data)
    else:
        try:
            msgspec.convert(data, compiled.struct, strict=True)
        except (msgspec.ValidationError, UnicodeEncodeError):  # msgspec encodes a wrong-typed lone surrogate
            return None
        if compiled.exact is not None and tuple(data) == compiled.exact:
            if trusted:  # just read from its line: nobody else holds it
                if compiled.flat:
                    return data
                out = data
            else:
                out = dict(data)
        else:
            out = {}
            for name, default in compiled.fields:
                value = data.get(name, default)
                if value is not None:
                    out[name] = value
            if not data.keys() <= compiled.names:
                for key, value in data.items():
                    if value is not None and key not in out:
                        out[key] = value
    try:
        if trusted:
            for value in out.values():
                kind = type(value)
                if kind is dict or kind is list:
                    _check_value(value, 1, True)
                elif kind is int and not _INT_MIN <= value <= _INT_MAX:
                    return None
        elif _check_value(out, 0, True) > MAX_DATA_BYTES and len(orjson.dumps(out)) > MAX_DATA_BYTES:
            return None
    except InvalidEvent:
        return None
    return out


# -- The per-type fast check, generated from the schema -----------------------------------------
# What make_event runs first for a known type: one function per Struct, generated from its fields,
# that reads each declared field once, checks its type, text and size inline, and builds the dump in
# declared order. It decides only the plain case (no extra keys, exact JSON types, well inside the
# size limit) and returns None for anything else, which goes to :func:`_schema_data` and the models
# as before: it accepts nothing they refuse. A property test holds it to :func:`_schema_data`.

_ABSENT: Any = object()
_FIELD_SLACK = 32
"""At least what one field's value adds to :func:`_check_value`'s size besides its characters."""
_TEXT = """if "\\x00" in v or not v.isascii():
    if _text_fault(v) is not None:
        return None
n += len(v)"""


def _plain(kind: msgspec.inspect.Type) -> bool:
    return all(getattr(kind, name, None) is None for name in ("min_length", "max_length", "pattern"))


def _fast_member(kind: msgspec.inspect.Type, names: dict[str, Any]) -> tuple[str, str] | None:
    """The test that ``v`` is a plain value of ``kind`` and what then adds its size, or None when the
    fast check leaves ``kind`` to :func:`_schema_data`."""
    inspect = msgspec.inspect
    if isinstance(kind, inspect.StrType) and _plain(kind):
        return "type(v) is str", _TEXT
    if isinstance(kind, inspect.LiteralType) and all(
        type(value) is str and value.isascii() and "\x00" not in value for value in kind.values
    ):
        name = f"_literal{len(names)}"
        names[name] = frozenset(kind.values)
        return f"type(v) is str and v in {name}", "n += len(v)"
    if isinstance(kind, inspect.BoolType):
        return "type(v) is bool", "pass"
    if isinstance(kind, inspect.IntType) and (kind.gt, kind.lt, kind.le, kind.multiple_of) == (None,) * 4:
        low = _INT_MIN if kind.ge is None else max(kind.ge, _INT_MIN)
        return f"type(v) is int and {low} <= v <= {_INT_MAX}", "pass"
    if (
        isinstance(kind, inspect.DictType)
        and isinstance(kind.key_type, inspect.StrType)
        and _plain(kind.key_type)
        and isinstance(kind.value_type, inspect.AnyType)
        and (kind.min_length, kind.max_length) == (None, None)
    ):
        return "type(v) is dict", "extra += _check_value(v, 1, True)"
    return None


def _indent(text: str, depth: int) -> list[str]:
    return ["    " * depth + line for line in text.splitlines()]


def _fast_source(struct: type[Data], names: dict[str, Any]) -> str | None:
    """The source of one Struct's fast check, or None when a field is of a kind it does not handle."""
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    body: list[str] = []
    build: list[str] = []
    literal: list[str] | None = []
    required = 0
    bound = 2  # what _check_value counts for the braces, each key and each value's fixed part
    for index, spec in enumerate(info.fields):
        key = spec.encode_name
        if not key.isascii() or "\x00" in key:
            return None
        bound += 6 * len(key) + 4 + _FIELD_SLACK
        members = spec.type.types if isinstance(spec.type, msgspec.inspect.UnionType) else (spec.type,)
        nullable = any(isinstance(m, (msgspec.inspect.NoneType, msgspec.inspect.AnyType)) for m in members)
        default = None if spec.required else spec.default
        if default is not None and type(default) is not str:
            return None
        plain = spec.required and not nullable  # present and never None: one type test decides
        if plain:
            required += 1
            body.append(f"v = data.get({key!r})")
            chain = "if"
        else:
            body += [f"v = data.get({key!r}, _ABSENT)", "if v is _ABSENT:"]
            body += ["    return None"] if spec.required else [f"    v = {default!r}"]
            body += ["else:", "    seen += 1", "if v is None:", "    pass" if nullable else "    return None"]
            chain = "elif"
        walk = False
        for member in members:
            if isinstance(member, msgspec.inspect.NoneType):
                continue
            if isinstance(member, msgspec.inspect.AnyType):
                walk = True
                continue
            found = _fast_member(member, names)
            if found is None:
                return None
            body += [f"{chain} {found[0]}:", *_indent(found[1], 1)]
            chain = "elif"
        body += ["else:", "    extra += _check_value(v, 1, True)" if walk else "    return None"]
        check = struct.checks.get(spec.name)
        if check is not None:
            names[f"_check{index}"] = check
            body.append(f"_check{index}(v)")
        body.append(f"v{index} = v")
        if plain:
            build.append(f"out[{key!r}] = v{index}")
            if literal is not None:
                literal.append(f"{key!r}: v{index}")
        else:
            build += [f"if v{index} is not None:", f"    out[{key!r}] = v{index}"]
            literal = None
    lines = ["def check(data):", f"    seen = {required}", "    n = extra = 0", "    try:"]
    lines += _indent("\n".join(body), 2) if body else ["        pass"]
    lines += ["    except (InvalidEvent, ValueError):", "        return None"]
    lines += [f"    if seen != len(data) or 6 * n + extra > {MAX_DATA_BYTES - bound}:", "        return None"]
    if literal is not None:  # every field present: the dump in one literal
        lines.append(f"    return {{{', '.join(literal)}}}")
        return "\n".join(lines)
    lines += ["    out = {}", *_indent("\n".join(build), 1), "    return out"]
    return "\n".join(lines)


def _fast_check(struct: type[Data]) -> Any:
    """One Struct's generated fast check (``data`` → its dump, or None: ask :func:`_schema_data`), or
    None when the Struct has a field of a kind the generator does not handle."""
    names: dict[str, Any] = {
        "_ABSENT": _ABSENT,
        "_text_fault": _text_fault,
        "_check_value": _check_value,
        "InvalidEvent": InvalidEvent,
    }
    source = _fast_source(struct, names)
    if source is None:
        return None
    exec(
        compile(source, f"<fast check of {struct.__name__}>", "exec"), names
    )  # the source is built from the schema alone
    return names["check"]


_FAST: dict[str, Any] = {t: f for t, f in ((t, _fast_check(s)) for t, s in SCHEMA.items()) if f is not None}
"""Each known type's generated fast check (every type whose fields the generator handles)."""


_SECONDS: dict[str, int] = {}
"""``YYYY-MM-DDTHH:MM:SS`` → its epoch milliseconds, for :func:`_wire_ms` (cleared when large)."""


def _wire_ms(at: str) -> int:
    """An RFC 3339 time as epoch milliseconds; the form calltape writes (``…T09:30:00.000Z``) is read
    in place, its second looked up in a cache. Raises ``ValueError`` as :func:`to_datetime` does."""
    if len(at) == 24 and at[23] == "Z" and at[19] == "." and at[4] == at[7] == "-" and at[13] == at[16] == ":":
        milli = at[20:23]
        if milli.isascii() and milli.isdigit():
            second = at[:19]
            base = _SECONDS.get(second)
            if base is None:
                base = datetime_ms(to_datetime(second + "+00:00"))
                if len(_SECONDS) >= 8192:
                    _SECONDS.clear()
                _SECONDS[second] = base
            return base + int(milli)
    return datetime_ms(to_datetime(at))


def _parse_common(obj: dict[str, Any], event_type: Any, trusted: bool = False) -> Event | None:
    """The usual event (plain JSON types, a known type or an extension, an RFC 3339 ``at``) read
    and checked in plain Python, many times faster than the discriminated union. None sends anything
    unusual (lax coercions, missing or extra fields, invalid data, anything over a limit) to the union
    and :func:`check_event`, which give the same result for what they accept and the error messages
    for what they refuse. The event returned has passed :func:`check_event`. ``trusted``: see
    :func:`_schema_data`."""
    if type(event_type) is not str:
        return None
    compiled = _COMPILED.get(event_type)
    if compiled is None and not is_extension(event_type):
        return None
    if not _WIRE_FIELDS.issuperset(obj):
        return None
    session, event_id, data = obj.get("session"), obj.get("id"), obj.get("data")
    seq, epoch, agent, at = obj.get("seq"), obj.get("epoch"), obj.get("agent"), obj.get("at")
    if type(session) is not str or not session or type(data) is not dict:
        return None
    if event_id is not None and (type(event_id) is not str or not event_id):
        return None
    if (seq is not None and (type(seq) is not int or seq < 1)) or (
        epoch is not None and (type(epoch) is not int or epoch < 1)
    ):
        return None
    if agent is not None and type(agent) is not str:
        return None
    if at is None:
        at_ms = now_ms()
    else:
        if type(at) is not str:
            return None
        try:
            at_ms = _wire_ms(at)
        except ValueError:
            return None
    data = _schema_data(compiled, data, trusted)
    if data is None:
        return None
    event = Event(
        type=event_type,
        data=data,
        session=session,
        id=event_id or new_event_id(),
        at_ms=at_ms,
        agent=agent,
        epoch=epoch,
        seq=seq,
        checked=True,
    )
    if trusted:  # valid Unicode without NUL: only the lengths and the integers' range are left
        if (
            len(session) > MAX_ID_CHARS
            or len(event.id) > MAX_ID_CHARS
            or len(event_type) > MAX_TYPE_CHARS
            or (agent is not None and len(agent) > MAX_ID_CHARS)
            or (seq is not None and seq > MAX_EPOCH)
            or (epoch is not None and epoch > MAX_EPOCH)
            or not MIN_AT_MS <= at_ms <= MAX_AT_MS
        ):
            return None
        return event
    try:
        _check_envelope(event)
    except InvalidEvent:
        return None
    return event


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
    if type(obj) is dict:
        event = _parse_common(obj, obj.get("type"))
        if event is not None:
            return event
    if not isinstance(obj, Mapping):
        raise InvalidEvent("an event must be a JSON object")
    event_type = obj.get("type")
    if not isinstance(event_type, str):
        raise InvalidEvent("'type' is missing" if event_type is None else "'type' must be a string")
    if _discriminate(obj) is None:
        raise unknown_type(event_type)
    return check_event(_parse_union(obj, event_type))


def parse_read(obj: Any, line: bytes) -> Event:
    """:func:`parse_event` for ``obj`` just read by ``orjson.loads(line)`` (the import's reader): the
    line's bytes vouch for its text (see :func:`_schema_data`), so the usual event skips most checks."""
    if type(obj) is dict:
        event = _parse_common(obj, obj.get("type"), len(line) <= _TRUSTED_LINE and b"\\u0000" not in line)
        if event is not None:
            return event
    return parse_event(obj)


def _parse_union(obj: Mapping[str, Any], event_type: str) -> Event:
    """Any wire event through the discriminated union: the reference for :func:`_parse_common`
    (a property test holds the two equal) and the source of every validation message."""
    data = obj.get("data")
    if isinstance(data, Mapping):
        _check_loose(data, 0)
    try:
        model = _WIRE_ADAPTER.validate_python(obj)
    except ValidationError as exc:
        raise InvalidEvent(f"{event_type}: {_first_error(exc)}") from None
    try:
        data = model.data if isinstance(model, ExtensionEvent) else _dump_data(model.data)
    except (PydanticSerializationError, ValueError, TypeError, RecursionError) as exc:
        raise _unserializable(exc) from None
    at_ms = now_ms()
    if model.at is not None:
        at = model.at if model.at.tzinfo else model.at.replace(tzinfo=UTC)
        at_ms = datetime_ms(at)
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


EventData = Mapping[str, Any] | None
"""The data an event is made from (None: no data), as every writer's ``emit`` takes it."""


_NAMES: set[str] = set()
"""Session ids and agent names :func:`make_event` has seen pass :func:`_usual_name` (a writer sends the
same few again and again; cleared when large)."""


def _usual_name(text: str, keep: bool = True) -> bool:
    """Whether ``text`` (a str) is a session id, agent name or event id the envelope check passes
    without a word: 1 to :data:`MAX_ID_CHARS` ASCII characters, no NUL. Anything else is decided (and
    refused, with its message) by the general path."""
    if not (0 < len(text) <= MAX_ID_CHARS and text.isascii() and "\x00" not in text):
        return False
    if keep:
        if len(_NAMES) >= 4096:
            _NAMES.clear()
        _NAMES.add(text)
    return True


def make_event(
    session: str,
    event_type: str,
    data: EventData = None,
    *,
    id: str | None = None,
    at_ms: int | None = None,
    agent: str | None = None,
    epoch: int | None = None,
) -> Event:
    """Builds a validated event from Python values (the recorder's and the API's entry point)."""
    # The usual event in one pass: a known type's plain data through its generated check, and the
    # envelope's usual values tested inline. Anything else (and every refusal, with its message) is
    # decided by _make_event, the reference this must agree with.
    if type(event_type) is str and (data is None or type(data) is dict):
        fast = _FAST.get(event_type)
        if (
            fast is not None
            and type(session) is str
            and (session in _NAMES or _usual_name(session))
            and (agent is None or (type(agent) is str and (agent in _NAMES or _usual_name(agent))))
            and (epoch is None or (type(epoch) is int and 1 <= epoch <= MAX_EPOCH))
            and (at_ms is None or (type(at_ms) is int and MIN_AT_MS <= at_ms <= MAX_AT_MS))
            and (id is None or (type(id) is str and _usual_name(id, False)))
        ):
            checked = fast(data) if data is not None else fast({})
            if checked is not None:
                return Event(  # positional: the hot path's one allocation of the event, in its row form
                    event_type,
                    checked,
                    session,
                    str(_uuid7()) if id is None else id,  # new_event_id() and now_ms(), inlined
                    _time_ns() // 1_000_000 if at_ms is None else at_ms,
                    agent,
                    epoch,
                    None,
                    True,
                )
    return _make_event(session, event_type, data, id, at_ms, agent, epoch)


def _make_event(session: Any, event_type: Any, data: Any, id: Any, at_ms: Any, agent: Any, epoch: Any) -> Event:
    """:func:`make_event` by the general path: the compiled schema and the walk, then the models; the
    reference for make_event's fast path and the source of every refusal's message."""
    if not isinstance(event_type, str):
        raise InvalidEvent("'type' must be a string")
    if data is not None and not isinstance(data, Mapping):
        raise InvalidEvent("'data' must be an object")
    compiled = _COMPILED.get(event_type)
    checked = None
    if compiled is not None and (data is None or type(data) is dict):
        checked = _schema_data(compiled, data or {})  # the usual event: its data passed every check
    event = Event(
        type=event_type,
        data=validate_data(event_type, data) if checked is None else checked,
        session=session,
        id=new_event_id() if id is None else id,
        at_ms=now_ms() if at_ms is None else at_ms,
        agent=agent,
        epoch=epoch,
    )
    if checked is None:
        return check_event(event)
    _check_envelope(event)
    event.checked = True
    return event


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
    return Event(
        type=type, data=data, session=session, id=id, at_ms=at_ms, agent=agent, epoch=epoch, seq=seq, checked=True
    )


def dumps_jsonl(events: Iterable[Event]) -> bytes:
    """Events as JSON Lines (one wire-format object per line), for export and spill files."""
    return b"".join(e.to_json() + b"\n" for e in events)
