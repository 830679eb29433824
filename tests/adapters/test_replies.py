"""The reply tracker every adapter writes through: facts written once, state read from the live fold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calltape.adapters.replies import EventCollector, ReplyTracker
from calltape.events import Event, make_event
from calltape.eventstore import EventStore
from calltape.eventstore.recorder import Recorder
from calltape.projections import build_context, fold_events
from calltape.runtime import CallSession


class Sink:
    """A bare event sink (no fold): the tracker folds what it returns."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, type: str, data: Mapping[str, Any]) -> Event:
        event = make_event("s", type, data)
        self.events.append(event)
        return event

    def types(self) -> list[str]:
        return [e.type for e in self.events]


def test_each_fact_is_written_once_and_read_back_from_the_fold() -> None:
    sink = Sink()
    replies = ReplyTracker(sink)
    rid = replies.begin("r1")
    assert replies.begin("r1") == "r1"  # known: nothing written
    assert replies.current == "r1"
    assert replies.text(rid, "Let me ") and replies.text(rid, "check.")
    assert not replies.text(rid, "")
    assert replies.speech_started(rid) and not replies.speech_started(rid)
    assert replies.heard(rid, "Let me") and not replies.heard(rid, "Let me")
    assert replies.done(rid) and not replies.done(rid)
    state = replies.state(rid)
    assert state is not None
    assert (state.generated, state.reported_heard, state.done, state.speech_started) == (
        "Let me check.",
        "Let me",
        True,
        True,
    )
    assert replies.active(rid)  # generated text still playing
    assert replies.interrupt(cause="user_speech", heard="Let me")  # the latest reply by default
    assert not replies.interrupt(rid)  # the fold has it interrupted: once
    assert not replies.text(rid, " late token")  # late tokens of a cut reply are not written
    assert not replies.speech_started(rid)
    assert replies.speech_ended(rid, interrupted=True) and not replies.speech_ended(rid)
    assert replies.finished(rid) and not replies.active(rid)
    assert sink.types() == [
        "agent.reply.started",
        "agent.text",
        "agent.text",
        "agent.speech.started",
        "agent.speech.progress",
        "agent.reply.done",
        "interruption",
        "agent.speech.ended",
    ]
    # the tracker's fold is the fold of what it wrote: the log rebuilds the same state
    assert fold_events(sink.events).reply_state(rid) == replies.state(rid)


def test_new_ids_unknown_replies_and_the_user_turn() -> None:
    replies = ReplyTracker(Sink())
    assert replies.current is None and replies.count() == 0
    assert not replies.done("nope") and not replies.speech_ended("nope") and not replies.interrupt()
    assert not replies.user_spoke_since(None)
    first = replies.begin()
    second = replies.begin()
    assert first != second and replies.count() == 2 and replies.current == second
    assert not replies.user_spoke_since(second)
    replies.emit("user.speech.started", {"source": "vad"})
    replies.emit("user.transcript", {"text": "Hmm", "final": False})
    assert not replies.user_spoke_since(second)  # VAD edges and interims are not a turn
    replies.emit("user.transcript", {"text": "Book it.", "final": True})
    assert replies.user_spoke_since(second) and replies.user_spoke_since(None)
    assert replies.user_spoke_since("never-began")
    third = replies.begin()
    assert not replies.user_spoke_since(third)


def test_a_text_only_reply_is_finished_once_done() -> None:
    replies = ReplyTracker(Sink())
    rid = replies.begin()
    assert not replies.finished(rid) and replies.active(rid)
    replies.done(rid)
    assert replies.finished(rid) and not replies.active(rid)


def test_hold_buffers_writes_while_queries_see_them() -> None:
    sink = Sink()
    replies = ReplyTracker(sink)
    replies.hold()
    assert replies.holding
    rid = replies.begin("resp_1")
    replies.text(rid, "Sure.")
    assert sink.events == []
    state = replies.state(rid)
    assert state is not None and state.generated == "Sure." and replies.current == rid
    assert replies.begin("resp_1") == rid  # the held start counts: not written twice
    replies.emit("user.transcript", {"text": "Hello?", "final": True}, jump=True)
    assert sink.types() == ["user.transcript"]
    # the scratch view is rebuilt past the jumped event, and still holds the reply
    assert replies.text(rid, " Done.")
    state = replies.state(rid)
    assert state is not None and state.generated == "Sure. Done."
    replies.release()
    assert not replies.holding
    assert sink.types() == ["user.transcript", "agent.reply.started", "agent.text", "agent.text"]
    assert replies.fold.user_turn_seq == 1
    assert replies.state(rid) == fold_events(sink.events).reply_state(rid)


def test_collector_ids_are_stable_per_batch() -> None:
    out = EventCollector("call-9", prefix="p:a:")
    replies = ReplyTracker(out)
    replies.begin("r")
    replies.text("r", "hi")
    assert [e.id for e in out.events] == ["p:a:1", "p:a:2"]
    out.reset("p:b:", at_ms=5_000)
    replies.done("r")
    assert [(e.id, e.at_ms) for e in out.events] == [("p:b:1", 5_000)]
    assert replies.fold is out.fold


async def test_over_a_live_call_the_tracker_reads_its_fold(store: EventStore) -> None:
    recorder = await Recorder(store).start()
    try:
        call = await CallSession.start(recorder, "tracked-1", agent="a", instructions="Be brief.")
        replies = ReplyTracker(call)
        assert replies.fold is call.fold
        rid = replies.begin()
        replies.text(rid, "Your table is booked.")
        replies.done(rid)
        replies.speech_started(rid)
        assert replies.active(rid)
        call.interrupt(rid, heard="Your table")  # written elsewhere (the runtime): the tracker sees it
        assert not replies.interrupt(rid)
        state = replies.state(rid)
        assert state is not None and state.interrupted and state.heard == "Your table"
        await recorder.flush()
        stored = await build_context(store, "tracked-1")
        assert stored.reply_state(rid) == state
        # a tracker over the fold of the stored log answers like the live one (an adapter after a restart)
        assert ReplyTracker(Sink(), fold=stored).finished(rid)
    finally:
        await recorder.close()
