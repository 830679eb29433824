"""Effects (SPEC section 8): a tool's real-world action, run at most once per ``(name, key)``.

From inside any guarded tool (``call.run_tool``, and so every adapter's guarded tools: Pipecat,
LiveKit, the Realtime tap, the hosted receivers' tools), the tool names the action and its key::

    async def charge_card(order_id: str, amount: int) -> dict:
        return await calltape.effect("charge", order_id, lambda: bank.charge(order_id, amount), heard=True)

What the call does:

1. ``heard=True``: waits (interruption-aware) until the reply that carried the call has played to its
   end uninterrupted. A barge-in first raises :class:`~calltape.errors.EffectNotRun`: the runner
   records ``tool.cancelled`` (``interrupted``, ``not_run``) and the action never runs.
2. Reads the effect's phases from the log (the store, not this process's memory):
   ``done`` answers with the recorded output; ``unknown`` asks ``reconcile`` (if given) and otherwise
   raises :class:`~calltape.errors.EffectUnknown`; ``started`` (another call or process runs it now)
   waits for its outcome; nothing, or ``failed``, lets this call claim a run.
3. Claims the run by appending ``started`` durably under an id every writer derives from
   ``(name, key, claim)`` (:func:`~calltape.projections.effects.effect_event_id`). The store keeps one
   event per id in a session, under its own locks (SQLite's write lock, PostgreSQL's row lock on the
   session and its unique index, the same shard on Citus): of two processes racing, the second gets
   the first one's event back, sees another claim token, and goes back to step 2.
4. Runs the action under ``timeout`` and records ``done`` with its output, or ``failed`` when it raised
   (the action did not happen), or ``unknown`` when it timed out, was cancelled, or raised
   :class:`~calltape.errors.EffectUnknown` itself.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from calltape.errors import EffectNotRun, EffectUnknown, Interrupted
from calltape.events import new_event_id
from calltape.projections.effects import EffectLog, EffectState, effect_event_id
from calltape.runtime.protocol import ToolHost
from calltape.runtime.recovery import Recovery

__all__ = [
    "DEFAULT_EFFECT_TIMEOUT",
    "EffectAction",
    "EffectReconcile",
    "GuardedCall",
    "Reconciled",
    "effect",
    "guarded_call",
    "record_verdict",
]

DEFAULT_EFFECT_TIMEOUT = 10.0
"""Seconds an action may take before its outcome is recorded as ``unknown``."""

POLL_SECONDS = 0.05
"""How soon a call waiting for another run of the same effect first re-reads the log (then less often,
up to :data:`MAX_POLL_SECONDS`: each read is a query, of the session's ``tool.effect`` events)."""
MAX_POLL_SECONDS = 0.5

EffectAction = Callable[[], Awaitable[Any]]
"""The real-world action: a coroutine function taking no argument (a lambda or ``functools.partial``)."""


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What the real system says of an effect whose outcome the log does not know."""

    happened: bool
    """True: it happened (recorded ``done`` with ``output``); False: it did not (``failed``: may run again)."""
    output: Any = None


EffectReconcile = Callable[[str, str], Awaitable[Reconciled | None]]
"""``reconcile(name, key)``: asks the real system (e.g. "is there a charge with this idempotency key?");
None when it still cannot tell."""


class _RunsTools(Protocol):
    @property
    def call(self) -> ToolHost: ...


@dataclass(frozen=True, slots=True)
class GuardedCall:
    """The tool call a guarded body runs for: what :func:`effect` needs to find, set by the runner."""

    runner: _RunsTools
    call_id: str
    reply: str
    tool: str
    refused: list[EffectNotRun | EffectUnknown] = field(default_factory=list)
    """What :func:`effect` raised in this call (an adapter whose framework turns a tool's exceptions into
    an error text for the model re-raises it, so the runner settles the call as SPEC section 8 says)."""

    @property
    def host(self) -> ToolHost:
        """The call the runner writes to now (a dropped writer's runner is cut off from the log)."""
        return self.runner.call


_GUARDED: ContextVar[GuardedCall | None] = ContextVar("calltape_guarded_call", default=None)


def guarded_call() -> GuardedCall | None:
    """The guarded tool call running in this task, or None outside a guarded tool."""
    return _GUARDED.get()


def enter_guarded(call: GuardedCall) -> Any:
    """Makes ``call`` the guarded call of tasks created until :func:`leave_guarded` (the runner's)."""
    return _GUARDED.set(call)


def leave_guarded(token: Any) -> None:
    """Undoes :func:`enter_guarded`."""
    _GUARDED.reset(token)


async def effect(
    name: str,
    key: str,
    action: EffectAction,
    *,
    heard: bool = False,
    timeout: float = DEFAULT_EFFECT_TIMEOUT,
    reconcile: EffectReconcile | None = None,
) -> Any:
    """Runs the real-world action ``(name, key)`` at most once for the session, from a guarded tool.

    Returns the action's output, or the recorded output of an earlier run that is ``done`` (under any
    call id, epoch, agent or process). Raises :class:`~calltape.errors.EffectNotRun` (heard first and
    the caller barged in) or :class:`~calltape.errors.EffectUnknown` (an earlier run's outcome is
    unknown and ``reconcile`` cannot tell); the guarded runner turns both into the call's
    ``tool.cancelled``. An exception of the action is recorded as ``failed`` and raised.
    """
    guarded = _GUARDED.get()
    if guarded is None:
        raise RuntimeError("calltape.effect() runs inside a guarded tool (call.run_tool or an adapter's guarded tool)")
    if not isinstance(name, str) or not name or not isinstance(key, str) or not key:
        raise ValueError("an effect needs a name and a key, both non-empty strings")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError("an effect timeout must be a positive, finite number of seconds")
    try:
        return await _effect(guarded, name, key, action, heard, timeout, reconcile)
    except (EffectNotRun, EffectUnknown) as exc:
        guarded.refused.append(exc)
        raise


async def _effect(
    guarded: GuardedCall,
    name: str,
    key: str,
    action: EffectAction,
    heard: bool,
    timeout: float,
    reconcile: EffectReconcile | None,
) -> Any:
    if heard:
        await _heard_first(guarded, name)
    lost: set[int] = set()  # claims this call found taken
    poll = POLL_SECONDS
    while True:
        host = guarded.host
        state = EffectLog.of(await host.effect_events()).get(name, key)
        phase = state.phase if state is not None else None
        if state is not None and phase == "done":
            _report(host, "effect_reused", guarded, name)
            return state.output
        if state is not None and phase == "unknown":
            verdict = await reconcile(name, key) if reconcile is not None else None
            if verdict is None:
                _report(host, "effect_not_rerun", guarded, name)
                raise EffectUnknown(name)
            await record_verdict(host, state, guarded.call_id, verdict)
            continue
        if phase == "started":
            await asyncio.sleep(poll)  # another call runs it now: its outcome answers this one
            poll = min(poll * 2, MAX_POLL_SECONDS)
            continue
        if heard and host.reply_interrupted(guarded.reply):  # a barge-in while the log was read
            _report(host, "effect_not_run", guarded, name)
            raise EffectNotRun(name, guarded.reply)
        claim = state.failures if state is not None else 0
        if claim in lost:  # taken, yet the log says it may run: a log not written by this API
            raise EffectUnknown(name, "its record in the log is inconsistent (a run claimed but not settled)")
        token = new_event_id()
        data: dict[str, Any] = {"call": guarded.call_id, "name": name, "key": key, "phase": "started", "claim": token}
        if heard:
            data["heard"] = True
        stored = await host.emit_durable("tool.effect", data, id=effect_event_id(name, key, claim, "started"))
        if stored.data.get("claim") != token:
            lost.add(claim)
            continue  # another writer claimed this run first: read what it did
        return await _run(host, guarded, name, key, claim, action, timeout)


async def _heard_first(guarded: GuardedCall, name: str) -> None:
    """Waits until the reply that carried the call has played out; a barge-in first: not run."""
    host = guarded.host
    if not host.playout_reported and _unplayed(host, guarded.reply):
        # nothing will say the announcement played out: never run unheard, and say so now
        _report(host, "effect_not_run", guarded, name)
        raise EffectNotRun(name, guarded.reply, "cannot be known to have played out on this platform")
    try:
        await host.wait_for_playout(guarded.reply)
        if not host.reply_interrupted(guarded.reply):
            return
    except Interrupted:
        pass
    _report(host, "effect_not_run", guarded, name)
    raise EffectNotRun(name, guarded.reply)


def _unplayed(host: ToolHost, reply: str) -> bool:
    """The reply has not played to its end uninterrupted (:attr:`ReplyState.played`)."""
    state = host.fold.reply_state(reply)
    return state is not None and not state.played


async def _run(
    host: ToolHost, guarded: GuardedCall, name: str, key: str, claim: int, action: EffectAction, timeout: float
) -> Any:
    base = {"call": guarded.call_id, "name": name, "key": key}
    unknown_id = effect_event_id(name, key, claim, "unknown")
    try:
        async with asyncio.timeout(timeout):
            output = await action()
    except TimeoutError:
        await host.emit_durable("tool.effect", {**base, "phase": "unknown"}, id=unknown_id)
        raise EffectUnknown(name, f"it took longer than {timeout:g} s") from None
    except EffectUnknown:
        await host.emit_durable("tool.effect", {**base, "phase": "unknown"}, id=unknown_id)
        raise
    except asyncio.CancelledError:
        # the tool was cancelled mid-action (a cancel-policy barge-in, the tool's timeout): it may have
        # happened. Emitted, not awaited: a cancelled task must not wait.
        host.emit("tool.effect", {**base, "phase": "unknown"}, id=unknown_id)
        raise
    except Exception as exc:
        failed = {**base, "phase": "failed", "output": {"error": str(exc) or type(exc).__name__}}
        await host.emit_durable("tool.effect", failed, id=effect_event_id(name, key, claim, "settled"))
        raise
    done = {**base, "phase": "done", "output": output}
    await host.emit_durable("tool.effect", done, id=effect_event_id(name, key, claim, "settled"))
    return output


async def record_verdict(host: ToolHost | None, state: EffectState, call: str, verdict: Reconciled) -> dict[str, Any]:
    """The ``done``/``failed`` a reconcile hook's verdict settles an unknown effect with (appended through
    ``host`` when given; resume appends it with its own events)."""
    data: dict[str, Any] = {"call": call, "name": state.name, "key": state.key, "phase": "failed", "reconciled": True}
    if verdict.happened:
        data.update(phase="done", output=verdict.output)
    if host is not None:
        slot = effect_event_id(state.name, state.key, state.failures, "settled")
        await host.emit_durable("tool.effect", data, id=slot)
    return data


def _report(host: ToolHost, kind: Any, guarded: GuardedCall, name: str) -> None:
    host.report(Recovery(kind, host.session_id, {"call": guarded.call_id, "name": guarded.tool, "effect": name}))
