"""A hosted platform's saved post-call payload → the calltape events of one session per call.

This is ``calltape import --format``: the same mapping the webhook receivers use (each platform's
adapter module), read from a file instead of a request, so a call imported after its webhook landed
(or the other way round) adds nothing. One file holds one payload, or a JSON array of them (a list
endpoint's output). What each format accepts:

=========== ================================================================================
vapi        the ``end-of-call-report`` server message (``{"message": …}`` or bare), or the call
            object (``GET /call/{id}``)
retell      the ``call_ended`` / ``call_analyzed`` webhook, or the call object (``GET /v2/get-call``)
bland       the post-call webhook, or the call details (``GET /v1/calls/{id}``)
elevenlabs  the ``post_call_transcription`` webhook, or the conversation
            (``GET /v1/convai/conversations/{id}``)
ultravox    ``{"call": <call object>, "messages": <the messages list, or the list endpoint's page>}``
=========== ================================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from calltape.adapters.bland import bland_events
from calltape.adapters.elevenlabs import elevenlabs_events
from calltape.adapters.retell import retell_webhook_events
from calltape.adapters.ultravox import ultravox_events
from calltape.adapters.vapi import VapiIngest, end_of_call_report
from calltape.errors import InvalidEvent
from calltape.events import Event

__all__ = ["PLATFORMS", "postcall_events"]


def _vapi(payload: Mapping[str, Any]) -> list[Event]:
    return VapiIngest().reconstruct(end_of_call_report(payload))


_RETELL_TRANSCRIPTS = ("transcript_object", "transcript_with_tool_calls", "transcript")


def _retell(payload: Mapping[str, Any]) -> list[Event]:
    event = payload.get("event")
    if isinstance(event, str) and event not in ("call_ended", "call_analyzed"):
        raise InvalidEvent(f"a Retell '{event}' webhook carries no finished call (use call_ended or call_analyzed)")
    call = payload.get("call") if event is not None else payload
    if (
        not isinstance(call, Mapping)
        or not call.get("call_id")
        or not any(k in call for k in (*_RETELL_TRANSCRIPTS, "call_status"))
    ):
        raise InvalidEvent("not a Retell call_ended webhook or call object (no 'call_id' with a transcript)")
    return retell_webhook_events({"event": "call_ended", "call": call})


def _bland(payload: Mapping[str, Any]) -> list[Event]:
    if not isinstance(payload.get("transcripts"), list):
        raise InvalidEvent("not a Bland post-call payload (no 'call_id' with 'transcripts')")
    return bland_events(payload)


PLATFORMS: Final[dict[str, tuple[str, Callable[[Mapping[str, Any]], list[Event]]]]] = {
    "vapi": ("Vapi", _vapi),
    "retell": ("Retell", _retell),
    "bland": ("Bland", _bland),
    "elevenlabs": ("ElevenLabs", elevenlabs_events),
    "ultravox": ("Ultravox", ultravox_events),
}
"""Each ``--format`` name: the platform's display name and its payload → events mapping."""


def postcall_events(platform: str, document: Any) -> list[list[Event]]:
    """The sessions (one event list per call) of a saved payload, or of a JSON array of payloads.

    Raises :class:`~calltape.errors.InvalidEvent` in one sentence when the document is not the
    platform's shape (nothing is converted then)."""
    if platform not in PLATFORMS:
        raise InvalidEvent(f"unknown platform '{platform}' (use one of: {', '.join(PLATFORMS)})")
    name, convert = PLATFORMS[platform]
    payloads = document if isinstance(document, list) else [document]
    sessions: list[list[Event]] = []
    for n, payload in enumerate(payloads, start=1):
        where = f"item {n}: " if isinstance(document, list) else ""
        if not isinstance(payload, Mapping):
            raise InvalidEvent(f"{where}a {name} payload must be a JSON object")
        try:
            events = convert(payload)
        except InvalidEvent as exc:
            raise InvalidEvent(f"{where}{exc}") from None
        if events:
            sessions.append(events)
    return sessions
