"""How a tool is run (its spec) and what running it gave (its outcome).

A module of plain values, below both the runner (:mod:`calltape.runtime.tools`) and the live call
(:mod:`calltape.runtime.session`), so adapters and the :class:`~calltape.runtime.protocol.LiveCall`
protocol can name these types without importing either.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from calltape.canonical_json import canonical_arguments
from calltape.projections import ToolCallState

__all__ = [
    "DEFAULT_TIMEOUT",
    "Progress",
    "Reconcile",
    "ToolBody",
    "ToolOptions",
    "ToolOutcome",
    "ToolSpec",
    "canonical_arguments",
]

DEFAULT_TIMEOUT = 10.0

Progress = Callable[..., None]
"""``progress(state, message=None)``: records a ``tool.progress`` checkpoint."""
ToolBody = Callable[[], Awaitable[Any]] | Callable[[Progress], Awaitable[Any]]
Reconcile = Callable[[ToolCallState], Awaitable[Any]]
"""Asks the tool's own system what happened to a call of unknown outcome; returns its output, or
``None`` when it still cannot tell (e.g. "is there a booking with this idempotency key?")."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """How calltape runs one tool. Every field has a safe default; none means "wait forever"."""

    timeout: float = DEFAULT_TIMEOUT
    on_interrupt: Literal["finish", "cancel"] = "finish"
    idempotent: bool = False
    """Safe to run twice: resume plans a ``retry`` for it instead of ``unknown``."""
    reuse_identical: bool = False
    """An identical call (same name, same canonical arguments) completed earlier returns its result."""
    reconcile: Reconcile | None = None

    def __post_init__(self) -> None:
        timeout = self.timeout
        # NaN passes a plain `<= 0` test and makes asyncio.timeout wait forever: refuse it too.
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ValueError("a tool timeout must be a positive, finite number of seconds")


class ToolOptions(TypedDict, total=False):
    """The keyword options of one guarded tool call (``run_tool(..., reply=..., spec=...)``), defined
    once so that the protocol, the live call, the runner and the replay harness cannot drift apart."""

    reply: str | None
    """The reply (generation) that asked for the call: a call of an interrupted reply never starts."""
    spec: ToolSpec | None
    """How to run it; else the spec registered for the tool's name, else the defaults."""


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a guarded run gave the agent, and whether the body actually ran (exactly-once shows here)."""

    output: Any
    status: str
    """completed, error, timeout, cancelled or unknown."""
    ran: bool
    """False when calltape answered from the log (exactly-once) or refused to start the call."""
