"""Guarded LiveKit tools: the body runs under ``call.run_tool`` (durable start, timeout, exactly-once)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import orjson
from livekit.agents import Agent, RunContext, llm
from livekit.agents import function_tool as lk_function_tool
from livekit.agents.llm import ToolError

from calltape.adapters.livekit.tap import tap_of
from calltape.adapters.outcomes import outcome_message
from calltape.runtime import ToolOutcome, ToolSpec

__all__ = ["function_tool", "guarded", "stored_output", "unguarded_tools"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def _run_context(args: Sequence[Any], kwargs: Mapping[str, Any]) -> RunContext[Any]:
    for value in (*args, *kwargs.values()):
        if isinstance(value, RunContext):
            return value
    raise TypeError("a guarded tool needs a RunContext parameter (e.g. `ctx: RunContext`)")


def guarded(fn: F | None = None, *, spec: ToolSpec | None = None) -> Any:
    """Runs the tool body under ``call.run_tool`` (durable start, timeout, exactly-once per call id).

    Put it under ``@function_tool``; the tool takes a ``RunContext``. Without ``spec`` the call's
    ``tools={name: ToolSpec}`` entry applies, else the defaults (10 s timeout, ``finish``).
    Outcomes other than ``completed`` reach the LLM as a ``ToolError`` saying what happened.
    """

    def decorate(func: F) -> F:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(
                "@guarded takes the tool's async function: put it under @function_tool "
                "(or use calltape.adapters.livekit.function_tool, which does both)"
            )

        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = _run_context(args, kwargs)
            tap = tap_of(ctx.session)
            if tap is None:
                raise RuntimeError("calltape is not attached to this AgentSession (call attach() first)")
            live = tap.live
            if live is None:
                raise RuntimeError("the attached call cannot run tools: attach a calltape LiveCall (a CallSession)")
            fc = ctx.function_call
            tap._guarded_calls.add(fc.call_id)
            try:
                arguments: Any = json.loads(fc.arguments or "{}")
            except ValueError:
                arguments = fc.arguments

            returned: list[Any] = []

            async def body() -> Any:
                value = await func(*args, **kwargs)
                returned.append(value)
                return stored_output(value)

            # The body runs in a task of its own: LiveKit cancelling the tool execution of an
            # interrupted turn must not cancel a `finish` tool (run_tool applies the policy itself).
            inner = asyncio.ensure_future(
                live.run_tool(fc.call_id, fc.name, arguments, body, reply=tap.reply_of(fc.call_id), spec=spec)
            )
            tap.hold(inner)
            try:
                outcome: ToolOutcome = await asyncio.shield(inner)
            except asyncio.CancelledError:
                inner.add_done_callback(lambda _: tap.land(fc, ctx.speech_handle))
                raise
            tap.land(fc, ctx.speech_handle)
            if outcome.status == "completed":
                # this run's own return goes to LiveKit as the tool gave it, so a handoff it
                # returned happens as for LiveKit's own function_tool; a call settled earlier
                # answers with what calltape stored (and hands off no second time)
                return returned[0] if outcome.ran and returned else outcome.output
            raise ToolError(outcome_message(outcome))

        wrapper.__calltape_guarded__ = True  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate(fn) if fn is not None else decorate


def stored_output(value: Any) -> Any:
    """What calltape stores as a guarded tool's result: JSON-safe, and for a handoff what LiveKit keeps.

    A tool that returns an ``Agent`` (alone or in a list, set or tuple with other output) hands off;
    LiveKit answers the call with the other output (``""`` when there is none) and records the
    handoff itself, so calltape stores that other output (its ``agent.handoff`` comes from LiveKit's
    handoff). A ``ToolResult`` is stored as its output. Anything JSON cannot hold is stored as its
    ``str()``, the text LiveKit gives the LLM for it."""
    agents, other = _handoff_parts(value)
    if agents:
        value = "" if other is None else other
    tool_result = getattr(llm, "ToolResult", None)  # livekit-agents 1.8 and later
    if tool_result is not None and isinstance(value, tool_result):
        value = value.output
    try:
        return orjson.loads(orjson.dumps(value))
    except TypeError:  # orjson.JSONEncodeError included
        return str(value)


def _handoff_parts(value: Any) -> tuple[list[Agent], Any]:
    """The agents a tool's return hands off to and its other output, as LiveKit splits them."""
    if isinstance(value, Agent):
        return [value], None
    if not isinstance(value, (list, set, frozenset, tuple)):
        return [], value
    agents = [item for item in value if isinstance(item, Agent)]
    other = [item for item in value if not isinstance(item, Agent)]
    if not agents:
        return [], value
    return agents, None if not other else other[0] if len(other) == 1 else other


def function_tool(
    fn: Callable[..., Awaitable[Any]] | None = None, *, spec: ToolSpec | None = None, **options: Any
) -> Any:
    """LiveKit's ``@function_tool`` with the body guarded: a drop-in for the framework's own registration.

    ``options`` are ``function_tool``'s (``name``, ``description``, ``flags``, ...); ``spec`` is the
    tool's :class:`~calltape.runtime.ToolSpec` (default: the call's ``tools`` entry, else the defaults).
    """

    def decorate(func: Callable[..., Awaitable[Any]]) -> Any:
        return lk_function_tool(guarded(func, spec=spec), **options)

    return decorate(fn) if fn is not None else decorate


def unguarded_tools(tools: Sequence[Any], specs: Mapping[str, ToolSpec]) -> list[str]:
    """Names of tools that have a :class:`~calltape.runtime.ToolSpec` in ``specs`` but run unguarded
    (registered with LiveKit's plain ``@function_tool``): calltape would not protect them."""
    found = llm.ToolContext(list(tools)).function_tools.values()
    return sorted(
        tool.info.name for tool in found if tool.info.name in specs and not getattr(tool, "__calltape_guarded__", False)
    )
