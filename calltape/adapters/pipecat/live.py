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

from calltape.adapters.pipecat._percall import PipecatCall
from calltape.runtime.protocol import FoldedSink

log = logging.getLogger("calltape.adapters.pipecat")

_INSTALLED_ATTR = "_calltape_reconciler"
_TOOLS_HOOK_ATTR = "_calltape_tools_hook"


def reconcile_context(context: LLMContext, call: FoldedSink) -> int:
    """Makes ``context``'s tool messages agree with ``call``'s log; returns how many it changed."""
    return PipecatCall.of(call).reconcile(context)


def fix_before_inference(llm: Any, percall: PipecatCall, *, tools_hook: Callable[[Any], None] | None = None) -> None:
    """Wraps ``llm.process_frame`` once, so an ``LLMContextFrame`` is reconciled (by ``percall``,
    the call's fixer) before it runs.

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
            _reconcile(percall, frame.context)
        await original(frame, direction)
        if isinstance(frame, StartFrame | LLMSetToolsFrame):
            run_hook(getattr(frame, "tools", None))

    llm.process_frame = process_frame
    setattr(llm, _INSTALLED_ATTR, percall)


def fix_after_aggregator(aggregator: Any, percall: PipecatCall) -> None:
    """Wraps an assistant aggregator's ``process_frame`` once: each tool message it writes is then
    checked against the log (by ``percall``, the call's fixer) before the next frame."""
    if getattr(aggregator, _INSTALLED_ATTR, None) is not None:
        return
    original = aggregator.process_frame

    async def process_frame(frame: Frame, direction: FrameDirection) -> None:
        await original(frame, direction)
        if isinstance(frame, _TOOL_FRAMES):
            _reconcile(percall, aggregator.context)

    aggregator.process_frame = process_frame
    setattr(aggregator, _INSTALLED_ATTR, percall)


def _reconcile(percall: PipecatCall, context: LLMContext) -> None:
    try:
        percall.reconcile(context)
    except Exception:  # reconciliation must never break a live call
        log.exception("calltape: could not reconcile the live context")


_TOOL_FRAMES = (FunctionCallInProgressFrame, FunctionCallResultFrame, FunctionCallCancelFrame)
