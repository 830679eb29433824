"""The webhook receiver: a small Starlette app that appends hosted platforms' webhooks to the store.

Every request is authenticated before its body is parsed, bounded in size, and validated completely
before anything is written: a bad request gets a one-sentence 4xx and leaves the log untouched. Event ids
are derived from the payloads, so the platforms' retries are harmless (appending a known id is a no-op).

Routes: ``POST /vapi``, ``POST /retell``, ``POST /bland``, ``POST /elevenlabs`` (the post-call
transcription webhook), ``POST /ultravox`` (the call webhooks), ``GET /healthz``, ``GET /metrics`` (counts,
findings and latency figures for Prometheus, :mod:`calltape.server.metrics`), the timeline pictures
(``GET /sessions``, ``GET /sessions/{id}/timeline``, see :mod:`calltape.server.timeline_view`), and,
when the application brings an LLM (``retell_llm=RetellLLMEndpoint(...)``), the Retell custom-LLM WebSocket
``/retell/llm/{call_id}`` (see :mod:`calltape.server.retell_llm`). A platform without a secret configured is
refused (403) unless ``allow_unsigned`` is set (local development only).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
from msgspec.structs import replace
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from calltape.adapters.bland import bland_events, parse_bland
from calltape.adapters.elevenlabs import conversation_of, elevenlabs_events
from calltape.adapters.reconstruct import is_reconstructed
from calltape.adapters.retell import retell_session, retell_webhook_events
from calltape.adapters.ultravox import MessageSource, api_messages, ultravox_webhook_events
from calltape.adapters.vapi import VapiIngest
from calltape.adapters.webhook_auth import (
    verify_bland_signature,
    verify_elevenlabs_signature,
    verify_retell_signature,
    verify_ultravox_signature,
    verify_vapi_request,
)
from calltape.errors import CalltapeError, FencedWrite, InvalidEvent, StoreUnavailable
from calltape.events import Event
from calltape.projections import build_context
from calltape.runtime.latency import SampleSink, follow_latencies
from calltape.runtime.latency_otel import otel_latency_sink
from calltape.server.limits import (
    ACCEPT_BACKLOG,
    AbortedUploads,
    bounded_protocol,
    connection_budget,
    quiet_accept_errors,
)
from calltape.server.metrics import CONTENT_TYPE, ServerMetrics
from calltape.server.retell_llm import CONNECTION_EVENT, RetellLLMEndpoint, _Connections, retell_llm_route
from calltape.server.timeline_view import viewer_routes

__all__ = ["ReceiverConfig", "create_app", "run_server"]

log = logging.getLogger("calltape.server")

DEFAULT_MAX_BODY = 2 * 1024 * 1024
"""An end-of-call report with a long transcript stays well under 2 MiB."""

MAX_SESSION_ID = 512
"""Longest session id (prefix + the platform's call id) the receiver accepts; call ids are UUID-sized."""


@dataclass(frozen=True, slots=True)
class ReceiverConfig:
    """The receiver's settings: each platform's credentials, size and time limits."""

    vapi_secret: str | None = None
    """Legacy ``X-Vapi-Secret`` value."""
    vapi_bearer: str | None = None
    """Bearer-token credential (``Authorization: Bearer …``)."""
    vapi_hmac_secret: str | None = None
    """HMAC credential (``X-Vapi-Signature``: hex SHA-256 of the body)."""
    retell_api_key: str | None = None
    """The Retell API key with the webhook badge (``X-Retell-Signature``)."""
    bland_secret: str | None = None
    """Bland's webhook signing secret (``X-Webhook-Signature``)."""
    elevenlabs_secret: str | None = None
    """The ElevenLabs post-call webhook's HMAC secret (``ElevenLabs-Signature: t=…,v0=…``)."""
    ultravox_secret: str | None = None
    """The Ultravox webhook's secret (``X-Ultravox-Webhook-Signature`` over the body and
    ``X-Ultravox-Webhook-Timestamp``)."""
    ultravox_api_key: str | None = None
    """An Ultravox API key: at ``call.ended`` the receiver fetches the call's messages with it
    (``GET /api/calls/{id}/messages``), so the transcript and tool calls land with the end."""
    ultravox_messages: MessageSource | None = None
    """The application's own source of a call's messages (``async (call_id) -> list``), used instead
    of the API key; without either, ``call.ended`` only closes the call."""
    max_body_bytes: int = DEFAULT_MAX_BODY
    """Largest webhook body, and largest Retell custom-LLM frame."""
    allow_unsigned: bool = False
    session_prefix: str = ""
    header_timeout: float = 10.0
    """Seconds a client has to send a request's headers; a trickling client is disconnected."""
    body_timeout: float = 30.0
    """Seconds a client has to send a request's body; past it the request gets 408."""
    max_connections: int = 1000
    """Open connections the server keeps at most (fewer when the open-file limit allows fewer). Past
    them, a few more are let in on a lane that answers only ``GET /healthz``."""
    retell_llm: RetellLLMEndpoint | None = None
    """Mounts the Retell custom-LLM WebSocket (the application's LLM behind it)."""
    allow_after_resume: bool = False
    """Write webhooks into a call even after it was resumed. By default the receiver writes as the
    call's first writer (epoch 1): once ``calltape resume`` hands the call to another agent, a late
    webhook of the old call is refused (409), never mixed into the resumed call."""
    metrics: bool = True
    """Serves ``GET /metrics`` and follows the store's feed for it (the latency figures also into
    OpenTelemetry histograms when the ``otel`` extra is installed)."""
    viewer_token: str | None = None
    """Opens ``GET /sessions`` and ``GET /sessions/{id}/timeline`` to requests that carry it (bearer
    token, or the password of basic auth); without it they are closed unless ``allow_unsigned``."""


class _Reject(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _read_body(request: Request, limit: int, timeout: float) -> bytes:
    try:
        async with asyncio.timeout(timeout):
            return await _read_body_now(request, limit)
    except TimeoutError:
        raise _Reject(408, f"the request body did not arrive within {timeout:g}s") from None


async def _read_body_now(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise _Reject(413, f"the request body is larger than {limit} bytes")
        except ValueError:
            raise _Reject(400, "Content-Length is not a number") from None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _Reject(413, f"the request body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _Reject(400, "the request body is not valid JSON") from None
    if not isinstance(value, dict):
        raise _Reject(400, "the request body must be a JSON object")
    return value


def _session(session: str) -> str:
    """A session id from a platform's call id, refused (422) before it reaches the store when the store
    could not keep it: the platform then gets one clear 4xx instead of retrying a 500 forever."""
    if len(session) > MAX_SESSION_ID or not session.isprintable():
        raise _Reject(422, "the call id is not a usable session id (control characters, or too long)")
    return session


def create_app(store: Any, config: ReceiverConfig | None = None, **options: Any) -> Starlette:
    """The receiver over an open :class:`~calltape.eventstore.EventStore`.

    Options are :class:`ReceiverConfig` fields (``create_app(store, retell_api_key=…)``).
    """
    cfg = config or ReceiverConfig(**options)
    vapi = VapiIngest(session_prefix=cfg.session_prefix)
    locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
    connections = _Connections(store, locks)
    aborted = AbortedUploads()

    def configured(platform: str, *secrets: str | None) -> None:
        if not any(s is not None for s in secrets) and not cfg.allow_unsigned:
            raise _Reject(403, f"no {platform} secret is configured; refusing unauthenticated webhooks")

    async def append(events: list[Event]) -> int:
        """Appends one session's events; returns how many were new (redeliveries add none)."""
        if not events:
            return 0
        info = await store.session_info(events[0].session)
        before = info.last_seq if info is not None else 0
        if not cfg.allow_after_resume:
            # The platform's call is the session's first writer: epoch 1, checked by the store under
            # the session's lock, so a resume that lands between the read above and this write still wins.
            events = [e if e.epoch is not None else replace(e, epoch=1) for e in events]
        try:
            stored = await store.append(events)
        except FencedWrite as exc:
            raise _Reject(
                409,
                f"the call was resumed by another agent (session '{exc.session}' is at epoch {exc.current}), "
                "so this webhook was not recorded",
            ) from None
        return sum(1 for e in stored if (e.seq or 0) > before)

    async def vapi_route(body: bytes, request: Request) -> dict[str, Any]:
        configured("Vapi", cfg.vapi_secret, cfg.vapi_bearer, cfg.vapi_hmac_secret)
        if any(s is not None for s in (cfg.vapi_secret, cfg.vapi_bearer, cfg.vapi_hmac_secret)):
            ok = verify_vapi_request(
                request.headers,
                body,
                secret=cfg.vapi_secret,
                bearer=cfg.vapi_bearer,
                hmac_secret=cfg.vapi_hmac_secret,
            )
            if not ok:
                raise _Reject(401, "the Vapi request is not authenticated")
        payload = _json_object(body)
        session = _session(vapi.session_of(payload))
        async with locks[session]:
            if not vapi.known(session):
                info = await store.session_info(session)
                if info is not None:  # a restart: continue from the fold of the stored log
                    vapi.restore(session, await build_context(store, session), ended=info.status == "ended")
            events = vapi.events(payload)
            written = await append(events)
        response: dict[str, Any] = {"appended": written}
        if payload.get("message", {}).get("type") == "tool-calls":
            # calltape observes; it does not run the tools. Vapi gets no results from here.
            response["results"] = []
        return response

    def authenticate(
        request: Request,
        platform: str,
        secret: str | None,
        header: str,
        verify: Callable[[str, str | None], bool],
        *,
        dated: bool = True,
    ) -> None:
        """Refuses the request unless the platform's secret is configured (or unsigned is allowed)
        and ``verify(secret, signature)`` accepts the signature the request carries in ``header``
        (a ``dated`` signature, one with a timestamp, may also be refused as too old)."""
        configured(platform, secret)
        if secret is not None and not verify(secret, request.headers.get(header)):
            raise _Reject(401, f"the {header} header does not match the body" + (", or is too old" if dated else ""))

    async def retell_route(body: bytes, request: Request) -> dict[str, Any]:
        authenticate(
            request,
            "Retell",
            cfg.retell_api_key,
            "X-Retell-Signature",
            partial(verify_retell_signature, body),
        )
        payload = _json_object(body)
        session = _session(retell_session(payload, cfg.session_prefix))
        async with locks[session]:
            existing = await store.read(session)
            started = any(e.type == "session.started" for e in existing)
            # recorded live = a custom-LLM connection wrote into it (its explicit record in the log)
            live = any(e.type == CONNECTION_EVENT for e in existing)
            events = retell_webhook_events(payload, session=session, started=started, live=live)
            return {"appended": await append(events)}

    async def post_call(session: str, events: list[Event]) -> dict[str, Any]:
        """A whole call reported after it ended: written once; a call recorded live is only closed."""
        async with locks[session]:
            existing = await store.read(session, limit=1)
            if existing and not is_reconstructed(existing[0]):
                info = await store.session_info(session)
                ended = [e for e in events if e.type == "session.ended"]
                events = ended if info is not None and info.status == "active" else []
            return {"appended": await append(events)}

    async def bland_route(body: bytes, request: Request) -> dict[str, Any]:
        authenticate(
            request,
            "Bland",
            cfg.bland_secret,
            "X-Webhook-Signature",
            partial(verify_bland_signature, body),
            dated=False,
        )
        call = parse_bland(_json_object(body))
        session = _session(cfg.session_prefix + call.call_id)
        return await post_call(session, bland_events(call, session=session))

    async def elevenlabs_route(body: bytes, request: Request) -> dict[str, Any]:
        authenticate(
            request,
            "ElevenLabs",
            cfg.elevenlabs_secret,
            "ElevenLabs-Signature",
            partial(verify_elevenlabs_signature, body),
        )
        payload = _json_object(body)
        if payload.get("type") != "post_call_transcription":
            return {"appended": 0}  # post_call_audio, call_initiation_failure: nothing the log records
        session = _session(cfg.session_prefix + str(conversation_of(payload)["conversation_id"]))
        return await post_call(session, elevenlabs_events(payload, session=session))

    ultravox_source: MessageSource | None = cfg.ultravox_messages
    if ultravox_source is None and cfg.ultravox_api_key is not None:
        ultravox_source = api_messages(cfg.ultravox_api_key)

    async def ultravox_route(body: bytes, request: Request) -> dict[str, Any]:
        stamp = request.headers.get("x-ultravox-webhook-timestamp")
        authenticate(
            request,
            "Ultravox",
            cfg.ultravox_secret,
            "X-Ultravox-Webhook-Signature",
            lambda secret, signature: verify_ultravox_signature(body, secret, signature, stamp),
        )
        payload = _json_object(body)
        call = payload.get("call")
        if not isinstance(call, dict) or not isinstance(call.get("callId"), str) or not call["callId"]:
            raise _Reject(400, "an Ultravox webhook needs 'event' and 'call.callId'")
        session = _session(cfg.session_prefix + call["callId"])
        messages = None
        if payload.get("event") == "call.ended" and ultravox_source is not None:
            try:
                messages = list(await ultravox_source(call["callId"]))
            except Exception as exc:  # Ultravox retries the webhook; nothing is written meanwhile
                log.warning("could not fetch the messages of an Ultravox call: %s", type(exc).__name__)
                raise _Reject(503, "the call's messages could not be fetched from Ultravox; retry later") from None
        async with locks[session]:
            existing = await store.read(session, limit=1)
            if existing and not is_reconstructed(existing[0]):
                return {"appended": 0}  # recorded live by calltape: the live log says more
            events = ultravox_webhook_events(payload, session=session, started=bool(existing), messages=messages)
            return {"appended": await append(events)}

    def endpoint(
        handler: Callable[[bytes, Request], Awaitable[dict[str, Any]]],
    ) -> Callable[[Request], Awaitable[JSONResponse]]:
        async def route(request: Request) -> JSONResponse:
            try:
                body = await _read_body(request, cfg.max_body_bytes, cfg.body_timeout)
                return JSONResponse(await handler(body, request))
            except ClientDisconnect:
                aborted.note()  # nobody is left to answer; counted, not a traceback per request
                return _error(400, "the client disconnected before its request body arrived")
            except _Reject as exc:
                return _error(exc.status, exc.message)
            except FencedWrite as exc:
                return _error(409, str(exc))
            except InvalidEvent as exc:
                return _error(422, str(exc))
            except StoreUnavailable as exc:
                return _error(503, str(exc))
            except CalltapeError as exc:
                return _error(409, str(exc))

        return route

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    routes: list[BaseRoute] = [
        Route("/vapi", endpoint(vapi_route), methods=["POST"]),
        Route("/retell", endpoint(retell_route), methods=["POST"]),
        Route("/bland", endpoint(bland_route), methods=["POST"]),
        Route("/elevenlabs", endpoint(elevenlabs_route), methods=["POST"]),
        Route("/ultravox", endpoint(ultravox_route), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    routes.extend(viewer_routes(store, token=cfg.viewer_token, open_=cfg.allow_unsigned))
    if cfg.retell_llm is not None:
        routes.append(retell_llm_route(cfg.retell_llm, connections, session_prefix=cfg.session_prefix))
    counted = ServerMetrics(store, recorders=connections.recorders) if cfg.metrics else None
    if counted is not None:

        async def metrics(request: Request) -> Response:
            return Response(counted.exposition(), media_type=CONTENT_TYPE)

        routes.append(Route("/metrics", metrics, methods=["GET"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks: list[asyncio.Task[None]] = []
        if counted is not None:
            sinks: list[SampleSink] = [counted.latency]
            otel = otel_latency_sink()
            if otel is not None:
                sinks.append(otel)
            try:
                start = await store.head()  # from now: taken before the first request is served
            except StoreUnavailable:
                start = None  # the follower waits for the database
            follow = follow_latencies(store, sinks, after=start, observers=[counted.observe])
            tasks.append(asyncio.create_task(follow, name="calltape-metrics"))
            tasks.append(asyncio.create_task(counted.run(), name="calltape-findings"))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await connections.close()  # flushes what the custom-LLM sockets recorded

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.aborted_uploads = aborted
    app.state.metrics = counted
    app.state.latency = counted.latency if counted is not None else None
    return app


async def serve(url: str | None, host: str, port: int, *, config: ReceiverConfig, log_level: str = "info") -> None:
    import uvicorn

    from calltape.eventstore import open_store

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            # The store closes here, inside uvicorn's own shutdown: after it, uvicorn raises the Ctrl-C it
            # caught again, which cancels this task, and a connection still closing then would print a
            # traceback (SQLite's closes in a thread the cancellation interrupts).
            await super().shutdown(sockets)
            await store.close()

    quiet_accept_errors(asyncio.get_running_loop())
    store = await open_store(url)
    try:
        app = create_app(store, config)
        server = Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level=log_level,
                timeout_keep_alive=5,
                lifespan="on",
                ws_max_size=config.max_body_bytes,
                http=bounded_protocol(config.header_timeout, connection_budget(config.max_connections)),
                backlog=ACCEPT_BACKLOG,
            )
        )
        await server.serve()
    finally:
        await store.close()


def run_server(
    url: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8787,
    *,
    log_level: str = "info",
    **options: Any,
) -> None:
    """Runs ``calltape serve`` until interrupted. ``options`` are :class:`ReceiverConfig` fields; a
    secret left out is read from the environment (``CALLTAPE_VAPI_SECRET``, ``CALLTAPE_RETELL_API_KEY``…)."""
    import os

    env: Mapping[str, str] = os.environ
    for field_name, var in (
        ("vapi_secret", "CALLTAPE_VAPI_SECRET"),
        ("vapi_bearer", "CALLTAPE_VAPI_BEARER"),
        ("vapi_hmac_secret", "CALLTAPE_VAPI_HMAC_SECRET"),
        ("retell_api_key", "CALLTAPE_RETELL_API_KEY"),
        ("bland_secret", "CALLTAPE_BLAND_SECRET"),
        ("elevenlabs_secret", "CALLTAPE_ELEVENLABS_SECRET"),
        ("ultravox_secret", "CALLTAPE_ULTRAVOX_SECRET"),
        ("ultravox_api_key", "CALLTAPE_ULTRAVOX_API_KEY"),
        ("viewer_token", "CALLTAPE_VIEWER_TOKEN"),
    ):
        if options.get(field_name) is None and env.get(var):
            options[field_name] = env[var]
    asyncio.run(serve(url, host, port, config=ReceiverConfig(**options), log_level=log_level))
