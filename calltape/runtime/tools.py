"""Guarded tool execution (SPEC section 3): durable start, exactly-once by call id, a timeout on
every tool, an interruption policy, progress checkpoints."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Unpack

from calltape.errors import EffectNotRun, EffectUnknown
from calltape.projections import ToolCallState
from calltape.runtime import toolspec as _toolspec
from calltape.runtime.effects import GuardedCall, enter_guarded, leave_guarded
from calltape.runtime.protocol import ToolHost
from calltape.runtime.recovery import Recovery
from calltape.runtime.toolspec import *  # noqa: F403 (re-exported, see __all__)
from calltape.runtime.toolspec import ToolBody, ToolOptions, ToolOutcome, ToolSpec, canonical_arguments

# The spec types are re-exported: ``from calltape.runtime.tools import ToolSpec`` keeps working.
__all__ = ["ToolRunner"]
__all__ += _toolspec.__all__

log = logging.getLogger(__name__)


def _wants_progress(body: ToolBody) -> bool:
    try:
        return len(inspect.signature(body).parameters) >= 1
    except (TypeError, ValueError):
        return False


@dataclass(slots=True)
class _Running:
    task: asyncio.Task[Any]
    reply: str
    spec: ToolSpec
    interrupted: bool = False


class ToolRunner:
    """Runs tool bodies for one live session; the session's fold is the source of truth."""

    def __init__(self, call: ToolHost) -> None:
        self.call = call
        self.running: dict[str, _Running] = {}
        self._results: dict[str, asyncio.Future[ToolOutcome]] = {}
        self._not_run: set[str] = set()

    async def run(
        self, call_id: str, name: str, arguments: Any, body: ToolBody, **options: Unpack[ToolOptions]
    ) -> ToolOutcome:
        """Runs one tool call under the log's protection (see :meth:`CallSession.run_tool`)."""
        reply = options.get("reply")
        spec = options.get("spec") or self.call.tools.get(name) or ToolSpec()
        pending = self._results.get(call_id)
        if pending is not None:  # the same call asked again while it runs: wait for the one run
            self._report("duplicate_prevented", call=call_id, name=name, while_running=True)
            outcome = await asyncio.shield(pending)
            return replace(outcome, ran=False)  # this ask did not run the body: the first one did
        state = self.call.call_state(call_id)
        if state is None:
            data: dict[str, Any] = {"call": call_id, "name": name, "arguments": arguments}
            if reply is not None:
                data["reply"] = reply
            self.call.emit("tool.call", data)
            state = self.call.call_state(call_id)
            assert state is not None
        if state.status in ("completed", "error"):
            self._report("duplicate_prevented", call=call_id, name=name)
            return ToolOutcome(state.output, state.status, ran=False)
        if state.started and state.status != "in_progress":
            # Settled without a result (timeout, unknown, cancelled after it started): it may have had
            # its side effects already, so the same call id is never run again (SPEC 4: "never re-run
            # automatically"); the recorded outcome stands.
            self._report("duplicate_prevented", call=call_id, name=name, status=state.status)
            return ToolOutcome(state.output, state.status, ran=False)
        if not state.included or (state.status != "in_progress" and not state.started):
            # A call of an interrupted generation (or settled before it ever started): it must never
            # start (pipecat #4997). Its `tool.cancelled ... not_run` goes to the log once, so the log
            # says explicitly that it did not run (a second cancel of a call is ignored by the fold).
            derived = not state.included or (
                state.status == "cancelled"
                and isinstance(state.output, dict)
                and state.output.get("reason") == "interrupted"
            )
            if derived and call_id not in self._not_run:
                self._not_run.add(call_id)
                self.call.emit("tool.cancelled", {"call": call_id, "reason": "interrupted", "outcome": "not_run"})
            self._report("not_started", call=call_id, name=name)
            final = self.call.call_state(call_id) or state
            return ToolOutcome(final.output, final.status, ran=False)
        if spec.reuse_identical:
            earlier = self._identical(state)
            if earlier is not None:
                await self.call.emit_durable(
                    "tool.result", {"call": call_id, "output": earlier.output, "reused_from": earlier.call_id}
                )
                self._report("duplicate_prevented", call=call_id, name=name, identical_to=earlier.call_id)
                return ToolOutcome(earlier.output, "completed", ran=False)
        future: asyncio.Future[ToolOutcome] = asyncio.get_running_loop().create_future()
        self._results[call_id] = future
        try:
            outcome = await self._execute(call_id, name, state.reply, body, spec)
            future.set_result(outcome)
            return outcome
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a duplicate waiter is optional
            raise
        finally:
            del self._results[call_id]

    async def _execute(self, call_id: str, name: str, reply: str, body: ToolBody, spec: ToolSpec) -> ToolOutcome:
        await self.call.emit_durable("tool.started", {"call": call_id})

        def progress(state: Any, message: str | None = None) -> None:
            data: dict[str, Any] = {"call": call_id, "state": state}
            if message is not None:
                data["message"] = message
            self.call.emit("tool.progress", data)

        coro = body(progress) if _wants_progress(body) else body()  # type: ignore[call-arg]
        # The body's task sees which call it runs for: calltape.effect() finds it there, whatever the adapter.
        token = enter_guarded(GuardedCall(self, call_id, reply, name))
        try:
            task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        finally:
            leave_guarded(token)
        running = self.running[call_id] = _Running(task, reply, spec)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(spec.timeout):
                output = await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            await self.call.emit_durable("tool.cancelled", {"call": call_id, "reason": "timeout", "outcome": "unknown"})
            self._report("timeout", call=call_id, name=name, timeout_s=spec.timeout)
            return ToolOutcome({"status": "timeout"}, "timeout", ran=True)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not (running.interrupted and task.cancelled()) or (current is not None and current.cancelling()):
                # The caller itself was cancelled: take the body down with it, and say so in the log
                # (emit, not a durable append: a cancelled task must not wait) so the call is settled
                # rather than left open until a resume.
                task.cancel()
                self.call.emit("tool.cancelled", {"call": call_id, "reason": "cancelled", "outcome": "unknown"})
                raise
            await self.call.emit_durable(
                "tool.cancelled", {"call": call_id, "reason": "interrupted", "outcome": "unknown"}
            )
            # What the context shows for the call (the fold: outcome unknown -> {"status": "unknown"}),
            # so the agent hands the LLM the same output a replay of the log will.
            final = self.call.call_state(call_id)
            if final is None:
                return ToolOutcome({"status": "unknown"}, "unknown", ran=True)
            return ToolOutcome(final.output, final.status, ran=True)
        except EffectNotRun:
            # heard first, and the caller barged in before the announcement ended (SPEC section 8)
            settle = {"call": call_id, "reason": "interrupted", "outcome": "not_run"}
            return await self._settled(call_id, settle)
        except EffectUnknown:
            # an earlier run of the effect may have happened: never run again automatically
            return await self._settled(call_id, {"call": call_id, "reason": "effect_unknown", "outcome": "unknown"})
        except Exception as exc:
            # The LLM is told `{"error": ...}`; the developer gets the traceback. The line itself names
            # the tool and the exception type only: the message may quote arguments (event content).
            log.error("tool %s (call %s) raised %s", name, call_id, type(exc).__name__, exc_info=exc)
            output = {"error": str(exc) or type(exc).__name__}
            await self.call.emit_durable("tool.result", {"call": call_id, "output": output, "error": True})
            return ToolOutcome(output, "error", ran=True)
        finally:
            self.running.pop(call_id, None)
        await self.call.emit_durable("tool.result", {"call": call_id, "output": output})
        if running.interrupted or self.call.reply_interrupted(reply):
            self._report(
                "late_result", call=call_id, name=name, duration_ms=round((time.perf_counter() - started) * 1000, 3)
            )
        return ToolOutcome(output, "completed", ran=True)

    async def _settled(self, call_id: str, cancel: dict[str, Any]) -> ToolOutcome:
        """Records the call's ``tool.cancelled`` and returns what the context shows for it."""
        await self.call.emit_durable("tool.cancelled", cancel)
        final = self.call.call_state(call_id)
        if final is None:
            return ToolOutcome({"status": "cancelled", "reason": cancel["reason"]}, "cancelled", ran=True)
        return ToolOutcome(final.output, final.status, ran=True)

    def on_interruption(self) -> None:
        """Applies each running tool's interruption policy once the fold has taken the interruption."""
        for running in list(self.running.values()):
            if running.interrupted or not self.call.reply_interrupted(running.reply):
                continue
            running.interrupted = True
            if running.spec.on_interrupt == "cancel":
                running.task.cancel()  # the runner, awaiting it through a shield, records tool.cancelled

    def _identical(self, state: ToolCallState) -> ToolCallState | None:
        key = canonical_arguments(state.arguments)
        for other in self.call.fold.tool_calls():
            if (
                other.call_id != state.call_id
                and other.name == state.name
                and other.status == "completed"
                and canonical_arguments(other.arguments) == key
            ):
                return other
        return None

    def _report(self, kind: Any, **figures: Any) -> None:
        self.call.report(Recovery(kind, self.call.session_id, figures))
