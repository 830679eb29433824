"""Connection-level limits for ``calltape serve``: what uvicorn does not bound on its own.

uvicorn closes idle keep-alive connections but waits forever for a request's headers, so clients that
trickle bytes (slowloris) hold connections until the process runs out of them, and ``/healthz`` stops
answering. :class:`BoundedH11Protocol` gives every request ``header_timeout`` seconds to finish its
headers and refuses connections past ``max_connections`` at once. Body read time is bounded in the
application (a 408), where the request is known. Aborted uploads are counted and summarized in one
log line a minute instead of a traceback each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("calltape.server")


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on request headers and a cap on open connections."""

    header_timeout: float = 10.0
    max_connections: int = 1000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Refuses connections past the cap; otherwise starts the header deadline."""
        if len(self.connections) >= self.max_connections:
            transport.abort()  # past the cap: refused before it costs anything
            return
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stops the deadline and tears down the connection."""
        self._disarm()
        if getattr(self, "transport", None) is None:
            return  # refused in connection_made: nothing of ours to tear down
        super().connection_lost(exc)

    def handle_events(self) -> None:
        """Stops the header deadline once the headers are in (the application bounds the body)."""
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # the headers are in; the application bounds the body

    def on_response_complete(self) -> None:
        """Re-arms the header deadline for the next request on a kept-alive connection."""
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this connection gets its own deadline

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.cycle is None or self.cycle.response_complete:
            self.transport.abort()


class AbortedUploads:
    """Counts requests whose client went away mid-body; logs one summary line a minute at most."""

    def __init__(self, every: float = 60.0) -> None:
        self.every = every
        self.total = 0
        self._unlogged = 0
        self._last = 0.0

    def note(self) -> None:
        """One more aborted upload (the client disconnected before its body was read)."""
        self.total += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._last >= self.every:
            log.warning("calltape serve: %d upload(s) aborted by the client since the last report", self._unlogged)
            self._unlogged = 0
            self._last = now


def bounded_protocol(header_timeout: float, max_connections: int) -> type[BoundedH11Protocol]:
    """A protocol class carrying this server's limits (uvicorn takes a class, not an instance)."""
    return type(
        "BoundedH11Protocol",
        (BoundedH11Protocol,),
        {"header_timeout": header_timeout, "max_connections": max_connections},
    )
