"""Bland post-call webhook ingest.

Bland reports a call once, after it ended, as a list of ``transcripts`` (``user``/``assistant`` lines with
times); :mod:`calltape.adapters.reconstruct` turns it into a session marked reconstructed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from calltape.adapters.reconstruct import Turn, reconstruct
from calltape.adapters.webhook_auth import verify_bland_signature
from calltape.errors import InvalidEvent
from calltape.events import Event, parse_time

__all__ = [
    "BlandPostCall",
    "BlandTranscript",
    "bland_events",
    "verify_bland_signature",
]


# ---------------------------------------------------------------------------------------------
# Bland's payload (Bland publishes no Python SDK types; fields as documented for post-call webhooks).


class BlandTranscript(BaseModel):
    """One line of Bland's ``transcripts[]``: who spoke (``user``), what, and when."""

    model_config = ConfigDict(extra="allow")

    id: int | str | None = None
    created_at: str | None = None
    text: str = ""
    user: str


class BlandPostCall(BaseModel):
    """The post-call webhook body (and ``GET /v1/calls/{id}``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    call_id: str = Field(min_length=1)
    transcripts: list[BlandTranscript] = Field(default_factory=list)
    created_at: str | None = None
    started_at: str | None = None
    end_at: str | None = None
    completed: bool | None = None
    inbound: bool | None = None
    to: str | None = None
    from_: str | None = Field(default=None, alias="from")
    call_length: float | None = None
    status: str | None = None
    summary: str | None = None
    error_message: str | None = None
    call_ended_by: str | None = None
    pathway_id: str | None = None
    metadata: dict[str, Any] | None = None
    variables: dict[str, Any] | None = None


def _time(value: str | None) -> int | None:
    if not value:
        return None
    try:
        return parse_time(value.replace(" ", "T", 1) if "T" not in value else value)
    except InvalidEvent:
        return None


def parse_bland(body: Mapping[str, Any]) -> BlandPostCall:
    try:
        return BlandPostCall.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InvalidEvent(f"Bland post-call webhook: '{where}': {err['msg'].lower()}") from None


_BLAND_ROLES = {"user": "user", "assistant": "assistant"}


def bland_events(body: Mapping[str, Any] | BlandPostCall, *, session: str | None = None) -> list[Event]:
    """A Bland post-call webhook as a reconstructed calltape session (session id: the call id)."""
    call = body if isinstance(body, BlandPostCall) else parse_bland(body)
    turns: list[Turn] = []
    for line in call.transcripts:
        role = _BLAND_ROLES.get(line.user)
        at = _time(line.created_at)
        if role == "user":
            turns.append(Turn("user", line.text, at))
        elif role == "assistant":
            turns.append(Turn("assistant", line.text, at))
        else:  # "agent-action", "robot": kept in the log, outside the context
            turns.append(Turn("note", line.text, at, note=line.user.replace("-", "_")))
    meta: dict[str, Any] = {"call_id": call.call_id}
    for key in ("to", "from_", "inbound", "call_length", "status", "summary", "pathway_id"):
        value = getattr(call, key)
        if value is not None:
            meta[key.rstrip("_")] = value
    if call.metadata:
        meta["bland_metadata"] = call.metadata
    return reconstruct(
        session or call.call_id,
        turns,
        source="bland.post_call",
        started_at_ms=_time(call.started_at) or _time(call.created_at),
        ended_at_ms=_time(call.end_at),
        end_reason=call.call_ended_by or call.error_message or ("completed" if call.completed else None),
        metadata=meta,
    )
