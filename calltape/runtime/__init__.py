"""The live runtime: guarded tools, interruption-aware waits, resume and handoff (SPEC sections 3, 4)."""

from calltape.errors import AlreadyResumed, EffectNotRun, EffectUnknown, Interrupted
from calltape.runtime.effects import DEFAULT_EFFECT_TIMEOUT, EffectReconcile, Reconciled, effect
from calltape.runtime.latency import Latencies, LatencyTracker, follow_latencies, session_latencies
from calltape.runtime.latency_otel import otel_latency_sink
from calltape.runtime.protocol import EventSink, FoldedSink, LiveCall, ToolHost
from calltape.runtime.recovery import Recovery, RecoveryBus, RecoveryStream, logging_sink, recoveries
from calltape.runtime.resume import ResumePlan, ToolDecision, handoff, resume
from calltape.runtime.session import CallInterceptor, CallSession, EventListener, StartOptions, Verdict
from calltape.runtime.stats import merge_stats, session_stats
from calltape.runtime.toolspec import DEFAULT_TIMEOUT, ToolOptions, ToolOutcome, ToolSpec, canonical_arguments

__all__ = [
    "DEFAULT_EFFECT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "AlreadyResumed",
    "CallInterceptor",
    "CallSession",
    "EffectNotRun",
    "EffectReconcile",
    "EffectUnknown",
    "EventListener",
    "EventSink",
    "FoldedSink",
    "Interrupted",
    "Latencies",
    "LatencyTracker",
    "LiveCall",
    "Reconciled",
    "Recovery",
    "RecoveryBus",
    "RecoveryStream",
    "ResumePlan",
    "StartOptions",
    "ToolDecision",
    "ToolHost",
    "ToolOptions",
    "ToolOutcome",
    "ToolSpec",
    "Verdict",
    "canonical_arguments",
    "effect",
    "follow_latencies",
    "handoff",
    "logging_sink",
    "merge_stats",
    "otel_latency_sink",
    "recoveries",
    "resume",
    "session_latencies",
    "session_stats",
]
