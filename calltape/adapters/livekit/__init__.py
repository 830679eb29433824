"""LiveKit Agents adapter (``pip install 'calltape[livekit]'``).

Four pieces, one module each, each answering a gap of the framework:

* :func:`attach` (:mod:`.tap`) records an ``AgentSession`` into a live call (normally a
  :class:`calltape.runtime.CallSession`): public ``AgentSession`` events only.
* :func:`wait_for_playout` (:mod:`.playout`) raises :class:`calltape.runtime.Interrupted` within
  milliseconds of an interruption, where upstream waits up to its 5 s ``INTERRUPTION_TIMEOUT``.
* :func:`guarded` (:mod:`.tools`) runs a ``@function_tool`` body under ``call.run_tool``: durable
  start, timeout, exactly-once per call id.
* :func:`to_chat_ctx` / :func:`rehydrate` (:mod:`.context`) seed a new ``Agent`` from a calltape
  context, keeping the calls of tools the new agent lacks.
"""

from calltape.adapters.livekit.context import instructions_of, rehydrate, to_chat_ctx
from calltape.adapters.livekit.playout import wait_for_playout
from calltape.adapters.livekit.tap import CallSink, LiveKitTap, attach, tap_of
from calltape.adapters.livekit.tools import guarded

__all__ = [
    "SUPPORTED_VERSIONS",
    "CallSink",
    "LiveKitTap",
    "attach",
    "guarded",
    "instructions_of",
    "rehydrate",
    "tap_of",
    "to_chat_ctx",
    "wait_for_playout",
]

SUPPORTED_VERSIONS = ">=1.8,<1.9"
"""The livekit-agents releases this adapter is tested against."""
