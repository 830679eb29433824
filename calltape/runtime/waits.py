"""Interruption-aware waits: a barge-in releases every waiter at once, never after a fixed timeout."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from calltape.errors import Interrupted


class PlayoutWaiters:
    """Futures keyed by reply id: resolved when playout ends, failed with Interrupted on a barge-in."""

    def __init__(self) -> None:
        self._waiting: defaultdict[str, list[asyncio.Future[None]]] = defaultdict(list)

    def add(self, reply: str) -> asyncio.Future[None]:
        """A future for the end of ``reply``'s playout."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[reply].append(future)
        return future

    def has(self, reply: str) -> bool:
        """Whether anyone waits for ``reply``'s playout."""
        return bool(self._waiting.get(reply))

    def discard(self, reply: str, future: asyncio.Future[None]) -> None:
        """Forgets one waiter (it gave up or timed out)."""
        futures = self._waiting.get(reply)
        if futures and future in futures:
            futures.remove(future)
            if not futures:
                del self._waiting[reply]

    def finish(self, reply: str) -> int:
        """Releases the waiters of ``reply`` normally (playout ended); returns how many."""
        return self._settle(self._waiting.pop(reply, []), None)

    def interrupt(self, reply: str | None, cause: str | None = None) -> int:
        """Fails the waiters of ``reply``, or of every reply when it is None; returns how many."""
        replies = list(self._waiting) if reply is None else [reply]
        released = 0
        for rid in replies:
            released += self._settle(self._waiting.pop(rid, []), Interrupted(rid, cause))
        return released

    @staticmethod
    def _settle(futures: list[asyncio.Future[None]], error: Exception | None) -> int:
        n = 0
        for future in futures:
            if not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
                n += 1
        return n
