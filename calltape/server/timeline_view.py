"""The timeline picture of any recorded call, served by ``calltape serve``.

``GET /sessions`` lists the latest calls, ``GET /sessions/{session}/timeline[?to=N]`` is the page
``calltape show SESSION --html`` writes. A call's timeline is its content (names, addresses, card
numbers read aloud), and the receiver may face the internet, so viewing is closed unless a viewer
token is configured (``CALLTAPE_VIEWER_TOKEN``), sent as a bearer token or as the password of HTTP
basic auth (a browser then asks for it), or the server runs with ``allow_unsigned`` (local
development only). The webhook secrets never open it: a platform that can post calls cannot read them.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from html import escape
from typing import Any, Final
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

from calltape.errors import StoreUnavailable
from calltape.picture import CSP, timeline_html

INDEX_LIMIT: Final = 200
"""Calls listed on ``GET /sessions``, latest first."""

_HEADERS: Final = {
    "Content-Security-Policy": f"{CSP}; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_CHALLENGE: Final = {"WWW-Authenticate": 'Basic realm="calltape timelines", charset="UTF-8"'}


def _presented(request: Request) -> str | None:
    """The token a request carries: ``Bearer TOKEN``, or the password of ``Basic user:TOKEN``."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2]
    return None


def _refused(request: Request, token: str | None, open_: bool) -> Response | None:
    """None when the request may view timelines, else the 401/403 that says why not."""
    if token is None:
        if open_:
            return None
        message = "viewing timelines is off: set CALLTAPE_VIEWER_TOKEN on the server to turn it on"
        return JSONResponse({"error": message}, status_code=403)
    presented = _presented(request)
    if presented is not None and hmac.compare_digest(presented.encode(), token.encode()):
        return None
    return JSONResponse({"error": "the viewer token is missing or wrong"}, status_code=401, headers=_CHALLENGE)


def viewer_routes(store: Any, *, token: str | None, open_: bool) -> list[BaseRoute]:
    """The two read-only routes over ``store``; ``token`` or ``open_`` decides who may read."""

    async def timeline(request: Request) -> Response:
        if (refusal := _refused(request, token, open_)) is not None:
            return refusal
        session = request.path_params["session"]
        to: int | None = None
        if "to" in request.query_params:
            raw = request.query_params["to"]
            if not raw.isdigit() or int(raw) < 1:
                return JSONResponse({"error": "'to' must be a seq, a whole number from 1"}, status_code=400)
            to = int(raw)
        try:
            info = await store.session_info(session)
            if info is None:
                return JSONResponse({"error": "no session by that id"}, status_code=404)
            events = await store.read(session, to_seq=to)
        except StoreUnavailable as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        return HTMLResponse(timeline_html(events, info), headers=_HEADERS)

    async def index(request: Request) -> Response:
        if (refusal := _refused(request, token, open_)) is not None:
            return refusal
        try:
            found = await store.sessions(limit=INDEX_LIMIT)
        except StoreUnavailable as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        rows = "".join(
            f'<tr><td><a href="/sessions/{escape(quote(i.session, safe=""))}/timeline">{escape(i.session)}</a></td>'
            f"<td>{escape(i.status)}</td><td>{escape(i.agent or '')}</td><td>{i.last_seq}</td></tr>"
            for i in found
        )
        page = (
            '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>calltape · calls</title>'
            '<link rel="icon" href="data:,"><style>body{font:14px system-ui,sans-serif;margin:18px}'
            "td,th{padding:3px 12px 3px 0;text-align:left}</style></head><body><h1>Recorded calls</h1>"
            f"<p>The latest {INDEX_LIMIT} at most; each links to its timeline.</p>"
            f"<table><tr><th>session</th><th>status</th><th>agent</th><th>events</th></tr>{rows}</table>"
            "</body></html>\n"
        )
        return HTMLResponse(page, headers=_HEADERS)

    return [
        Route("/sessions", index, methods=["GET"]),
        Route("/sessions/{session:path}/timeline", timeline, methods=["GET"]),
    ]
