"""ElevenLabs Agents: a conversation's post-call transcription → calltape events.

ElevenLabs runs the whole call and reports it afterwards, as the ``post_call_transcription`` webhook
(``{"type": "post_call_transcription", "event_timestamp": …, "data": <conversation>}``, signed with
``ElevenLabs-Signature: t=<unix s>,v0=<hex>``) or as ``GET /v1/convai/conversations/{id}`` returns it
(the same ``<conversation>``). Its transcript says more than most: an agent line that the user cut off
is marked ``interrupted``, with ``message`` holding what was spoken before the cut and
``original_message`` what the LLM had generated; tool calls carry their ``request_id`` and their results
come back under it. Times are whole seconds from the start (``time_in_call_secs``), or milliseconds
(``created_at_unix_ms``) where the payload has them. Nothing else is guessed: no VAD edges, no playout
timing; the session is marked reconstructed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calltape.adapters.reconstruct import Turn, json_or_text, reconstruct
from calltape.adapters.webhook_auth import sign_elevenlabs, verify_elevenlabs_signature
from calltape.errors import InvalidEvent
from calltape.events import Event

__all__ = [
    "conversation_of",
    "elevenlabs_events",
    "sign_elevenlabs",
    "verify_elevenlabs_signature",
]

SOURCE = "elevenlabs.post_call"
"""The reconstruction source (and the prefix of the event ids)."""

_LIVE = frozenset({"initiated", "in-progress"})
"""Statuses of a conversation that has not ended yet (no ``session.ended`` is written for it)."""


def conversation_of(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    """The conversation in a saved payload: the webhook's ``data``, or the conversation object itself.

    Anything else (another webhook type, another platform's payload) raises
    :class:`~calltape.errors.InvalidEvent` in one sentence."""
    kind = payload.get("type")
    if isinstance(kind, str) and kind != "post_call_transcription":
        raise InvalidEvent(f"an ElevenLabs webhook of type '{kind}' carries no transcript")
    conv = payload.get("data") if kind is not None else payload
    if (
        not isinstance(conv, Mapping)
        or not isinstance(conv.get("conversation_id"), str)
        or not conv["conversation_id"]
        or not isinstance(conv.get("transcript"), list)
    ):
        raise InvalidEvent(
            "not an ElevenLabs post-call transcription or conversation (no 'conversation_id' with a 'transcript')"
        )
    return conv


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def elevenlabs_events(payload: Mapping[str, Any], *, session: str | None = None) -> list[Event]:
    """The conversation as a reconstructed calltape session (session id: the conversation id).

    Event ids derive from the conversation id and each line's position, so the same payload imported
    or delivered again adds nothing."""
    conv = conversation_of(payload)
    raw_meta = conv.get("metadata")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    start_s = _int(meta.get("start_time_unix_secs"))
    start_ms = start_s * 1000 if start_s is not None else None
    duration = _int(meta.get("call_duration_secs"))

    def at(line: Mapping[str, Any]) -> int | None:
        exact = _int(line.get("created_at_unix_ms"))
        if exact is not None:
            return exact
        offset = _int(line.get("time_in_call_secs"))
        return start_ms + offset * 1000 if start_ms is not None and offset is not None else None

    turns: list[Turn] = []
    for line in conv["transcript"]:
        if not isinstance(line, Mapping):
            raise InvalidEvent("an ElevenLabs transcript line must be an object")
        when = at(line)
        role = line.get("role")
        text = str(line.get("message") or "").strip()
        if role == "user":
            if line.get("ignored_as_backchannel"):  # the agent did not take it as a turn
                turns.append(Turn("note", text, when, note="backchannel"))
            else:
                turns.append(Turn("user", text, when))
        elif role == "agent":
            if line.get("interrupted"):
                generated = str(line.get("original_message") or text).strip()
                turns.append(Turn("assistant", generated, when, heard=text))
            elif text:
                turns.append(Turn("assistant", text, when))
            for tc in line.get("tool_calls") or []:
                if not isinstance(tc, Mapping) or not tc.get("request_id"):
                    raise InvalidEvent("an ElevenLabs tool call needs a 'request_id'")
                args = json_or_text(tc.get("params_as_json")) if tc.get("params_as_json") else {}
                ran = tc.get("tool_has_been_called") is True
                call = str(tc["request_id"])
                turns.append(
                    Turn("tool_call", at_ms=when, call=call, name=tc.get("tool_name"), arguments=args, started=ran)
                )
            for tr in line.get("tool_results") or []:
                if not isinstance(tr, Mapping) or not tr.get("request_id"):
                    raise InvalidEvent("an ElevenLabs tool result needs a 'request_id'")
                turns.append(
                    Turn(
                        "tool_result",
                        at_ms=when,
                        call=str(tr["request_id"]),
                        output=json_or_text(tr.get("result_value")),
                        error=tr.get("is_error") is True,
                    )
                )
        elif role is not None:
            raise InvalidEvent(f"an ElevenLabs transcript line has an unknown role '{role}'")
    ended = str(conv.get("status") or "done") not in _LIVE
    keep = {"conversation_id": conv["conversation_id"], "agent_id": conv.get("agent_id")}
    phone = meta.get("phone_call")
    if isinstance(phone, Mapping):
        keep.update({k: phone.get(k) for k in ("direction", "external_number", "agent_number", "call_sid")})
    return reconstruct(
        session or str(conv["conversation_id"]),
        turns,
        source=SOURCE,
        agent=str(conv.get("agent_name") or conv.get("agent_id") or "elevenlabs"),
        started_at_ms=start_ms,
        ended_at_ms=start_ms + duration * 1000 if ended and start_ms is not None and duration is not None else None,
        end_reason=str(meta.get("termination_reason") or conv.get("status") or "ended") if ended else None,
        metadata={k: v for k, v in keep.items() if v is not None},
    )
