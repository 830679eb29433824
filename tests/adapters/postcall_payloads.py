"""Saved post-call payloads of the five hosted platforms, shaped on their documented payloads.

Vapi, Retell and ElevenLabs payloads are built from the platforms' own SDK types (``vapi-server-sdk``,
``retell-sdk``, ``elevenlabs``) and dumped as the API sends them; Bland and Ultravox publish no Python
types, so theirs follow the documented JSON (Bland's post-call webhook; Ultravox's call object and its
``GET /api/calls/{id}/messages`` page).

The same booking call in each: a greeting, "a table for two", a ``book_table`` call and its result.
Some carry more: a barge-in (Vapi: the count and the overlapping turns; ElevenLabs: the interrupted
line and what was said before the cut), and a tool call left without a result (ElevenLabs, Ultravox).
"""

from __future__ import annotations

import json
from typing import Any

import elevenlabs.types as el
from retell.types import PhoneCallResponse
from vapi.types import (
    Analysis,
    Artifact,
    BotMessage,
    Call,
    PerformanceMetrics,
    ServerMessageEndOfCallReport,
    SystemMessage,
    ToolCallMessage,
    ToolCallResultMessage,
    UserMessage,
)

T0 = 1_735_812_000_000  # 2025-01-02T10:00:00Z
T0_S = T0 // 1000


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


# ---------------------------------------------------------------------------------------------
# Vapi: the end-of-call report; the bot's third line is cut off by the user (an 800 ms overlap,
# and the report counts one assistant interruption); the 100 ms overlap on the greeting is not it.

VAPI_CALL = "vapi-pc-1"


def vapi_report(call_id: str = VAPI_CALL, *, interrupted: int | None = 1) -> dict[str, Any]:
    def bot(text: str, start: int, end: int) -> BotMessage:
        return BotMessage(role="bot", message=text, time=T0 + start, end_time=T0 + end, seconds_from_start=start / 1000)

    def user(text: str, start: int, end: int) -> UserMessage:
        return UserMessage(
            role="user", message=text, time=T0 + start, end_time=T0 + end, seconds_from_start=start / 1000
        )

    msg = ServerMessageEndOfCallReport(
        type="end-of-call-report",
        ended_reason="customer-ended-call",
        analysis=Analysis(summary="Booked a table for two."),
        call=Call(id=call_id, org_id="org", created_at="2025-01-02T10:00:00Z", updated_at="2025-01-02T10:02:00Z"),
        started_at="2025-01-02T10:00:00Z",
        ended_at="2025-01-02T10:00:20Z",
        artifact=Artifact(
            performance_metrics=PerformanceMetrics(num_assistant_interrupted=interrupted, num_user_interrupted=0),
            messages=[
                SystemMessage(role="system", message="You book tables.", time=T0, seconds_from_start=0),
                bot("Hi, how can I help?", 1000, 2000),
                user("A table for two.", 1900, 3000),
                ToolCallMessage(
                    role="tool_calls",
                    message="",
                    time=T0 + 4000,
                    seconds_from_start=4,
                    tool_calls=[
                        {
                            "id": "tc-1",
                            "type": "function",
                            "function": {"name": "book_table", "arguments": '{"people": 2}'},
                        }
                    ],
                ),
                ToolCallResultMessage(
                    role="tool_call_result",
                    tool_call_id="tc-1",
                    name="book_table",
                    result='{"confirmation": "BK-42"}',
                    time=T0 + 5000,
                    seconds_from_start=5,
                ),
                bot("Booked for two. Would you like a reminder by text", 6000, 9000),
                user("No thanks, that's all.", 8200, 9500),
                bot("Okay, goodbye.", 10000, 11000),
            ],
        ),
    )
    return {"message": _plain(msg.dict(by_alias=True, exclude_none=True))}


# ---------------------------------------------------------------------------------------------
# Retell: the call object of a call_ended webhook, with its transcript and tool calls.

RETELL_CALL = "retell-pc-1"


def retell_webhook(call_id: str = RETELL_CALL) -> dict[str, Any]:
    def words(start: float, end: float) -> list[dict[str, Any]]:
        return [{"word": "w", "start": start, "end": end}]

    call = PhoneCallResponse.model_validate(
        {
            "call_id": call_id,
            "agent_id": "ag_1",
            "agent_version": 1,
            "agent_name": "front-desk",
            "call_status": "ended",
            "call_type": "phone_call",
            "direction": "inbound",
            "from_number": "+15550001",
            "to_number": "+15550002",
            "start_timestamp": T0,
            "end_timestamp": T0 + 20_000,
            "disconnection_reason": "user_hangup",
            "transcript_with_tool_calls": [
                {"role": "agent", "content": "Hi, how can I help?", "words": words(1.0, 2.0)},
                {"role": "user", "content": "A table for two.", "words": words(3.0, 4.0)},
                {
                    "role": "tool_call_invocation",
                    "tool_call_id": "rt-1",
                    "name": "book_table",
                    "arguments": '{"people": 2}',
                },
                {"role": "tool_call_result", "tool_call_id": "rt-1", "content": '{"confirmation": "BK-42"}'},
                {"role": "agent", "content": "Booked for two.", "words": words(6.0, 7.0)},
            ],
        }
    )
    return {"event": "call_ended", "call": json.loads(call.model_dump_json(exclude_none=True))}


# ---------------------------------------------------------------------------------------------
# Bland: the post-call webhook (documented JSON; Bland ships no Python types).

BLAND_CALL = "bland-pc-1"


def bland_post_call(call_id: str = BLAND_CALL) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "created_at": "2025-01-02 09:59:58",
        "started_at": "2025-01-02T10:00:00.000Z",
        "end_at": "2025-01-02T10:00:20.000Z",
        "completed": True,
        "inbound": True,
        "from": "+15550001",
        "to": "+15550002",
        "call_length": 0.33,
        "call_ended_by": "USER",
        "concatenated_transcript": "assistant: Hi, how can I help? user: A table for two.",
        "transcripts": [
            {"id": 1, "created_at": "2025-01-02T10:00:01.000Z", "text": "Hi, how can I help?", "user": "assistant"},
            {"id": 2, "created_at": "2025-01-02T10:00:03.000Z", "text": "A table for two.", "user": "user"},
            {"id": 3, "created_at": "2025-01-02T10:00:05.000Z", "text": "Booked a table", "user": "agent-action"},
            {"id": 4, "created_at": "2025-01-02T10:00:06.000Z", "text": "Booked for two.", "user": "assistant"},
        ],
    }


# ---------------------------------------------------------------------------------------------
# ElevenLabs: the post_call_transcription webhook. The confirmation is cut off ("interrupted", with
# what was said before the cut in `message` and the generated line in `original_message`); the
# second tool call never got a result.

ELEVENLABS_CONVERSATION = "conv_pc_1"
EL_HEARD = "You're booked for two at eight, confirmation B K"
EL_GENERATED = "You're booked for two at eight, confirmation B K 42. Anything else?"


# The SDK renamed its transcript types over its 2.x releases (the wire format stayed): the oldest supported
# release (the dev extra's lower bound) and the newest both build the payload.
_Line = el.ConversationHistoryTranscriptCommonModelOutput
_ToolCall = (
    getattr(el, "ConversationHistoryTranscriptToolCallCommonModelOutput", None)
    or el.ConversationHistoryTranscriptToolCallCommonModel
)
_ToolResult = (
    getattr(el, "ConversationHistoryTranscriptOtherToolsResultCommonModel", None)
    or el.ConversationHistoryTranscriptToolResultCommonModel
)


def elevenlabs_conversation(conversation_id: str = ELEVENLABS_CONVERSATION) -> el.GetConversationResponseModel:
    def line(role: str, secs: int, message: str | None = None, **extra: Any) -> dict[str, Any]:
        model = _Line(role=role, time_in_call_secs=secs, message=message, **extra)
        dumped: dict[str, Any] = json.loads(model.json(exclude_none=True))
        return dumped

    return el.GetConversationResponseModel(
        agent_id="agent_bistro",
        agent_name="bistro",
        conversation_id=conversation_id,
        status="done",
        has_audio=True,
        has_user_audio=True,
        has_response_audio=True,
        has_auxiliary_audio=False,
        metadata=el.ConversationHistoryMetadataCommonModel(
            start_time_unix_secs=T0_S, call_duration_secs=15, termination_reason="Call ended by remote party"
        ),
        transcript=[
            line("agent", 0, "Hi, this is Ava from the bistro. How can I help?"),
            line("user", 3, "Book a table for two at eight."),
            line(
                "agent",
                5,
                tool_calls=[
                    _ToolCall(
                        request_id="el-tool-1",
                        tool_name="book_table",
                        params_as_json='{"people": 2, "time": "20:00"}',
                        tool_has_been_called=True,
                    )
                ],
            ),
            line(
                "agent",
                6,
                tool_results=[
                    _ToolResult(
                        request_id="el-tool-1",
                        tool_name="book_table",
                        result_value='{"confirmation": "BK-42"}',
                        is_error=False,
                        tool_has_been_called=True,
                    )
                ],
            ),
            line("agent", 7, EL_HEARD, interrupted=True, original_message=EL_GENERATED),
            line("user", 9, "Actually, make it three."),
            line(
                "agent",
                10,
                tool_calls=[
                    _ToolCall(
                        request_id="el-tool-2",
                        tool_name="update_booking",
                        params_as_json='{"people": 3}',
                        tool_has_been_called=True,
                    )
                ],
            ),
        ],
    )


def elevenlabs_webhook(conversation_id: str = ELEVENLABS_CONVERSATION) -> dict[str, Any]:
    data = json.loads(elevenlabs_conversation(conversation_id).json(exclude_none=True))
    return {"type": "post_call_transcription", "event_timestamp": T0_S + 20, "data": data}


# ---------------------------------------------------------------------------------------------
# Ultravox: the call object and its messages page. The call was lost (connection_error) while the
# second tool call was running: it has no result.

ULTRAVOX_CALL = "uv-pc-1"


def ultravox_call(call_id: str = ULTRAVOX_CALL, *, end_reason: str = "connection_error") -> dict[str, Any]:
    return {
        "callId": call_id,
        "created": "2025-01-02T10:00:00Z",
        "joined": "2025-01-02T10:00:01Z",
        "ended": "2025-01-02T10:00:20Z",
        "endReason": end_reason,
        "firstSpeaker": "FIRST_SPEAKER_AGENT",
        "systemPrompt": "You book tables.",
        "agent": {"agentId": "3c90c3cc-0d44-4b50-8888-8dd25736052a", "name": "bistro"},
        "agentId": "3c90c3cc-0d44-4b50-8888-8dd25736052a",
        "metadata": {"crm": "42"},
        "joinUrl": "wss://example.invalid/join",
    }


def ultravox_messages() -> dict[str, Any]:
    def msg(role: str, start: str, end: str, text: str, **extra: Any) -> dict[str, Any]:
        return {
            "role": role,
            "text": text,
            "medium": "MESSAGE_MEDIUM_VOICE",
            "callStageMessageIndex": 0,
            "timespan": {"start": start, "end": end},
            **extra,
        }

    results = [
        msg("MESSAGE_ROLE_AGENT", "0.200s", "1.900s", "Hi, how can I help?"),
        msg("MESSAGE_ROLE_USER", "2.500s", "3.800s", "A table for two at eight."),
        msg(
            "MESSAGE_ROLE_TOOL_CALL",
            "4.100s",
            "4.100s",
            '{"people": 2}',
            toolName="book_table",
            invocationId="uv-inv-1",
        ),
        msg(
            "MESSAGE_ROLE_TOOL_RESULT",
            "4.600s",
            "4.600s",
            '{"confirmation": "BK-42"}',
            toolName="book_table",
            invocationId="uv-inv-1",
        ),
        msg("MESSAGE_ROLE_AGENT", "5.000s", "7.000s", "Booked for two at eight."),
        msg("MESSAGE_ROLE_USER", "8.000s", "9.000s", "Please text me a reminder."),
        msg(
            "MESSAGE_ROLE_TOOL_CALL",
            "9.500s",
            "9.500s",
            '{"channel": "sms"}',
            toolName="send_reminder",
            invocationId="uv-inv-2",
        ),
    ]
    for n, m in enumerate(results):
        m["callStageMessageIndex"] = n
    return {"next": None, "previous": None, "total": len(results), "results": results}


def ultravox_saved(call_id: str = ULTRAVOX_CALL, **call: Any) -> dict[str, Any]:
    return {"call": ultravox_call(call_id, **call), "messages": ultravox_messages()}
