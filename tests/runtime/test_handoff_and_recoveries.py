"""Handoff to another live agent (SPEC section 4) and recovery observability: sinks, the async stream,
``x.recovery`` events in the log, ``session_stats`` and OpenTelemetry spans."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from runtime_support import (
    Body,
    assert_live_matches_log,
    assistant_then_outputs,
    collecting_bus,
    live_call,
    log_of,
    output_of,
    reply,
)

from calltape.errors import FencedWrite
from calltape.eventstore import EventStore
from calltape.projections import build_context, render
from calltape.runtime import (
    CallSession,
    Interrupted,
    Recovery,
    RecoveryBus,
    RecoveryStream,
    ToolSpec,
    handoff,
    logging_sink,
    merge_stats,
    resume,
    session_stats,
)


async def _booked(live: Any) -> None:
    call = live.call
    call.emit("user.text", {"text": "Book two at eight, and I have a billing question."})
    reply(call, "r1", "Booked. ", ("t1", "book", {"people": 2}))
    await call.run_tool("t1", "book", {"people": 2}, Body({"booking": "B-1"}))
    call.emit("agent.speech.started", {"reply": "r1"})
    call.emit("agent.speech.ended", {"reply": "r1", "interrupted": False})


# -- handoff -----------------------------------------------------------------------------------


async def test_call_session_handoff(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        await _booked(live)
        messages = await live.call.handoff(
            "billing", instructions="You handle billing.", reason="billing question", format="openai"
        )
        assert live.call.agent == "billing"

        # The new agent's context: its instructions, and the previous agent's call and output kept
        # (the billing agent has no "book" tool).
        assert messages[0] == {"role": "system", "content": "You handle billing."}
        (assistant,) = [m for m in messages if m["role"] == "assistant"]
        assert assistant["tool_calls"][0]["id"] == "t1" and assistant["tool_calls"][0]["function"]["name"] == "book"
        (tool,) = [m for m in messages if m["role"] == "tool"]
        assert tool == {"role": "tool", "tool_call_id": "t1", "content": '{"booking":"B-1"}'}

        native = await assert_live_matches_log(live, store, session_id)
        assert messages == render(native, "openai")
        assert {"type": "handoff", "from": "triage", "to": "billing"} in native["items"]
        assistant_then_outputs(native, ["t1"])
        assert native["agent"] == "billing"

        live.call.emit("agent.reply.started", {"reply": "r2"})
        await live.recorder.flush()
        events = await log_of(store, session_id)
        (event,) = [e for e in events if e.type == "agent.handoff"]
        assert event.data == {
            "from": "triage",
            "to": "billing",
            "instructions": "You handle billing.",
            "reason": "billing question",
        }
        assert events[-1].agent == "billing"  # later events are the new agent's
        info = await store.session_info(session_id)
        assert info is not None and info.agent == "billing"
        (rec,) = live.of("handoff")
        assert rec.figures == {"from": "triage", "to": "billing"}
        assert [e.data for e in events if e.type == "x.recovery"] == [
            {"kind": "handoff", "from": "triage", "to": "billing"}
        ]


async def test_handoff_from_outside_the_live_process(store: EventStore, session_id: str) -> None:
    bus, reported = collecting_bus()
    async with live_call(store, session_id) as live:
        await _booked(live)
        await live.recorder.flush()
    ctx = await handoff(store, session_id, "billing", instructions="You handle billing.", format="anthropic", bus=bus)
    native = (await build_context(store, session_id)).native()
    assert ctx == render(native, "anthropic")
    assert ctx["system"] == "You handle billing."
    blocks = [b for m in ctx["messages"] for b in (m["content"] if isinstance(m["content"], list) else [])]
    assert {"type": "tool_use", "id": "t1", "name": "book", "input": {"people": 2}} in blocks
    assert any(b["type"] == "tool_result" and b["tool_use_id"] == "t1" for b in blocks)
    assert native["agent"] == "billing"
    assert {"type": "handoff", "from": "triage", "to": "billing"} in native["items"]
    assert [r.kind for r in reported] == ["handoff"]
    events = await log_of(store, session_id)
    assert [e.data for e in events if e.type == "x.recovery"] == [
        {"kind": "handoff", "from": "triage", "to": "billing"}
    ]
    assert session_stats(events)["recoveries"] == {"handoff": 1}

    native_ctx = await handoff(store, session_id, "triage")  # and back: native by default
    assert native_ctx == (await build_context(store, session_id)).native()
    assert [i for i in native_ctx["items"] if i["type"] == "handoff"] == [
        {"type": "handoff", "from": "triage", "to": "billing"},
        {"type": "handoff", "from": "billing", "to": "triage"},
    ]
    assert output_of(native_ctx, "t1")["output"] == {"booking": "B-1"}


# -- recovery observability --------------------------------------------------------------------


async def test_every_recovery_reaches_the_sinks_the_stream_and_the_log(
    store: EventStore, session_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[Recovery] = []
    bus = RecoveryBus(sinks=[got.append, logging_sink])
    streamed: list[Recovery] = []

    async def listen() -> None:
        async for recovery in bus.stream.subscribe():
            streamed.append(recovery)

    listener = asyncio.create_task(listen())
    await asyncio.sleep(0)
    caplog.set_level(logging.INFO, logger="calltape.recovery")
    old = await CallSession.start(
        live_recorder := await _recorder(store), session_id, agent="triage", bus=bus, tools={"slow": ToolSpec(0.05)}
    )
    try:
        call = old
        call.emit("user.text", {"text": "hi"})
        # timeout
        reply(call, "r1", None, ("t1", "slow", {}))
        await call.run_tool("t1", "slow", {}, Body(gated=True))
        # late result + waiter released
        reply(call, "r2", "Checking.", ("t2", "book", {}))
        call.emit("agent.speech.started", {"reply": "r2"})
        body = Body({"ok": True}, gated=True)
        task = asyncio.create_task(call.run_tool("t2", "book", {}, body))
        waiter = asyncio.create_task(call.wait_for_playout("r2"))
        await body.started.wait()
        call.interrupt()
        with pytest.raises(Interrupted):
            await waiter
        body.release()
        await task
        # duplicate prevented
        await call.run_tool("t2", "book", {}, body)
        # handoff
        await call.handoff("billing")
        await call.drop()
        await live_recorder.flush()
        # resume (same bus), then the old writer is fenced
        await resume(store, session_id, "backup", bus=bus)
        call.emit("user.text", {"text": "zombie"})
        await live_recorder.flush()
    finally:
        await live_recorder.close()
    await asyncio.sleep(0)
    listener.cancel()

    kinds = [r.kind for r in got]
    assert kinds == [
        "timeout",
        "waiter_released",
        "late_result",
        "duplicate_prevented",
        "handoff",
        "resume",
        "fenced_write",
    ]
    assert streamed == got
    by = {r.kind: r.figures for r in got}
    assert by["timeout"] == {"call": "t1", "name": "slow", "timeout_s": 0.05}
    assert by["late_result"]["call"] == "t2" and by["late_result"]["duration_ms"] > 0
    assert by["waiter_released"]["reply"] == "r2" and by["waiter_released"]["release_ms"] >= 0
    assert by["duplicate_prevented"] == {"call": "t2", "name": "book"}
    assert by["handoff"] == {"from": "triage", "to": "billing"}
    assert by["resume"]["epoch"] == 2 and by["resume"]["agent"] == "backup" and by["resume"]["duration_ms"] >= 0
    assert by["fenced_write"] == {"type": "user.text", "epoch": 1, "current_epoch": 2}
    assert all(r.session == session_id and r.at_ms > 0 for r in got)
    logged = [r.getMessage() for r in caplog.records if r.name == "calltape.recovery"]
    assert len(logged) == len(got) and "calltape recovery timeout" in logged[0] and "timeout_s=0.05" in logged[0]

    events = await log_of(store, session_id)
    assert [e.data["kind"] for e in events if e.type == "x.recovery"] == kinds
    stats = session_stats(events)
    assert stats["session"] == session_id
    assert stats["recoveries"] == {
        "duplicate_prevented": 1,
        "fenced_write": 1,
        "handoff": 1,
        "late_result": 1,
        "resume": 1,
        "timeout": 1,
        "waiter_released": 1,
    }
    assert (stats["resumes"], stats["handoffs"], stats["drops"], stats["interruptions"]) == (1, 1, 1, 1)
    assert stats["tools"]["calls"] == 2
    assert stats["tools"]["outcomes"] == {"completed": 1, "timeout": 1}
    assert stats["tools"]["duration_ms_max"] >= 0
    assert stats["events"] == len(events)

    total = merge_stats([stats, stats])
    assert total["sessions"] == 2 and total["recoveries"]["resume"] == 2 and total["resumes"] == 2


async def _recorder(store: EventStore) -> Any:
    from calltape.eventstore.recorder import Recorder

    return await Recorder(store, on_rejected=lambda evs, err: None).start()


async def test_subscribing_joins_at_once_and_closing_leaves() -> None:
    stream = RecoveryStream()
    subscription = stream.subscribe()
    stream(Recovery("timeout", "s1", {"call": "t1"}))  # before the first read: not lost
    assert (await asyncio.wait_for(anext(subscription), 1)).figures == {"call": "t1"}
    async with stream.subscribe() as second:
        stream(Recovery("resume", "s1"))
        assert (await asyncio.wait_for(anext(second), 1)).kind == "resume"
        assert (await asyncio.wait_for(anext(subscription), 1)).kind == "resume"
    with pytest.raises(StopAsyncIteration):
        await anext(second)
    await subscription.aclose()
    stream(Recovery("handoff", "s1"))  # no subscriber left: nothing blocks, nothing leaks
    assert len(stream._subscribers) == 0


async def test_a_bounded_subscriber_never_blocks_the_call() -> None:
    stream = RecoveryStream(maxsize=2)
    sub = stream.subscribe()
    for i in range(5):
        stream(Recovery("timeout", "s", {"i": i}))
    assert [(await anext(sub)).figures["i"] for _ in range(2)] == [0, 1]


def test_a_failing_sink_never_breaks_the_call(caplog: pytest.LogCaptureFixture) -> None:
    got: list[Recovery] = []

    def broken(_: Recovery) -> None:
        raise RuntimeError("sink down")

    bus = RecoveryBus(sinks=[broken, got.append])
    bus.report(Recovery("handoff", "s", {"from": "a", "to": "b"}))
    assert [r.kind for r in got] == ["handoff"]
    assert "sink failed" in caplog.text


# -- OpenTelemetry -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def otel() -> Iterator[tuple[Any, Any]]:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader: Any = None
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    yield exporter, reader
    exporter.clear()


async def test_opentelemetry_records_a_span_per_recovery(
    otel: tuple[Any, Any], store: EventStore, session_id: str
) -> None:
    exporter, reader = otel
    exporter.clear()
    bus = RecoveryBus(sinks=[])  # the otel sink joins by itself when the SDK is installed
    async with live_call(store, session_id, tools={"slow": ToolSpec(0.05)}) as live:
        live.call.bus = bus
        reply(live.call, "r1", None, ("t1", "slow", {}))
        await live.call.run_tool("t1", "slow", {}, Body(gated=True))
        await live.call.drop()
        await live.recorder.flush()
        await resume(store, session_id, "backup", bus=bus)

    spans = [s for s in exporter.get_finished_spans() if s.attributes.get("calltape.session") == session_id]
    assert [s.name for s in spans] == ["calltape.recovery.timeout", "calltape.recovery.resume"]
    timeout, resumed = (dict(s.attributes) for s in spans)
    assert timeout["calltape.kind"] == "timeout" and timeout["calltape.timeout_s"] == 0.05
    assert timeout["calltape.call"] == "t1"
    assert resumed["calltape.epoch"] == 2 and resumed["calltape.agent"] == "backup"
    assert resumed["calltape.duration_ms"] >= 0

    if reader is not None:
        data = reader.get_metrics_data()
        points = {
            dict(p.attributes)["kind"]: p.value
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "calltape.recoveries"
            for p in m.data.data_points
        }
        assert points.get("timeout", 0) >= 1 and points.get("resume", 0) >= 1


async def test_zombie_durable_write_is_reported_once(store: EventStore, session_id: str) -> None:
    async with live_call(store, session_id) as live:
        live.call.emit("user.text", {"text": "hi"})
        await live.call.drop()
        await resume(store, session_id, "backup", bus=RecoveryBus(sinks=[]))
        with pytest.raises(FencedWrite):
            await live.call.emit_durable("user.text", {"text": "still here"})
        assert [r.kind for r in live.recoveries] == ["fenced_write"]
        assert live.rejected and isinstance(live.rejected[-1][1], FencedWrite)
