"""Retell's custom-LLM WebSocket as an ASGI route: Retell connects, calltape records, your LLM answers.

Retell opens ``wss://<your host>/<path>/{call_id}`` for every call and speaks the custom-LLM protocol
(``update_only``, ``response_required``, ``reminder_required``, …). :class:`RetellLLMEndpoint` holds what
the application brings (the ``respond`` generator, the agent's name and tools); the receiver mounts it at
``/retell/llm/{call_id}`` (``create_app(store, retell_llm=endpoint)``), or :func:`retell_llm_app` serves it
alone.

Retell does not sign this connection. Give the endpoint a ``token``: the route becomes
``/retell/llm/{token}/{call_id}`` (configure ``wss://host/retell/llm/<token>`` in Retell, which appends the
call id) and a connection with another token is closed with 1008 before anything is read or written.

Each connection records into the session ``{session_prefix}{call_id}``: a new session is started, or an
existing one (the ``call_started`` webhook came first, or Retell reconnected) is attached. Reply ids carry
the connection number (``retell-1``, then ``retell-c2-1`` after a reconnect), so a reconnected socket that
restarts Retell's ``response_id`` at 0 never collides with the replies already in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from calltape.adapters.retell import RetellLLMSession, RetellTurn
from calltape.eventstore.recorder import Recorder
from calltape.runtime import CallSession, ToolSpec

__all__ = ["RetellLLMEndpoint", "retell_llm_app"]

log = logging.getLogger("calltape.server.retell_llm")

CONNECTION_EVENT = "x.retell.connection"
MAX_CALL_ID = 200


@dataclass(frozen=True, slots=True)
class RetellLLMEndpoint:
    """What the application brings to the Retell custom-LLM route.

    ``respond(turn)`` yields text chunks and may ``await turn.run_tool(name, arguments, body)`` (guarded
    execution: a re-asked response joins the running call instead of running it again).
    """

    respond: Callable[[RetellTurn], AsyncIterator[str]]
    agent: str = "retell"
    instructions: str | None = None
    begin_message: str = ""
    tools: Mapping[str, ToolSpec] = field(default_factory=dict)
    token: str | None = None
    """Path secret: the route is ``/retell/llm/{token}/{call_id}`` when set."""
    config: Mapping[str, Any] | None = None
    """The ``config`` frame sent first (default: ``auto_reconnect`` and ``call_details`` on)."""

    @property
    def path(self) -> str:
        """The route this endpoint serves (with the path secret when there is one)."""
        return "/retell/llm/{token}/{call_id}" if self.token is not None else "/retell/llm/{call_id}"


class _Connections:
    """The recorder and the per-session locks one app shares between its routes."""

    def __init__(self, store: Any, locks: defaultdict[str, asyncio.Lock] | None = None) -> None:
        self.store = store
        self.locks: defaultdict[str, asyncio.Lock] = locks if locks is not None else defaultdict(asyncio.Lock)
        self._recorder: Recorder | None = None
        self._opening = asyncio.Lock()

    async def recorder(self) -> Recorder:
        async with self._opening:
            if self._recorder is None:
                self._recorder = await Recorder(self.store).start()
            return self._recorder

    def recorders(self) -> list[Recorder]:
        """The recorder, once a socket opened it (for ``GET /metrics``)."""
        return [self._recorder] if self._recorder is not None else []

    async def close(self) -> None:
        if self._recorder is not None:
            await self._recorder.close()
            self._recorder = None


def retell_llm_route(
    endpoint: RetellLLMEndpoint, connections: _Connections, *, session_prefix: str = ""
) -> WebSocketRoute:
    """The Starlette ``WebSocketRoute`` that serves ``endpoint``."""

    async def handle(websocket: WebSocket) -> None:
        params = websocket.path_params
        if endpoint.token is not None and not hmac.compare_digest(
            str(params.get("token", "")).encode(), endpoint.token.encode()
        ):
            await websocket.close(code=1008, reason="unknown Retell custom-LLM path")
            return
        call_id = str(params.get("call_id", ""))
        if not call_id or len(call_id) > MAX_CALL_ID:
            await websocket.close(code=1008, reason="invalid call id")
            return
        await websocket.accept()
        session = session_prefix + call_id
        recorder = await connections.recorder()
        async with connections.locks[session]:
            call, number = await _open_call(recorder, connections.store, session, call_id, endpoint)
        sending = asyncio.Lock()

        async def send(frame: dict[str, Any]) -> None:
            async with sending:  # the generation and the tool tasks write to the same socket
                await websocket.send_text(orjson.dumps(frame).decode())

        llm = RetellLLMSession(
            call,
            endpoint.respond,
            send,
            begin_message=endpoint.begin_message if number == 1 else "",
            config=endpoint.config,
            reply_prefix="retell-" if number == 1 else f"retell-c{number}-",
        )
        try:
            await llm.serve(websocket)
        finally:
            await recorder.flush()
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):  # already closed by Retell
                await websocket.close()

    return WebSocketRoute(endpoint.path, handle)


async def _open_call(
    recorder: Recorder, store: Any, session: str, call_id: str, endpoint: RetellLLMEndpoint
) -> tuple[CallSession, int]:
    """Starts the session, or attaches to it; returns the call and this connection's number (1, 2, …)."""
    await recorder.flush()
    existing = await store.read(session)
    if not existing:
        call = await CallSession.start(
            recorder,
            session,
            agent=endpoint.agent,
            instructions=endpoint.instructions,
            framework="retell",
            metadata={"retell_call_id": call_id},
            tools=endpoint.tools,
        )
        number = 1
    else:
        call = await CallSession.attach(recorder, session, tools=endpoint.tools)
        number = 1 + sum(1 for e in existing if e.type == CONNECTION_EVENT)
        if endpoint.instructions and not any(
            e.data.get("instructions") for e in existing if e.type == "session.started"
        ):
            call.emit("agent.instructions", {"text": endpoint.instructions})
    await call.emit_durable(CONNECTION_EVENT, {"number": number})
    return call, number


def retell_llm_app(store: Any, endpoint: RetellLLMEndpoint, *, session_prefix: str = "") -> Starlette:
    """A standalone ASGI app serving only the Retell custom-LLM WebSocket (``uvicorn`` it, or mount it)."""
    connections = _Connections(store)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await connections.close()

    return Starlette(routes=[retell_llm_route(endpoint, connections, session_prefix=session_prefix)], lifespan=lifespan)
