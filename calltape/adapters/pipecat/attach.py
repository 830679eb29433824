"""Attaching calltape to a Pipecat pipeline in one call.

``call = await attach(ct, worker, "call-1")`` (``ct`` from :func:`calltape.connect`) starts the
session with what the pipeline already says: the modality (``voice`` when the pipeline has an output
transport, else ``text``) and the instructions (the system message of the pipeline's ``LLMContext``),
adds a :class:`~calltape.adapters.pipecat.CalltapeObserver` to the worker, and guards every LLM
service in it (:func:`~calltape.adapters.pipecat.guard`), so the app's own
``llm.register_function(name, handler)`` calls register guarded tools.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator, LLMUserAggregator
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.services.llm_service import LLMService
from pipecat.transports.base_output import BaseOutputTransport

from calltape.adapters.pipecat._percall import PipecatCall
from calltape.adapters.pipecat.live import fix_after_aggregator
from calltape.adapters.pipecat.messages import message_text
from calltape.adapters.pipecat.observer import CalltapeObserver
from calltape.adapters.pipecat.tools import guard, unguarded_tools
from calltape.client import Calltape
from calltape.errors import CalltapeError
from calltape.runtime import LiveCall, ToolSpec


def processors(root: Any) -> Iterator[FrameProcessor]:
    """Every processor of a pipeline (or a worker's pipeline), nested pipelines included."""
    pipeline = getattr(root, "pipeline", root)
    stack: list[Any] = [pipeline]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, FrameProcessor):
            yield node
        children = getattr(node, "processors", None)
        if isinstance(children, list | tuple):
            stack.extend(reversed(children))


def modality_of(root: Any) -> Literal["voice", "text"]:
    """``voice`` when the pipeline plays its replies through an output transport, else ``text``."""
    return "voice" if any(isinstance(p, BaseOutputTransport) for p in processors(root)) else "text"


def instructions_of(root: Any) -> str | None:
    """The system message(s) of the pipeline's ``LLMContext`` (what the LLM is instructed with)."""
    for processor in processors(root):
        if isinstance(processor, LLMUserAggregator):
            system = [
                message_text(m.get("content"))
                for m in processor.context.get_messages()
                if isinstance(m, dict) and m.get("role") in ("system", "developer")
            ]
            return "\n\n".join(s for s in system if s) or None
    return None


async def attach(
    calltape: Calltape,
    worker: Any,
    session_id: str,
    *,
    agent: str = "agent",
    instructions: str | None = None,
    tools: Mapping[str, ToolSpec] | None = None,
    on_end: Literal["end", "none"] = "end",
    on_cancel: Literal["drop", "end", "none"] = "drop",
    **start: Any,
) -> LiveCall:
    """Starts ``session_id`` on ``calltape`` (a :func:`calltape.connect` object) and records ``worker``
    (a ``PipelineWorker``) into it; returns the call.

    Modality and instructions come from the pipeline unless given. Every ``LLMService`` in the
    pipeline is guarded: register tools with ``llm.register_function`` after this call (a tool
    registered before it raises :class:`~calltape.errors.CalltapeError` instead of running unguarded).
    """
    llms = [p for p in processors(worker) if isinstance(p, LLMService)]
    for llm in llms:
        plain = unguarded_tools(llm)
        if plain:  # refuse before anything is written
            raise CalltapeError(
                "tools registered before attach() would run unguarded: "
                + ", ".join(sorted(plain))
                + "; register them with llm.register_function after attach()"
            )
    call = await calltape.start_call(
        session_id,
        agent=agent,
        instructions=instructions if instructions is not None else instructions_of(worker),
        modality=start.pop("modality", None) or modality_of(worker),
        framework="pipecat",
        tools=tools,
        **start,
    )
    for llm in llms:
        guard(llm, call)
    for processor in processors(worker):
        if isinstance(processor, LLMAssistantAggregator):
            fix_after_aggregator(processor, PipecatCall.of(call))
    worker.add_observer(CalltapeObserver(call, on_end=on_end, on_cancel=on_cancel))
    return call
