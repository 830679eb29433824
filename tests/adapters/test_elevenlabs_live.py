"""The ElevenLabs live tap on the real SDK: a real ``Conversation`` / ``AsyncConversation`` talks to a
scripted ElevenLabs server on 127.0.0.1 (the network is the only fake), with a barge-in corrected by
``agent_response_correction`` and a client tool call answered through calltape's guard."""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from elevenlabs import conversational_ai
from elevenlabs.client import ElevenLabs
from elevenlabs.conversational_ai.conversation import AudioInterface, ClientTools, Conversation
from elevenlabs.environment import ElevenLabsEnvironment
from websockets.asyncio.server import ServerConnection, serve

import calltape
from calltape.adapters.elevenlabs_live import tap_elevenlabs
from calltape.adapters.reconstruct import is_reconstructed
from calltape.adapters.webhook_auth import sign_elevenlabs as sign
from calltape.server.app import create_app
from tests.adapters.hosted_support import tool_json
from tests.adapters.postcall_payloads import elevenlabs_webhook

# The SDK's oldest supported release (2.0, run in CI) has only the threaded Conversation.
SDK = conversational_ai.conversation
needs_async = pytest.mark.skipif(
    not hasattr(SDK, "AsyncConversation"), reason="this elevenlabs has no AsyncConversation"
)

SECRET = "wsec_elevenlabs_test_secret"
Step = dict[str, Any] | str  # a server message, "await-tool-result <id>", or "close <code>"

BOOKED = "Booked for two, your code is BK-42. Anything else?"
HEARD = "Booked for two, your code is"


def msg(kind: str, key: str, **event: Any) -> dict[str, Any]:
    return {"type": kind, key: event}


def opening(conversation_id: str) -> dict[str, Any]:
    return msg(
        "conversation_initiation_metadata", "conversation_initiation_metadata_event", conversation_id=conversation_id
    )


SCRIPT: list[Step] = [
    msg("user_transcript", "user_transcription_event", user_transcript="Book a table for two at eight."),
    msg("agent_response", "agent_response_event", agent_response="Let me check."),
    {
        "type": "client_tool_call",
        "client_tool_call": {"tool_name": "book", "tool_call_id": "tc_1", "parameters": {"at": "20:00", "people": 2}},
    },
    "await-tool-result tc_1",
    msg("agent_response", "agent_response_event", agent_response=BOOKED),
    msg("interruption", "interruption_event", event_id=7),
    msg(
        "agent_response_correction",
        "agent_response_correction_event",
        original_agent_response=BOOKED,
        corrected_agent_response=HEARD,
    ),
    msg("user_transcript", "user_transcription_event", user_transcript="Thanks, bye."),
]

EXPECTED = [
    {"role": "user", "content": "Book a table for two at eight."},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {"id": "tc_1", "type": "function", "function": {"name": "book", "arguments": '{"at":"20:00","people":2}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "tc_1", "content": {"code": "BK-42"}},
    {"role": "assistant", "content": HEARD},
    {"role": "user", "content": "Thanks, bye."},
]


class FakeServer:
    """ElevenLabs' conversation websocket, scripted: plays the steps, keeps what the client sent."""

    def __init__(self, script: list[Step]) -> None:
        self.script = script
        self.received: list[dict[str, Any]] = []

    async def handler(self, ws: ServerConnection) -> None:
        self.received.append(json.loads(await ws.recv()))  # conversation_initiation_client_data
        for step in self.script:
            if step.startswith("close ") if isinstance(step, str) else False:
                await ws.close(code=int(step.split()[1]))
                return
            if isinstance(step, str):
                wanted = step.split()[1]
                while True:
                    got = json.loads(await ws.recv())
                    self.received.append(got)
                    if got.get("type") == "client_tool_result" and got.get("tool_call_id") == wanted:
                        break
            else:
                await ws.send(json.dumps(step))
        await asyncio.sleep(0.05)
        await ws.close()  # the agent ends the conversation

    def results(self) -> list[dict[str, Any]]:
        return [m for m in self.received if m.get("type") == "client_tool_result"]


@pytest.fixture
async def server() -> AsyncIterator[Callable[[list[Step]], Awaitable[tuple[FakeServer, str]]]]:
    servers: list[Any] = []

    async def start(script: list[Step]) -> tuple[FakeServer, str]:
        fake = FakeServer(script)
        srv = await serve(fake.handler, "127.0.0.1", 0)
        servers.append(srv)
        port = next(iter(srv.sockets)).getsockname()[1]
        return fake, f"http://127.0.0.1:{port}"

    yield start
    for srv in servers:
        srv.close()
        await srv.wait_closed()


def client(base: str) -> ElevenLabs:
    """An ElevenLabs client whose conversations go to the scripted server (2.0 reads the environment's
    ``wss``; later releases, whose environment is an enum, derive the websocket URL from ``base_url``)."""
    if isinstance(ElevenLabsEnvironment, enum.EnumMeta):
        return ElevenLabs(api_key="test", base_url=base)
    environment = ElevenLabsEnvironment(base=base, wss=base.replace("http", "ws"))  # type: ignore[call-arg]
    return ElevenLabs(api_key="test", environment=environment)


class Speaker(getattr(SDK, "AsyncAudioInterface", object)):  # type: ignore[misc]
    """The audio device (plays nothing, hears nothing): a voice conversation without sound."""

    async def start(self, input_callback: Any) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def output(self, audio: bytes) -> None:
        pass

    async def interrupt(self) -> None:
        pass


class SyncSpeaker(AudioInterface):
    """The thread-side audio device of the synchronous Conversation (silent too)."""

    def start(self, input_callback: Any) -> None:
        pass

    def stop(self) -> None:
        pass

    def output(self, audio: bytes) -> None:
        pass

    def interrupt(self) -> None:
        pass


async def assert_recorded(
    ct: calltape.Calltape, session: str, runs: list[dict[str, Any]], reason: str = "agent"
) -> None:
    fold = await ct.context(session)
    assert tool_json(calltape.render(fold.native(), "openai")) == EXPECTED
    events = await ct.store.read(session)
    assert not is_reconstructed(events[0])  # recorded live: a post-call webhook only closes it
    assert events[0].data["framework"] == "elevenlabs" and events[0].data["modality"] == "voice"
    kinds = [e.type for e in events]
    assert kinds.count("tool.started") == 1 and kinds[-1] == "session.ended"
    assert events[-1].data == {"reason": reason}
    cut = [e for e in events if e.type == "agent.speech.ended" and e.data.get("interrupted")]
    assert [e.data["heard"] for e in cut] == [HEARD]
    assert runs == [{"tool_call_id": "tc_1", "people": 2, "at": "20:00"}]


async def converse(ct: calltape.Calltape, base: str, tools: ClientTools, agent: str | None = None) -> str | None:
    """One AsyncConversation with the scripted server, tapped, to its end; its conversation id."""
    conversation = SDK.AsyncConversation(
        client(base),
        "agent_1",
        requires_auth=False,
        audio_interface=Speaker(),
        client_tools=tools,
    )
    tap = tap_elevenlabs(ct, conversation, agent=agent)
    await conversation.start_session()
    conversation_id = await asyncio.wait_for(conversation.wait_for_session_end(), 10)
    await tap.close()
    return conversation_id


@needs_async
async def test_async_conversation(store_url: str, server: Any) -> None:
    fake, base = await server([opening("conv_async"), *SCRIPT])
    runs: list[dict[str, Any]] = []

    async def book(params: dict[str, Any]) -> dict[str, Any]:
        runs.append(params)
        return {"code": "BK-42"}

    tools = ClientTools()
    tools.register("book", book, is_async=True)
    async with calltape.connect(store_url) as ct:
        assert await converse(ct, base, tools, agent="front-desk") == "conv_async"
        await assert_recorded(ct, "conv_async", runs)
        assert fake.results() == [
            {"type": "client_tool_result", "tool_call_id": "tc_1", "result": {"code": "BK-42"}, "is_error": False}
        ]
        # the post-call webhook of the same conversation: recognised as recorded live, it adds nothing
        before = await ct.store.read("conv_async")
        body = json.dumps(elevenlabs_webhook("conv_async")).encode()
        app = create_app(ct.store, metrics=False, elevenlabs_secret=SECRET)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://receiver") as http:
            sent = await http.post("/elevenlabs", content=body, headers={"ElevenLabs-Signature": sign(body, SECRET)})
        assert sent.status_code == 200 and sent.json() == {"appended": 0}, sent.text
        assert await ct.store.read("conv_async") == before


async def test_sync_conversation_on_its_threads(store_url: str, server: Any) -> None:
    fake, base = await server([opening("conv_sync"), *SCRIPT])
    runs: list[dict[str, Any]] = []

    def book(params: dict[str, Any]) -> dict[str, Any]:  # runs on the SDK's tool thread pool
        runs.append(params)
        return {"code": "BK-42"}

    tools = ClientTools()
    tools.register("book", book)
    async with calltape.connect(store_url) as ct:
        conversation = Conversation(
            client(base),
            "agent_1",
            requires_auth=False,
            audio_interface=SyncSpeaker(),
            client_tools=tools,
        )
        tap = tap_elevenlabs(ct, conversation)
        conversation.start_session()  # the websocket reader thread
        assert await asyncio.wait_for(asyncio.to_thread(conversation.wait_for_session_end), 10) == "conv_sync"
        await tap.close()
        # an SDK that reports the end (callback_disconnect) gives its reason; 2.0 reports none: close()'s
        await assert_recorded(
            ct, "conv_sync", runs, "agent" if hasattr(conversation, "callback_disconnect") else "user"
        )
        assert [r["result"] for r in fake.results()] == [{"code": "BK-42"}]


@needs_async
async def test_a_call_of_a_cut_reply_never_runs_and_a_repeat_runs_once(store_url: str, server: Any) -> None:
    """SPEC section 3 on the client tools: a call that arrives for a reply the user cut (before their
    words are transcribed) is not run; the same tool call id asked twice runs once."""
    script: list[Step] = [
        opening("conv_guard"),
        *SCRIPT[:3],
        "await-tool-result tc_1",
        {"type": "client_tool_call", "client_tool_call": {"tool_name": "book", "tool_call_id": "tc_1"}},
        "await-tool-result tc_1",
        msg("agent_response", "agent_response_event", agent_response="Shall I also text you the code?"),
        msg("interruption", "interruption_event", event_id=9),
        {"type": "client_tool_call", "client_tool_call": {"tool_name": "send_sms", "tool_call_id": "tc_2"}},
        "await-tool-result tc_2",
    ]
    fake, base = await server(script)
    runs: list[str] = []

    async def book(params: dict[str, Any]) -> str:
        runs.append("book")
        return "BK-42"

    async def send_sms(params: dict[str, Any]) -> str:
        runs.append("send_sms")
        return "sent"

    tools = ClientTools()
    tools.register("book", book, is_async=True)
    tools.register("send_sms", send_sms, is_async=True)
    async with calltape.connect(store_url) as ct:
        await converse(ct, base, tools)
        assert runs == ["book"]
        results = {(r["tool_call_id"], json.dumps(r["result"])) for r in fake.results()}
        assert results == {("tc_1", '"BK-42"'), ("tc_2", '{"status": "cancelled", "reason": "interrupted"}')}
        state = (await ct.context("conv_guard")).tool_call("tc_2")
        assert state is not None and state.status == "cancelled" and not state.started


@needs_async
async def test_a_lost_connection_leaves_the_session_dropped(store_url: str, server: Any) -> None:
    """A connection error (not a normal close) records ``session.dropped``: the call can be resumed."""
    script: list[Step] = [opening("conv_lost"), SCRIPT[0], SCRIPT[1], "close 1011"]
    _, base = await server(script)
    async with calltape.connect(store_url) as ct:
        assert await converse(ct, base, ClientTools()) == "conv_lost"
        events = await ct.store.read("conv_lost")
        assert [e.type for e in events][-2:] == ["agent.speech.ended", "session.dropped"]
        assert (await ct.store.session_info("conv_lost")).status == "dropped"  # type: ignore[union-attr]


@needs_async
async def test_a_heard_first_effect_is_refused_at_once_in_a_voice_conversation(store_url: str, server: Any) -> None:
    """ElevenLabs never reports that a reply finished playing: a heard-first effect in a client tool is
    not run (never unheard) and is refused at once, not left waiting for a playout nobody reports."""
    fake, base = await server([opening("conv_effect"), *SCRIPT[:3], "await-tool-result tc_1"])
    charges: list[str] = []

    async def charge() -> str:
        charges.append("BK-42")
        return "BK-42"

    async def book(params: dict[str, Any]) -> Any:
        return await calltape.effect("book", "table-8pm", charge, heard=True)

    tools = ClientTools()
    tools.register("book", book, is_async=True)
    async with calltape.connect(store_url) as ct:
        started = asyncio.get_running_loop().time()
        await converse(ct, base, tools)
        assert asyncio.get_running_loop().time() - started < 5  # the tool's timeout is 30 s by default
        assert charges == []
        assert [r["result"] for r in fake.results()] == [{"status": "cancelled", "reason": "interrupted"}]
        events = await ct.store.read("conv_effect")
        assert [e.data["outcome"] for e in events if e.type == "tool.cancelled"] == ["not_run"]
        assert not [e for e in events if e.type == "tool.effect"]
