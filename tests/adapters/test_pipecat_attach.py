"""Attaching to Pipecat in three lines: the README's program runs as written, and attach() takes the
modality and the instructions from the pipeline."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pipecat")

from pipecat.services.llm_service import FunctionCallParams
from pipecat_support import ScriptedLLM, build_voice_bot

from calltape.adapters.pipecat import attach, connect, modality_of
from calltape.errors import CalltapeError

pytestmark = pytest.mark.pipecat

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "pipecat.md"


def pipecat_attach_block() -> str:
    text = GUIDE.read_text()
    attach_part = text[text.index("## Attach") :]
    match = re.search(r"```python\n(.*?)```", attach_part, re.S)
    assert match is not None
    return match.group(1)


def test_the_guides_attach_is_three_lines_and_runs(tmp_path: Path) -> None:
    code = pipecat_attach_block()
    lines = [line.strip() for line in code.splitlines()]
    calltape_lines = [ln for ln in lines if "calltape" in ln or "connect(" in ln or "attach(" in ln]
    assert calltape_lines[0] == "from calltape.adapters.pipecat import attach, connect"
    assert [ln.split("(")[0] for ln in calltape_lines[1:]] == ["async with connect", "call = await attach"]
    ast.parse(code)
    script = tmp_path / "attach.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    messages = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert messages == [
        {"role": "system", "content": "You are Ada, an order-status agent."},
        {"role": "user", "content": "Please greet the caller."},
        {"role": "assistant", "content": "Hello, this is Ada. How can I help?"},
    ]


async def test_attach_takes_modality_and_instructions_from_the_pipeline() -> None:
    voice = build_voice_bot(ScriptedLLM([]), messages=[{"role": "system", "content": "Be kind."}])
    text = build_voice_bot(ScriptedLLM([]), output=False)
    assert modality_of(voice.worker) == "voice" and modality_of(text.worker) == "text"
    async with connect("sqlite:///:memory:") as ct:
        call = await attach(ct, voice.worker, "voice-call")
        assert call.fold.modality == "voice" and call.fold.instructions == "Be kind."
        call2 = await attach(ct, text.worker, "text-call")
        assert call2.fold.modality == "text" and call2.fold.instructions == "You are a test bot."


async def test_attach_refuses_a_tool_registered_before_it() -> None:
    llm = ScriptedLLM([])

    async def book(params: FunctionCallParams) -> None:
        await params.result_callback({"booked": True})

    llm.register_function("book", book)
    bot = build_voice_bot(llm)
    async with connect("sqlite:///:memory:") as ct:
        with pytest.raises(CalltapeError, match="book"):
            await attach(ct, bot.worker, "call-1")
        assert await ct.store.read("call-1") == []  # refused before anything was written
