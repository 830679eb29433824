"""Connection-level limits for ``calltape serve``: what uvicorn does not bound on its own.

uvicorn closes idle keep-alive connections but waits forever for a request's headers, so clients that
trickle bytes (slowloris) hold connections until the process runs out of them, and ``/healthz`` stops
answering. :class:`BoundedH11Protocol` gives every request ``header_timeout`` seconds to finish its
headers and holds at most ``max_connections`` connections. Past the cap, a few more (:data:`HEALTH_LANE`)
are let in on a lane of their own that answers ``GET /healthz`` and refuses anything else with 503, so
a health probe is answered however many slow clients hold the server; a slow client in the lane is
the first to go when another arrives. Body read time is bounded in the application (a 408), where the
request is known.

Every connection costs a file descriptor, and a process past its limit cannot even accept (asyncio
then logs a traceback per attempt, thousands a second). :func:`connection_budget` raises the soft limit
toward the hard one at start and lowers the cap to what the descriptors allow; accept errors that still
happen (the whole system out of descriptors) are counted and summarized in one line now and then, as
are aborted uploads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("calltape.server")


HEALTH_LANE = 16
"""Connections let in past the cap, for ``/healthz`` only."""
LANE_HEADER_TIMEOUT = 2.0
"""Seconds a connection in the health lane has to send its request's headers."""
RESERVED_DESCRIPTORS = 64
"""File descriptors kept out of the connection budget: the database's connections, the listening
socket, the SQLite files and logs, whatever the application opens."""
ACCEPT_BACKLOG = 128
"""The listening socket's backlog, which is also how many connections asyncio accepts in one go before
any of them is seen (and one past the cap dropped): part of the descriptor budget."""

_Scope = MutableMapping[str, Any]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def _health_lane_app(scope: _Scope, receive: Any, send: _Send) -> None:
    """What a connection past the cap gets: ``/healthz`` answered, anything else a 503 (one sentence)."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/healthz" and scope["method"] in ("GET", "HEAD"):
        status, body = 200, b'{"ok":true}'
    else:
        status, body = 503, b'{"error":"the server is at its connection limit; try again shortly"}'
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"retry-after", b"1"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on request headers, a cap on open connections, and a
    health lane past the cap."""

    header_timeout: float = 10.0
    max_connections: int = 1000
    lane: ClassVar[dict[BoundedH11Protocol, None]] = {}
    """The connections in the health lane still waiting for their headers, oldest first (one dict per
    server: :func:`bounded_protocol` makes a class per server)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._in_lane = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Past the cap, lets the connection into the health lane (making room there by dropping the
        slowest waiting in it); otherwise starts the header deadline."""
        lane = self.lane
        if len(self.connections) - len(lane) >= self.max_connections:
            if len(lane) >= HEALTH_LANE:
                oldest = next(iter(lane))
                del lane[oldest]
                oldest.transport.abort()  # it has sent no request within the lane's deadline so far
            self._in_lane = True
            self.app = _health_lane_app
            lane[self] = None
            super().connection_made(transport)
            self._arm(LANE_HEADER_TIMEOUT)
            return
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stops the deadline and tears down the connection."""
        self._disarm()
        self.lane.pop(self, None)
        super().connection_lost(exc)

    def _should_upgrade(self) -> bool:
        return not self._in_lane and super()._should_upgrade()  # the lane serves /healthz, not WebSockets

    def handle_events(self) -> None:
        """Stops the header deadline once the headers are in (the application bounds the body)."""
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # the headers are in; the application bounds the body
            self.lane.pop(self, None)  # a request on its way: no longer the one to drop

    def on_response_complete(self) -> None:
        """Re-arms the header deadline for the next request on a kept-alive connection."""
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this connection gets its own deadline

    def _arm(self, timeout: float | None = None) -> None:
        self._disarm()
        delay = self.header_timeout if timeout is None else timeout
        self._header_deadline = self.loop.call_later(delay, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.cycle is None or self.cycle.response_complete:
            self.transport.abort()


class Summarized:
    """Counts an event that may come in floods and logs one line about it now and then, never a line
    (or a traceback) each."""

    def __init__(self, message: str, every: float = 60.0) -> None:
        self.message = message
        """The line, with ``%d`` for the count since the last one."""
        self.every = every
        self.total = 0
        self._unlogged = 0
        self._last = -every

    def note(self) -> None:
        """One more; logs the summary line when the last one is ``every`` seconds old."""
        self.total += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._last >= self.every:
            log.warning(self.message, self._unlogged)
            self._unlogged = 0
            self._last = now


class AbortedUploads(Summarized):
    """Counts requests whose client went away mid-body; logs one summary line a minute at most."""

    def __init__(self, every: float = 60.0) -> None:
        super().__init__("calltape serve: %d upload(s) aborted by the client since the last report", every)


_ACCEPT_FAILED = "socket.accept() out of system resource"


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, every: float = 10.0) -> Summarized:
    """Replaces asyncio's traceback per failed accept (the process or the system out of descriptors) by
    one summary line every ``every`` seconds; every other loop error goes to the handler as before."""
    failed = Summarized(
        "calltape serve: could not accept %d connection(s) since the last report: out of file descriptors "
        "(the connections held are kept; raise the open-file limit, ulimit -n)",
        every,
    )
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == _ACCEPT_FAILED:
            failed.note()
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    return failed


def _open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return RESERVED_DESCRIPTORS  # (not Linux: counted in the reserve's stead)


def connection_budget(max_connections: int) -> int:
    """How many connections this process can hold, at most ``max_connections``: the soft open-file limit
    is raised toward the hard one as far as the connections, the health lane, one accept backlog and a
    reserve need, and when even the hard limit is lower the cap comes down to fit (said once in the log)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return max_connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = _open_descriptors()
    overhead = in_use + RESERVED_DESCRIPTORS + HEALTH_LANE + ACCEPT_BACKLOG
    needed = overhead + max_connections
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return max_connections
    fits = max(1, soft - overhead)
    log.warning(
        "calltape serve: the open-file limit is %d (ulimit -n), so at most %d connections are held, not %d",
        soft,
        fits,
        max_connections,
    )
    return fits


def bounded_protocol(header_timeout: float, max_connections: int) -> type[BoundedH11Protocol]:
    """A protocol class carrying this server's limits (uvicorn takes a class, not an instance)."""
    return type(
        "BoundedH11Protocol",
        (BoundedH11Protocol,),
        {"header_timeout": header_timeout, "max_connections": max_connections, "lane": {}},
    )
