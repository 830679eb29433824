"""LiveKit Agents adapter (``pip install 'calltape[livekit]'``).

Attach in one call: ``tap = await start(session, agent, ct)`` (:mod:`.start`) instead of
``await session.start(agent)``, with ``ct = calltape.connect(url)``.

Four pieces, one module each, each answering a gap of the framework:

* :func:`attach` (:mod:`.tap`) records an ``AgentSession`` into a live call (normally a
  :class:`calltape.runtime.CallSession`): public ``AgentSession`` events only.
* :func:`wait_for_playout` (:mod:`.playout`) raises :class:`calltape.runtime.Interrupted` within
  milliseconds of an interruption, where upstream waits up to its 5 s ``INTERRUPTION_TIMEOUT``.
* :func:`function_tool` / :func:`guarded` (:mod:`.tools`) run a tool body under ``call.run_tool``:
  durable start, timeout, exactly-once per call id.
* :func:`to_chat_ctx` / :func:`rehydrate` (:mod:`.context`) seed a new ``Agent`` from a calltape
  context, keeping the calls of tools the new agent lacks.
"""

from calltape.adapters.livekit.context import instructions_of, rehydrate, to_chat_ctx
from calltape.adapters.livekit.playout import wait_for_playout
from calltape.adapters.livekit.start import modality_of, start
from calltape.adapters.livekit.tap import CallSink, LiveKitTap, attach, tap_of
from calltape.adapters.livekit.tools import function_tool, guarded, unguarded_tools

__all__ = [
    "SUPPORTED_VERSIONS",
    "CallSink",
    "LiveKitTap",
    "attach",
    "function_tool",
    "guarded",
    "instructions_of",
    "modality_of",
    "rehydrate",
    "start",
    "tap_of",
    "to_chat_ctx",
    "unguarded_tools",
    "wait_for_playout",
]

SUPPORTED_VERSIONS = ">=1.6.5,<1.9"
"""The livekit-agents releases this adapter is tested against (CI: 1.6.5 and the newest 1.8).

1.6.0-1.6.4 lack ``tool_execution_updated``, which the adapter needs to record a tool's start
before its body runs and its real end after a progress update. Before 1.8 LiveKit cancels the
tool execution of an interrupted turn and keeps none of its calls, so a ``finish`` guarded tool is
cancelled with the turn and its output never reaches the live ``ChatContext`` (docs/guides/livekit.md)."""
