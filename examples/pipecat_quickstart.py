"""calltape + Pipecat, offline: record a call, guard a tool, seed a new pipeline from the log.

Run: python examples/pipecat_quickstart.py   (needs `pip install 'calltape[pipecat]'`; no keys, no network)

The LLM is scripted (a real ``LLMService`` subclass answering from a list), so the example runs anywhere.
The calltape lines that attach it are marked ``# calltape``.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    FunctionCallFromLLM,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import SpeechTimeoutUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.workers.runner import WorkerRunner

from calltape.adapters.pipecat import attach, connect, seed_llm_context
from calltape.runtime import ToolSpec

INSTRUCTIONS = "You are the order desk. Look orders up before answering."


class ScriptedLLM(LLMService):
    """Answers each inference from a script: first a tool call, then the answer."""

    def __init__(self) -> None:
        super().__init__()
        # One entry per inference: a tool call (name, arguments), then a spoken answer (text).
        self.turns: list[tuple[str, dict[str, Any]] | str] = [
            ("lookup_order", {"order": 42}),
            "Order 42 shipped on Monday.",
        ]

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        turn = self.turns.pop(0) if self.turns else "Anything else?"
        await self.push_frame(LLMFullResponseStartFrame())
        try:
            if isinstance(turn, str):
                await self._push_llm_text(turn)
            else:
                name, args = turn
                call = FunctionCallFromLLM(
                    function_name=name, tool_call_id="call_1", arguments=args, context=frame.context
                )
                await self.run_function_calls([call])
        finally:
            await self.push_frame(LLMFullResponseEndFrame())


async def lookup_order(params: FunctionCallParams) -> None:
    """An ordinary Pipecat handler: calltape runs it exactly once, under a timeout."""
    await asyncio.sleep(0.05)
    await params.result_callback({"order": params.arguments["order"], "status": "shipped"})


async def main() -> None:
    llm = ScriptedLLM()
    context = LLMContext(messages=[{"role": "system", "content": INSTRUCTIONS}])
    pair = LLMContextAggregatorPair(
        context,
        user_params=LLMUserAggregatorParams(
            user_turn_strategies=UserTurnStrategies(stop=[SpeechTimeoutUserTurnStopStrategy(user_speech_timeout=0.05)])
        ),
    )
    worker = PipelineWorker(Pipeline([pair.user(), llm, pair.assistant()]), idle_timeout_secs=None, enable_rtvi=False)

    async with connect(f"sqlite:///{Path(tempfile.mkdtemp()) / 'calltape.db'}") as ct:  # calltape
        tools = {"lookup_order": ToolSpec(timeout=5)}
        call = await attach(ct, worker, "call-42", agent="orders", tools=tools)  # calltape
        llm.register_function("lookup_order", lookup_order)  # Pipecat's own call: guarded since attach

        runner = WorkerRunner()
        await runner.add_workers(worker)
        running = asyncio.create_task(runner.run())
        await asyncio.sleep(0.2)  # let the pipeline start
        await worker.queue_frames(
            [
                VADUserStartedSpeakingFrame(),
                TranscriptionFrame("Where is order 42?", "caller", "now"),
                VADUserStoppedSpeakingFrame(),
            ]
        )
        await asyncio.sleep(1.0)
        await worker.queue_frame(EndFrame())
        await running

        print("calltape's context (OpenAI format):")
        print(json.dumps(call.context("openai"), indent=2))
        # A new pipeline (resume, handoff) starts from the settled log, never from IN_PROGRESS:
        seeded = seed_llm_context(call)
        print(f"\nseeded a new LLMContext with {len(seeded.get_messages())} messages")


if __name__ == "__main__":
    asyncio.run(main())
