"""A recorded call's ledger as OpenTelemetry spans (the SDK's in-memory exporter): live from the
recorder's commits, and re-emitted from the log, for a call with a barge-in, a tool call and a drop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from calltape.events import Event, now_ms
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.redaction import Redactor
from calltape.runtime import resume
from calltape.runtime.traces import trace_events, trace_recorder

CARD = "4242 4242 4242 4242"


@pytest.fixture
def exported() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


FIRST_LEG: list[tuple[int, str, dict[str, Any]]] = [
    (0, "session.started", {"agent": "booker", "framework": "pipecat"}),
    (1000, "user.speech.started", {}),
    (2000, "user.transcript", {"text": f"a table for two, my card is {CARD}", "final": True}),
    (2100, "user.speech.stopped", {}),
    (2300, "agent.reply.started", {"reply": "r1"}),
    (2500, "agent.text", {"reply": "r1", "text": "Sure, booking it now."}),
    (2550, "tool.call", {"reply": "r1", "call": "c1", "name": "book_table", "arguments": {"card": CARD}}),
    (2600, "tool.started", {"call": "c1"}),
    (2650, "agent.reply.done", {"reply": "r1"}),
    (2700, "agent.speech.started", {"reply": "r1"}),
    (3200, "user.speech.started", {}),  # the barge-in
    (3300, "interruption", {"reply": "r1", "cause": "user_speech", "heard": "Sure,"}),
    (3400, "agent.speech.ended", {"reply": "r1", "interrupted": True, "heard": "Sure,"}),
    (3900, "tool.result", {"call": "c1", "output": {"booked": True}}),
    (4000, "user.speech.stopped", {}),
    (4200, "agent.reply.started", {"reply": "r2"}),
    (4400, "agent.text", {"reply": "r2", "text": "Anything else?"}),
    (4450, "tool.call", {"reply": "r2", "call": "c2", "name": "lookup", "arguments": {}}),
    (4500, "tool.started", {"call": "c2"}),
    (4600, "agent.reply.done", {"reply": "r2"}),
    (4700, "agent.speech.started", {"reply": "r2"}),
    (5000, "session.dropped", {"reason": "transport_lost"}),
]
SECOND_LEG: list[tuple[int, str, dict[str, Any]]] = [
    (9000, "agent.reply.started", {"reply": "r3"}),
    (9100, "agent.text", {"reply": "r3", "text": "Sorry, we were cut off."}),
    (9150, "agent.reply.done", {"reply": "r3"}),
    (9200, "agent.speech.started", {"reply": "r3"}),
    (9900, "agent.speech.ended", {"reply": "r3", "interrupted": False}),
    (10_000, "session.ended", {"reason": "hangup"}),
]


async def record(store: EventStore, session: str, recorder: Recorder) -> int:
    """The call as a live process records it; the resume comes from another writer (the CLI), at the
    current time, between the legs. Returns the call's start time."""
    t0 = now_ms() - 6000
    tape = recorder.session(session, agent="booker")
    for offset, kind, data in FIRST_LEG:
        tape.emit(kind, data, at_ms=t0 + offset)
    await recorder.flush()
    plan = await resume(store, session, "backup")
    again = recorder.session(session, agent="backup", epoch=plan.epoch)
    for offset, kind, data in SECOND_LEG:
        again.emit(kind, data, at_ms=t0 + offset)
    await recorder.flush()
    return t0


def tree(spans: list[ReadableSpan]) -> list[tuple[int, str]]:
    """The span tree as (depth, name), children in start order."""
    by_parent: dict[int | None, list[ReadableSpan]] = {}
    ids = {s.context.span_id for s in spans}
    for span in spans:
        parent = span.parent.span_id if span.parent is not None and span.parent.span_id in ids else None
        by_parent.setdefault(parent, []).append(span)
    out: list[tuple[int, str]] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in sorted(by_parent.get(parent, []), key=lambda s: (s.start_time, s.name)):
            out.append((depth, span.name))
            walk(span.context.span_id, depth + 1)

    walk(None, 0)
    return out


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start_time)


EXPECTED_TREE = [
    (0, "invoke_agent booker"),
    (1, "turn"),
    (2, "chat"),
    (3, "execute_tool book_table"),
    (3, "agent.speech"),
    (1, "turn"),
    (2, "chat"),
    (3, "execute_tool lookup"),
    (3, "agent.speech"),
    (1, "session.dropped"),
    (1, "turn"),
    (2, "chat"),
    (3, "agent.speech"),
]


def assert_the_ledger(spans: list[ReadableSpan], session: str, t0: int) -> None:
    assert tree(spans) == EXPECTED_TREE
    assert len({s.context.trace_id for s in spans}) == 1  # one trace per call
    assert all(s.attributes["session.id"] == session for s in spans)
    (root,) = named(spans, "invoke_agent booker")
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.conversation.id"] == session
    assert root.attributes["calltape.end_reason"] == "hangup"
    assert (root.start_time, root.end_time) == (t0 * 10**6, (t0 + 10_000) * 10**6)
    first, second, third = named(spans, "turn")
    assert first.attributes["calltape.turn.initiator"] == "user" and "calltape.turn.barge_in" not in first.attributes
    assert second.attributes["calltape.turn.barge_in"] is True  # the user spoke over r1 to open it
    assert third.attributes["calltape.turn.initiator"] == "agent"
    r1, _, r3 = named(spans, "chat")
    # the barge-in: interrupted, by the user, having heard 5 of 21 characters, at its time
    assert r1.attributes["gen_ai.operation.name"] == "chat"
    assert r1.attributes["calltape.reply.interrupted"] is True
    assert r1.attributes["calltape.interruption.cause"] == "user_speech"
    assert r1.attributes["calltape.reply.heard_chars"] == 5
    assert r1.attributes["calltape.reply.text_chars"] == len("Sure, booking it now.")
    (cut,) = r1.events
    assert cut.name == "interruption" and cut.timestamp == (t0 + 3300) * 10**6
    # r1 lasts until its tool answered (3.9 s), past the playout the barge-in cut at 3.4 s
    assert r1.end_time == (t0 + 3900) * 10**6
    speech1 = named(spans, "agent.speech")[0]
    assert speech1.attributes["calltape.speech.interrupted"] is True and speech1.end_time == (t0 + 3400) * 10**6
    (book,) = named(spans, "execute_tool book_table")
    assert book.attributes["gen_ai.tool.name"] == "book_table" and book.attributes["gen_ai.tool.call.id"] == "c1"
    assert book.attributes["calltape.tool.outcome"] == "completed"
    assert [e.name for e in book.events] == ["tool.started"]
    (drop,) = named(spans, "session.dropped")
    assert drop.status.status_code == StatusCode.ERROR
    assert drop.attributes["calltape.drop.reason"] == "transport_lost"
    assert drop.start_time == (t0 + 5000) * 10**6
    assert r3.attributes["calltape.reply.interrupted"] is False
    assert r3.attributes["calltape.reply.heard_chars"] == len("Sorry, we were cut off.")
    # nothing said, no tool argument or output, by default
    for span in spans:
        text = repr(dict(span.attributes or {})) + repr([dict(e.attributes or {}) for e in span.events])
        for said in ("4242", "table for two", "Sure", "booked", "Anything"):
            assert said not in text, (span.name, said)


async def test_live_spans_of_a_call_with_a_barge_in_and_a_drop(
    store: EventStore, session_id: str, exported: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = exported
    recorder = await Recorder(store).start()
    tracer = trace_recorder(recorder, provider)
    try:
        t0 = await record(store, session_id, recorder)
    finally:
        await recorder.close()
    spans = list(exporter.get_finished_spans())
    assert_the_ledger(spans, session_id, t0)
    # live, the process did not see the resume (another writer's): the drop ends when the call is heard
    # from again, and lookup, which the resume settled in the log, is ended with the call, unfinished
    (drop,) = named(spans, "session.dropped")
    assert drop.end_time == (t0 + 9000) * 10**6
    (lookup,) = named(spans, "execute_tool lookup")
    assert lookup.attributes["calltape.unfinished"] is True
    assert tracer.spans == len(spans)


async def test_the_same_ledger_re_emitted_from_the_log(
    store: EventStore, session_id: str, exported: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = exported
    async with Recorder(store) as recorder:
        t0 = await record(store, session_id, recorder)
    count = trace_events(await store.read(session_id), provider)
    spans = list(exporter.get_finished_spans())
    assert count == len(spans)
    assert_the_ledger(spans, session_id, t0)
    # from the log the resume is there: the drop lasts until the resume's first write (it settles what
    # the drop left open, then writes session.resumed), and lookup was cancelled by it, outcome unknown
    (drop,) = named(spans, "session.dropped")
    (resumed,) = [e for e in named(spans, "invoke_agent booker")[0].events if e.name == "session.resumed"]
    assert resumed.attributes["gen_ai.agent.name"] == "backup" and resumed.attributes["calltape.epoch"] == 2
    assert (t0 + 5000) * 10**6 < drop.end_time <= resumed.timestamp < (t0 + 9000) * 10**6
    (lookup,) = named(spans, "execute_tool lookup")
    assert lookup.attributes["calltape.tool.outcome"] == "unknown"
    assert "calltape.unfinished" not in lookup.attributes


async def test_content_only_when_asked_and_redacted(
    store: EventStore, session_id: str, exported: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = exported
    async with Recorder(store) as recorder:
        await record(store, session_id, recorder)
    trace_events(await store.read(session_id), provider, content=True, redactor=Redactor(kinds=("card",)))
    spans = list(exporter.get_finished_spans())
    r1 = named(spans, "chat")[0]
    assert r1.attributes["calltape.reply.heard"] == "Sure,"
    assert r1.attributes["calltape.reply.text"] == "Sure, booking it now."
    turn = named(spans, "turn")[0]
    assert turn.attributes["calltape.turn.user_text"] == "a table for two, my card is [card]"
    (book,) = named(spans, "execute_tool book_table")
    assert book.attributes["gen_ai.tool.call.arguments"] == '{"card":"[card]"}'
    assert book.attributes["gen_ai.tool.call.result"] == '{"booked":true}'
    everything = repr([dict(s.attributes or {}) for s in spans])
    assert "4242" not in everything


async def test_a_call_that_never_ended_is_closed_at_its_last_event(
    store: EventStore, session_id: str, exported: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = exported
    t0 = now_ms()
    async with Recorder(store) as recorder:
        tape = recorder.session(session_id, agent="booker")
        for offset, kind, data in FIRST_LEG:
            tape.emit(kind, data, at_ms=t0 + offset)
    trace_events(await store.read(session_id), provider)
    spans = list(exporter.get_finished_spans())
    (root,) = named(spans, "invoke_agent booker")
    assert root.attributes["calltape.unfinished"] is True and root.end_time == (t0 + 5000) * 10**6
    assert all(s.end_time <= root.end_time for s in spans)


async def test_a_resume_in_the_recording_process_reaches_its_live_spans(
    tmp_path: Any, exported: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    import calltape

    provider, exporter = exported
    async with calltape.connect(f"sqlite:///{tmp_path}/calls.db") as ct:
        trace_recorder(ct.recorder, provider)
        t0 = now_ms() - 6000
        tape = ct.recorder.session("call-r", agent="booker")
        for offset, kind, data in FIRST_LEG:
            tape.emit(kind, data, at_ms=t0 + offset)
        plan, _ = await ct.resume_call("call-r", agent="backup")
        again = ct.recorder.session("call-r", agent="backup", epoch=plan.epoch)
        for offset, kind, data in SECOND_LEG:
            again.emit(kind, data, at_ms=t0 + offset)
    spans = list(exporter.get_finished_spans())
    assert tree(spans) == EXPECTED_TREE
    (lookup,) = named(spans, "execute_tool lookup")
    assert lookup.attributes["calltape.tool.outcome"] == "unknown"  # the resume's settlement, seen live
    (resumed,) = [e for e in named(spans, "invoke_agent booker")[0].events if e.name == "session.resumed"]
    assert named(spans, "session.dropped")[0].end_time <= resumed.timestamp


def test_spans_follow_the_calls_read_model(exported: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    """The spans say what the fold says (the read model ``calltape check`` reads): an interruption of a
    reply already played out, its tool settled, cuts nothing; a call without a reply joins the latest
    one; tokens after a cut are late (not the reply's text), and what was heard is what played before."""
    provider, exporter = exported
    rows: list[tuple[str, dict[str, Any]]] = [
        ("session.started", {"agent": "booker"}),
        ("agent.reply.started", {"reply": "r1"}),
        ("agent.text", {"reply": "r1", "text": "Booked."}),
        ("agent.reply.done", {"reply": "r1"}),
        ("tool.call", {"call": "c1", "name": "lookup", "arguments": {}}),  # no reply: the latest (r1)
        ("tool.result", {"call": "c1", "output": {}}),
        ("agent.speech.started", {"reply": "r1"}),
        ("agent.speech.ended", {"reply": "r1", "interrupted": False}),
        ("interruption", {"reply": "r1", "cause": "user_speech"}),  # r1 is over: nothing to cut
        ("agent.reply.started", {"reply": "r2"}),
        ("agent.text", {"reply": "r2", "text": "abc"}),
        ("agent.speech.started", {"reply": "r2"}),
        ("interruption", {"reply": "r2", "cause": "user_speech"}),
        ("agent.text", {"reply": "r2", "text": "def"}),  # a late token
        ("agent.speech.ended", {"reply": "r2", "interrupted": True}),
        ("agent.reply.done", {"reply": "r2"}),
        ("session.ended", {"reason": "hangup"}),
    ]
    events = [
        Event(kind, data, "call-m", id=f"e{n}", at_ms=1000 + 100 * n, seq=n + 1) for n, (kind, data) in enumerate(rows)
    ]
    trace_events(events, provider)
    spans = list(exporter.get_finished_spans())
    assert tree(spans) == [
        (0, "invoke_agent booker"),
        (1, "turn"),
        (2, "chat"),
        (3, "execute_tool lookup"),
        (3, "agent.speech"),
        (2, "chat"),
        (3, "agent.speech"),
    ]
    r1, r2 = named(spans, "chat")
    assert r1.attributes["calltape.reply.interrupted"] is False and not r1.events
    assert r2.attributes["calltape.reply.interrupted"] is True
    assert [e.name for e in r2.events] == ["interruption"]
    assert r2.attributes["calltape.reply.text_chars"] == 3 and r2.attributes["calltape.reply.heard_chars"] == 3
    assert named(spans, "agent.speech")[1].attributes["calltape.speech.interrupted"] is True
    assert not any("calltape.unfinished" in s.attributes for s in spans)


def test_a_reply_the_playout_never_took_is_over_at_the_next_but_can_still_be_cut(
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """A voice reply generated but never played ends its span when the next generation begins (the
    tracer's own call: the fold still waits for its playout); an interruption aimed at it afterwards
    still cuts it in the fold, and its span says so."""
    provider, exporter = exported
    rows: list[tuple[str, dict[str, Any]]] = [
        ("session.started", {"agent": "booker"}),
        ("agent.reply.started", {"reply": "r1"}),
        ("agent.text", {"reply": "r1", "text": "One moment."}),
        ("tool.call", {"reply": "r1", "call": "c1", "name": "lookup", "arguments": {}}),
        ("agent.reply.done", {"reply": "r1"}),
        ("agent.reply.started", {"reply": "r2"}),
        ("interruption", {"reply": "r1", "cause": "user_speech"}),
        ("tool.result", {"call": "c1", "output": {}}),
        ("agent.reply.done", {"reply": "r2"}),
        ("session.ended", {"reason": "hangup"}),
    ]
    events = [Event(k, d, "call-p", id=f"p{n}", at_ms=1000 + 100 * n, seq=n + 1) for n, (k, d) in enumerate(rows)]
    trace_events(events, provider)
    r1, r2 = named(exporter.get_finished_spans(), "chat")
    assert r1.attributes["calltape.reply.interrupted"] is True and [e.name for e in r1.events] == ["interruption"]
    assert r1.end_time == 1700 * 10**6  # its tool answered at 1.7 s
    assert r2.attributes["calltape.reply.interrupted"] is False
