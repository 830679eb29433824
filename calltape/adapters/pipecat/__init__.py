"""calltape for Pipecat (pipecat-ai >=1.10,<1.15): record, guard tools, keep the live context right.

One concept per module:

* :mod:`.observer` — :class:`CalltapeObserver` records a pipeline into a call (frames where they really
  happen: generated text at the LLM, heard text at the output transport, tools at the LLM service).
* :mod:`.user` — what of the user's input Pipecat really took (speech its mute strategies discard is
  not a user turn).
* :mod:`.messages` — messages apps inject with ``LLMMessagesAppendFrame`` / ``UpdateFrame`` /
  ``TransformFrame``.
* :mod:`.tools` — guarded tools: :func:`guard` makes ``llm.register_function(name, handler)`` run
  every handler under ``call.run_tool``; :func:`register_function` is the explicit form.
* :mod:`.live` — the live ``LLMContext`` is reconciled with the log before every inference.
* :mod:`.seed` — :func:`context_messages` / :func:`seed_llm_context` for a resumed or handed-off call.
* :mod:`.attach` — :func:`attach` wires all of it onto a pipeline in one call; :func:`connect` is
  :func:`calltape.connect`, re-exported so attaching takes one import::

      from calltape.adapters.pipecat import attach, connect
      async with connect("sqlite:///calls.db") as ct:
          call = await attach(ct, worker, "call-42")
"""

from __future__ import annotations

from calltape.extras import requires_extra

with requires_extra("pipecat"):
    import pipecat.frames.frames  # noqa: F401

from calltape.adapters.pipecat._percall import SUPPORTED_PIPECAT
from calltape.adapters.pipecat.attach import attach, modality_of
from calltape.adapters.pipecat.live import reconcile_context
from calltape.adapters.pipecat.observer import CalltapeObserver
from calltape.adapters.pipecat.seed import context_messages, seed_llm_context
from calltape.adapters.pipecat.tools import RegisterOptions, guard, register_function
from calltape.client import connect

__all__ = [
    "SUPPORTED_PIPECAT",
    "CalltapeObserver",
    "RegisterOptions",
    "attach",
    "connect",
    "context_messages",
    "guard",
    "modality_of",
    "reconcile_context",
    "register_function",
    "seed_llm_context",
]
