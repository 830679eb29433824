"""The live agent reconciled: Pipecat's ``LLMContext`` holds each call's one real output.

Pipecat settles a call its own way: on a barge-in it writes its cancellation placeholder into the
tool message and forgets the call, and a cancel that overtakes the in-progress frame leaves a
placeholder nothing will ever settle (pipecat-ai#3661). calltape's log knows better: a guarded
``finish`` tool keeps running and its result lands after the barge-in. So the live context is made to
agree with the log:

* when a call Pipecat gave up on lands, its output is written into the ``LLMContext`` at once;
* right after Pipecat's assistant aggregator writes a tool message (in progress, result, cancel), the
  message is checked against the log, so a late placeholder never overwrites a landed result;
* before every inference (an ``LLMContextFrame`` reaching the guarded LLM service), every tool message
  of a guarded call gets calltape's output (a call still running under ``finish`` says
  ``{"status": "in_progress"}`` rather than "cancelled"), so the LLM never sees a call without its one
  real output.

Only guarded calls are reconciled: a call calltape does not guard keeps Pipecat's own messages
("CANCELLED", "TIMEOUT", ...) in the live context, while calltape's log records how it ended.

Outputs are written the way Pipecat writes them (``json.dumps``); nothing compares Pipecat's own
placeholder strings: a message is rewritten when its content, read as JSON, differs from the log's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from pipecat.frames.frames import (
    Frame,
    FunctionCallCancelFrame,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    LLMContextFrame,
    LLMSetToolsFrame,
    StartFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection

from calltape.adapters.pipecat.shared import shared
from calltape.runtime.protocol import FoldedSink

log = logging.getLogger("calltape.adapters.pipecat")

_INSTALLED_ATTR = "_calltape_reconciler"
_TOOLS_HOOK_ATTR = "_calltape_tools_hook"


def reconcile_context(context: LLMContext, call: FoldedSink) -> int:
    """Makes ``context``'s tool messages agree with ``call``'s log; returns how many it changed."""
    return LiveReconciler.reconcile(context, call)


class LiveReconciler:
    """Installed on a guarded LLM service: reconciles each context it is asked to run inference on."""

    @staticmethod
    def install(llm: Any, call: FoldedSink, *, tools_hook: Callable[[Any], None] | None = None) -> None:
        """Wraps ``llm.process_frame`` once, so an ``LLMContextFrame`` is reconciled before it runs.

        ``tools_hook(tools)`` (set by :func:`~calltape.adapters.pipecat.guard`) is called with the
        context's tools before each inference, and after Pipecat took in a ``StartFrame`` or an
        ``LLMSetToolsFrame`` (when it registers tools on its own)."""
        if tools_hook is not None:
            setattr(llm, _TOOLS_HOOK_ATTR, tools_hook)
        if getattr(llm, _INSTALLED_ATTR, None) is not None:
            return
        original = llm.process_frame

        def run_hook(tools: Any) -> None:
            hook = getattr(llm, _TOOLS_HOOK_ATTR, None)
            if hook is None:
                return
            try:
                hook(tools)
            except Exception:  # guarding must never break a live call; the hook logs what it cannot guard
                log.exception("calltape: could not check the tools Pipecat registered")

        async def process_frame(frame: Frame, direction: FrameDirection) -> None:
            if isinstance(frame, LLMContextFrame):
                run_hook(frame.context.tools)
                try:
                    LiveReconciler.reconcile(frame.context, call)
                except Exception:  # reconciliation must never break a live call
                    log.exception("calltape: could not reconcile the live context")
            await original(frame, direction)
            if isinstance(frame, StartFrame | LLMSetToolsFrame):
                run_hook(getattr(frame, "tools", None))

        llm.process_frame = process_frame
        setattr(llm, _INSTALLED_ATTR, call)

    @staticmethod
    def install_aggregator(aggregator: Any, call: FoldedSink) -> None:
        """Wraps an assistant aggregator's ``process_frame`` once: each tool message it writes is then
        checked against the log before the next frame."""
        if getattr(aggregator, _INSTALLED_ATTR, None) is not None:
            return
        original = aggregator.process_frame

        async def process_frame(frame: Frame, direction: FrameDirection) -> None:
            await original(frame, direction)
            if isinstance(frame, _TOOL_FRAMES):
                try:
                    LiveReconciler.reconcile(aggregator.context, call)
                except Exception:  # reconciliation must never break a live call
                    log.exception("calltape: could not reconcile the live context")

        aggregator.process_frame = process_frame
        setattr(aggregator, _INSTALLED_ATTR, call)

    @staticmethod
    def reconcile(context: LLMContext, call: FoldedSink) -> int:
        """Rewrites each tool message of ``context`` whose call the log settled differently."""
        fold = call.fold
        state_of_call = shared(call)
        abandoned, guarded = state_of_call.abandoned, state_of_call.guarded_names
        changed = 0
        for message in context.get_messages():
            if not isinstance(message, dict) or message.get("role") != "tool":
                continue
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                continue
            state = fold.tool_call(call_id)
            if state is None or not state.included or state.name not in guarded:
                continue  # a call calltape does not guard keeps Pipecat's own message
            if state.status == "in_progress" and call_id not in abandoned:
                continue  # Pipecat still waits for it too
            if _as_json(message.get("content")) != state.output:
                message["content"] = json.dumps(state.output, ensure_ascii=False)
                changed += 1
        return changed


_TOOL_FRAMES = (FunctionCallInProgressFrame, FunctionCallResultFrame, FunctionCallCancelFrame)
_MISSING = object()


def _as_json(content: Any) -> Any:
    if not isinstance(content, str):
        return _MISSING
    try:
        return json.loads(content)
    except ValueError:
        return _MISSING
