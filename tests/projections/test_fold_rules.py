"""SPEC section 2, rule by rule, as small timelines."""

from __future__ import annotations

import pytest
from projection_timeline import Tape

from calltape.events import Event
from calltape.projections import (
    FOLD_VERSION,
    ContextFold,
    SnapshotMismatch,
    fold_events,
    to_anthropic,
    to_openai,
    to_realtime,
)

# --- native shape --------------------------------------------------------------------------------


def test_native_shape() -> None:
    tape = Tape()
    tape.said("hi")
    native = tape.native()
    assert list(native) == ["session", "seq", "agent", "epoch", "clean", "last_clean_seq", "items", "pending"]
    assert native["session"] == "s1" and native["seq"] == 2 and native["agent"] == "alice"
    assert native["epoch"] == 1 and native["clean"] is True and native["last_clean_seq"] == 2
    assert native["items"][0] == {"type": "message", "role": "system", "content": "Be brief."}
    assert native["pending"] == {"user_text": None, "tools": []}


def test_empty_fold() -> None:
    native = ContextFold("s").native()
    assert native["seq"] == 0 and native["last_clean_seq"] == 0
    assert native["items"] == [{"type": "message", "role": "system", "content": ""}]


# --- rule 1: system --------------------------------------------------------------------------------


def system(tape: Tape) -> str:
    content: str = tape.native()["items"][0]["content"]
    return content


def test_rule1_system_follows_instructions_and_handoffs() -> None:
    tape = Tape(instructions="A")
    assert system(tape) == "A"
    tape.add("agent.instructions", text="B")
    assert system(tape) == "B"
    tape.add("agent.handoff", **{"from": "alice", "to": "bob", "instructions": "C"})
    assert system(tape) == "C" and tape.native()["agent"] == "bob"
    tape.add("agent.handoff", **{"from": "bob", "to": "carol"})
    assert system(tape) == "C" and tape.native()["agent"] == "carol"
    assert system(Tape(instructions="A")) == "A"


def test_rule1_resumed_sets_agent_and_epoch_keeps_instructions() -> None:
    tape = Tape(instructions="A")
    tape.add("session.dropped", reason="ws closed")
    tape.add("session.resumed", agent="bob", epoch=2, from_seq=1)
    native = tape.native()
    assert (native["agent"], native["epoch"], system(tape)) == ("bob", 2, "A")


def test_rule1_no_instructions_gives_empty_system_omitted_by_providers() -> None:
    tape = Tape(instructions=None)
    tape.said("hello")
    native = tape.native()
    assert native["items"][0]["content"] == ""
    assert to_openai(native) == [{"role": "user", "content": "hello"}]
    assert "system" not in to_anthropic(native)


# --- rule 2: user turns ----------------------------------------------------------------------------


def test_rule2_finals_and_text_accumulate_with_single_spaces() -> None:
    tape = Tape()
    tape.add("user.speech.started")
    tape.said("  I want ")
    tape.said("")
    tape.typed("a pizza  ")
    tape.add("user.speech.stopped")
    assert tape.items() == [("user", "I want a pizza")]


def test_rule2_new_user_message_after_reply_started() -> None:
    tape = Tape()
    tape.said("one")
    tape.reply("r1", "ok", spoken=True)
    tape.said("two")
    tape.said("three")
    assert tape.items() == [("user", "one"), ("assistant", "ok"), ("user", "two three")]


def test_rule2_content_after_an_older_reply_joins_the_current_message() -> None:
    tape = Tape()
    tape.reply("r1", "hello", spoken=True)
    tape.said("one")
    tape.said("two")  # r1 started before "one": same user message
    assert tape.items() == [("assistant", "hello"), ("user", "one two")]


def test_rule2_reply_begun_without_started_also_splits_user_turns() -> None:
    tape = Tape(modality="text")
    tape.said("one")
    tape.add("agent.text", reply="r1", text="ok")
    tape.add("agent.reply.done", reply="r1")
    tape.said("two")
    assert tape.items() == [("user", "one"), ("assistant", "ok"), ("user", "two")]


def test_rule2_interims_are_pending_only() -> None:
    tape = Tape()
    tape.add("user.speech.started")
    tape.interim("I wa")
    tape.interim("I want")
    native = tape.native()
    assert tape.items() == [] and native["pending"]["user_text"] == "I want"
    tape.said("I want tea")
    native = tape.native()
    assert tape.items() == [("user", "I want tea")] and native["pending"]["user_text"] is None
    tape.interim("and")
    tape.typed("typed")  # typed input does not settle the speech interim
    assert tape.native()["pending"]["user_text"] == "and"
    assert tape.items() == [("user", "I want tea typed")]


def test_rule2_blank_interim_clears_pending() -> None:
    tape = Tape()
    tape.interim("hm")
    tape.interim("  ")
    assert tape.native()["pending"]["user_text"] is None


# --- rule 3: heard text -------------------------------------------------------------------------


def test_rule3_full_generated_text() -> None:
    tape = Tape()
    tape.reply("r1", "Hello", ", how can I help?", spoken=True)
    assert tape.items() == [("assistant", "Hello, how can I help?")]


def test_rule3_latest_heard_wins() -> None:
    tape = Tape()
    tape.reply("r1", "Hello there friend", spoken=False)
    tape.add("agent.speech.started", reply="r1")
    tape.add("agent.speech.progress", reply="r1", heard="Hello")
    assert tape.items() == [("assistant", "Hello")]
    tape.add("agent.speech.progress", reply="r1", heard="Hello there")
    assert tape.items() == [("assistant", "Hello there")]
    tape.add("agent.speech.ended", reply="r1", interrupted=False, heard="Hello there friend")
    assert tape.items() == [("assistant", "Hello there friend")]


def test_rule3_interrupted_before_speech_is_empty_and_omitted() -> None:
    tape = Tape()
    tape.said("hi")
    tape.reply("r1", "Hello there", done=False)
    tape.add("interruption", cause="user_speech")
    assert tape.items() == [("user", "hi")]


def test_rule3_interrupted_after_speech_keeps_text_generated_before() -> None:
    tape = Tape()
    tape.reply("r1", "Hello ", done=False)
    tape.add("agent.speech.started", reply="r1")
    tape.add("agent.text", reply="r1", text="there")
    tape.add("interruption", reply="r1")
    tape.add("agent.text", reply="r1", text=" late tokens")
    tape.add("agent.reply.done", reply="r1")
    assert tape.items() == [("assistant", "Hello there", "interrupted")]


def test_rule3_interruption_heard_and_later_heard() -> None:
    tape = Tape()
    tape.reply("r1", "Your order is ready for pickup")
    tape.add("agent.speech.started", reply="r1")
    tape.add("interruption", reply="r1", heard="Your order")
    assert tape.items() == [("assistant", "Your order", "interrupted")]
    tape.add("agent.speech.ended", reply="r1", interrupted=True, heard="Your order is")
    assert tape.items() == [("assistant", "Your order is", "interrupted")]


def test_rule3_speech_ended_interrupted_marks_the_reply_interrupted() -> None:
    tape = Tape()
    tape.reply("r1", "one two three")
    tape.add("agent.speech.started", reply="r1")
    tape.add("agent.speech.ended", reply="r1", interrupted=True, heard="one")
    f = tape.fold()
    assert tape.items() == [("assistant", "one", "interrupted")]
    assert f.clean


def test_interruption_of_a_complete_reply_does_not_mark_it() -> None:
    tape = Tape(modality="text")
    tape.reply("r1", "Done: booked.")
    tape.add("interruption", cause="api")
    f = tape.fold()
    assert tape.items() == [("assistant", "Done: booked.")]
    assert f.counters["interruptions"] == 1 and f.counters["interruptions_ignored"] == 1


def test_a_late_heard_still_applies_to_a_complete_reply() -> None:
    # Rule 3: the latest heard wins, e.g. an OpenAI Realtime truncate after response.done.
    voice = Tape()
    voice.reply("r1", "Done. Anything else?", spoken=True)
    voice.add("interruption", reply="r1", heard="Done.")
    assert voice.items() == [("assistant", "Done.")]


def test_an_interrupted_text_reply_keeps_what_streamed() -> None:
    tape = Tape(modality="text")
    tape.add("agent.reply.started", reply="r1")
    tape.add("agent.text", reply="r1", text="Let me check")
    tape.add("interruption", reply="r1", cause="api")
    tape.add("agent.text", reply="r1", text=" late token")
    assert tape.items() == [("assistant", "Let me check", "interrupted")]


def test_a_barge_in_while_a_tool_runs_interrupts_the_turn() -> None:
    tape = Tape()
    tape.reply("r1", "Booking.", spoken=True)
    tape.add("tool.call", reply="r1", call="c1", name="book", arguments={})
    tape.add("tool.started", call="c1")
    tape.add("interruption", cause="user_speech")
    f = tape.fold()
    assert f.reply_state("r1") is not None and f.reply_state("r1").interrupted  # type: ignore[union-attr]
    tape.add("tool.result", call="c1", output={"ok": True})
    assert tape.fold().tool_call("c1").status == "completed"  # type: ignore[union-attr]


def test_a_late_call_with_a_result_is_included() -> None:
    tape = Tape()
    tape.reply("r1", "Sure.", spoken=False, done=False)
    tape.add("interruption", reply="r1")
    tape.add("tool.call", reply="r1", call="c1", name="book", arguments={})
    assert tape.fold().tool_call("c1").included is False  # type: ignore[union-attr]
    tape.add("tool.result", call="c1", output="ok")
    assert tape.fold().tool_call("c1").included is True  # type: ignore[union-attr]


def test_interruption_targets_the_latest_reply_by_default() -> None:
    tape = Tape()
    tape.reply("r1", "first", spoken=True)
    tape.reply("r2", "second")
    tape.add("agent.speech.started", reply="r2")
    tape.add("interruption")
    assert tape.items() == [("assistant", "first"), ("assistant", "second", "interrupted")]


def test_interruption_of_a_reply_waiting_for_playout_applies() -> None:
    tape = Tape()
    tape.reply("r1", "generated but not played")  # done, speech not ended
    tape.add("interruption")
    assert tape.items() == []


# --- rule 4: tool calls -------------------------------------------------------------------------


def test_rule4_calls_live_in_their_reply_in_call_order() -> None:
    tape = Tape()
    tape.add("agent.reply.started", reply="r1")
    tape.add("agent.text", reply="r1", text="Checking.")
    tape.call("c2", reply="r1")
    tape.call("c1")  # no reply: joins the latest
    tape.add("agent.reply.done", reply="r1")
    tape.result("c1", "one")
    tape.result("c2", {"two": 2})
    assert tape.items() == [
        ("assistant", "Checking."),
        ("call", "c2"),
        ("call", "c1"),
        ("out", "c2", "completed", {"two": 2}),
        ("out", "c1", "completed", "one"),
    ]
    native = tape.native()
    assert native["items"][2] == {"type": "function_call", "call_id": "c2", "name": "lookup", "arguments": "{}"}


def test_rule4_call_with_no_reply_at_all_begins_a_message() -> None:
    tape = Tape()
    tape.said("weather?")
    tape.call("c1", arguments='{"city": "Oslo"}')
    tape.result("c1", "rain")
    assert tape.items() == [("user", "weather?"), ("call", "c1"), ("out", "c1", "completed", "rain")]
    assert tape.fold().clean


def test_rule4_call_after_interruption_excluded_unless_started() -> None:
    tape = Tape()
    tape.add("agent.reply.started", reply="r1")
    tape.add("interruption", reply="r1")
    tape.call("c1", reply="r1")
    assert tape.items() == []
    assert tape.fold().clean
    tape.add("tool.started", call="c1")
    assert tape.items() == [("call", "c1"), ("out", "c1", "in_progress", {"status": "in_progress"})]
    tape.result("c1", "ok")
    assert tape.items() == [("call", "c1"), ("out", "c1", "completed", "ok")]


def test_rule4_repeated_call_id_and_unknown_call_ids_are_ignored() -> None:
    tape = Tape()
    tape.add("agent.reply.started", reply="r1")
    tape.call("c1", name="first", reply="r1")
    tape.call("c1", name="second", reply="r1")
    tape.result("zzz", "nobody")
    tape.add("tool.started", call="zzz")
    tape.add("tool.cancelled", call="zzz", reason="timeout")
    tape.add("agent.reply.done", reply="r1")
    tape.result("c1", 1)
    native = tape.native()
    assert [i["name"] for i in native["items"] if i["type"] == "function_call"] == ["first"]
    assert tape.items() == [("call", "c1"), ("out", "c1", "completed", 1)]


def test_rule4_string_and_blank_arguments() -> None:
    tape = Tape()
    tape.call("c1", arguments='{"a": 1}')
    tape.call("c2", arguments="  ")
    args = [i["arguments"] for i in tape.native()["items"] if i["type"] == "function_call"]
    assert args == ['{"a": 1}', "{}"]


# --- rule 5: outputs ----------------------------------------------------------------------------


def test_rule5_result_after_barge_in_and_new_user_turn_stays_with_its_message() -> None:
    tape = Tape()
    tape.said("book it")
    tape.add("agent.reply.started", reply="r1")
    tape.add("agent.text", reply="r1", text="Booking now")
    tape.call("c1", name="book", reply="r1")
    tape.add("tool.started", call="c1")
    tape.add("agent.reply.done", reply="r1")
    tape.add("agent.speech.started", reply="r1")
    tape.add("interruption", reply="r1", heard="Booking")
    tape.said("actually wait")
    tape.reply("r2", "Sure.", spoken=True)
    assert tape.fold().native()["pending"]["tools"] == [{"call_id": "c1", "name": "book", "status": "in_progress"}]
    tape.result("c1", {"ok": True})
    assert tape.items() == [
        ("user", "book it"),
        ("assistant", "Booking", "interrupted"),
        ("call", "c1"),
        ("out", "c1", "completed", {"ok": True}),
        ("user", "actually wait"),
        ("assistant", "Sure."),
    ]


def synthetic(reason: str | None = None, outcome: str | None = None, *, started: bool = True) -> tuple[object, ...]:
    tape = Tape()
    tape.add("agent.reply.started", reply="r1")
    tape.call("c1", reply="r1")
    tape.add("agent.reply.done", reply="r1")
    if started:
        tape.add("tool.started", call="c1")
    if reason is not None:
        data: dict[str, str] = {"call": "c1", "reason": reason}
        if outcome is not None:
            data["outcome"] = outcome
        tape.add("tool.cancelled", **data)
    return tape.items()[-1]


def test_rule5_synthetic_outputs() -> None:
    assert synthetic() == ("out", "c1", "in_progress", {"status": "in_progress"})
    assert synthetic("timeout") == ("out", "c1", "timeout", {"status": "timeout"})
    assert synthetic("dropped", "unknown") == ("out", "c1", "unknown", {"status": "unknown"})
    assert synthetic("dropped", "not_run") == ("out", "c1", "cancelled", {"status": "cancelled", "reason": "dropped"})
    assert synthetic("budget") == ("out", "c1", "cancelled", {"status": "cancelled", "reason": "budget"})


def test_rule5_unstarted_call_of_interrupted_reply_is_cancelled_interrupted() -> None:
    tape = Tape()
    tape.add("agent.reply.started", reply="r1")
    tape.add("agent.text", reply="r1", text="Let me check")
    tape.call("c1", reply="r1")
    tape.add("agent.speech.started", reply="r1")
    tape.add("interruption", reply="r1")
    assert tape.items()[-1] == ("out", "c1", "cancelled", {"status": "cancelled", "reason": "interrupted"})
    assert tape.fold().clean
    # the truth wins: it started after all
    tape.add("tool.started", call="c1")
    assert tape.items()[-1] == ("out", "c1", "in_progress", {"status": "in_progress"})


def test_rule5_result_after_cancel_wins_cancel_after_result_ignored() -> None:
    tape = Tape()
    tape.call("c1")
    tape.add("tool.cancelled", call="c1", reason="timeout")
    tape.result("c1", "late but true")
    tape.add("tool.cancelled", call="c1", reason="dropped", outcome="unknown")
    tape.result("c1", "second result")
    assert tape.items()[-1] == ("out", "c1", "completed", "late but true")


def test_rule5_error_result() -> None:
    tape = Tape()
    tape.call("c1")
    tape.result("c1", "card declined", error=True)
    assert tape.items()[-1] == ("out", "c1", "error", "card declined")


# --- rule 6: empty items ------------------------------------------------------------------------


def test_rule6_empty_assistant_messages_are_omitted() -> None:
    tape = Tape()
    tape.reply("r1", spoken=True)
    tape.reply("r2", "   ", spoken=True)
    assert tape.items() == []


def test_rule6_calls_without_text() -> None:
    tape = Tape()
    tape.add("agent.reply.started", reply="r1")
    tape.call("c1", reply="r1")
    tape.add("agent.reply.done", reply="r1")
    tape.result("c1", "x")
    assert tape.items() == [("call", "c1"), ("out", "c1", "completed", "x")]
    assert to_openai(tape.native())[1]["content"] is None


# --- rule 7: handoff ----------------------------------------------------------------------------


def test_rule7_handoff_item_native_only() -> None:
    tape = Tape()
    tape.said("billing please")
    tape.add("agent.handoff", **{"from": "alice", "to": "billing", "instructions": "You do billing."})
    tape.reply("r1", "Billing here.", spoken=True)
    native = tape.native()
    assert tape.items() == [("user", "billing please"), ("handoff", "alice", "billing"), ("assistant", "Billing here.")]
    assert native["agent"] == "billing"
    assert [m["role"] for m in to_openai(native)] == ["system", "user", "assistant"]
    assert [m["role"] for m in to_anthropic(native)["messages"]] == ["user", "assistant"]
    assert len(to_realtime(native)) == 2


# --- rule 8: duplicates and extensions ----------------------------------------------------------


def test_rule8_duplicates_and_extensions_change_nothing() -> None:
    tape = Tape()
    tape.said("hi")
    tape.reply("r1", "hello", spoken=True)
    base = tape.native()
    f = ContextFold()
    for event in tape.events:
        assert f.apply(event)
        assert not f.apply(event)
    assert f.native() == base
    ext = Tape()
    ext.add("x.debug", note="1")
    ext.said("hi")
    ext.add("x.vendor.thing")
    ext.reply("r1", "hello", spoken=True)
    ext.add("future.type", whatever=True)
    got = ext.native()
    assert got["items"] == base["items"] and got["clean"] and got["last_clean_seq"] == got["seq"]
    assert ext.fold().counters["skipped"] == 3


def test_malformed_known_type_is_skipped() -> None:
    tape = Tape()
    tape.events.append(Event(type="tool.call", data={"name": "x"}, session="s1", id="bad", seq=2))
    f = tape.fold()
    assert f.counters["malformed"] == 1 and f.seq == 2 and f.clean


# --- rule 9: order ------------------------------------------------------------------------------


def test_rule9_items_ordered_by_beginning_event() -> None:
    tape = Tape()
    tape.add("agent.reply.started", reply="r1")  # begins before the user spoke
    tape.said("hello?")
    tape.add("agent.text", reply="r1", text="Hi!")
    tape.add("agent.reply.done", reply="r1")
    tape.add("agent.speech.started", reply="r1")
    tape.add("agent.speech.ended", reply="r1", interrupted=False)
    assert tape.items() == [("assistant", "Hi!"), ("user", "hello?")]


# --- clean --------------------------------------------------------------------------------------


def clean_flags(tape: Tape) -> list[bool]:
    f = ContextFold()
    flags = []
    for event in tape.events:
        f.apply(event)
        flags.append(f.clean)
    return flags


def test_clean_conditions_and_last_clean_seq() -> None:
    tape = Tape()
    tape.add("user.speech.started")  # 2 unclean (mid-utterance)
    tape.interim("hel")  # 3
    tape.add("user.speech.stopped")  # 4 unclean: interim newer than the last final
    tape.said("hello")  # 5 clean
    tape.add("agent.reply.started", reply="r1")  # 6 generating
    tape.add("agent.text", reply="r1", text="Hi")  # 7
    tape.add("agent.reply.done", reply="r1")  # 8 waiting to be heard
    tape.add("agent.speech.started", reply="r1")  # 9
    tape.add("agent.speech.ended", reply="r1", interrupted=False)  # 10 clean
    tape.call("c1")  # 11 tool in progress
    tape.add("tool.started", call="c1")  # 12
    tape.result("c1", 1)  # 13 clean
    tape.add("session.dropped")  # 14 dropped
    tape.add("session.resumed", agent="alice", epoch=2, from_seq=13)  # 15 clean
    tape.add("session.ended")  # 16 clean
    flags = clean_flags(tape)
    assert [i + 1 for i, ok in enumerate(flags) if ok] == [1, 5, 10, 13, 15, 16]
    assert tape.fold(12).last_clean_seq == 10
    assert tape.fold(14).native()["last_clean_seq"] == 13


def test_text_session_replies_do_not_wait_for_playout() -> None:
    tape = Tape(modality="text")
    tape.reply("r1", "hi")
    assert tape.fold().clean
    voice = Tape()
    voice.reply("r1", "hi")
    assert not voice.fold().clean


def test_resume_clears_user_mid_utterance() -> None:
    tape = Tape()
    tape.add("user.speech.started")
    tape.interim("I'd like")
    tape.add("session.dropped")
    tape.add("session.resumed", agent="alice", epoch=2, from_seq=1)
    f = tape.fold()
    assert f.clean and f.native()["pending"]["user_text"] is None


def test_seq_falls_back_to_running_count() -> None:
    events = [
        Event(type="session.started", data={"agent": "a"}, session="s", id="a"),
        Event(type="user.text", data={"text": "hi"}, session="s", id="b"),
    ]
    f = fold_events(events)
    assert f.seq == 2 and f.session == "s"


def test_runtime_views() -> None:
    tape = Tape()
    tape.add("agent.reply.started", reply="r1")
    tape.add("agent.text", reply="r1", text="Hold on")
    tape.call("c1", name="pay", arguments={"amount": 3}, reply="r1")
    tape.add("tool.started", call="c1")
    tape.add("tool.progress", call="c1", state={"step": 2})
    f = tape.fold()
    (call,) = f.tool_calls()
    assert (call.call_id, call.status, call.progress, call.arguments) == (
        "c1",
        "in_progress",
        {"step": 2},
        '{"amount":3}',
    )
    (reply,) = f.open_replies()
    assert reply.generating and reply.awaiting_playout and reply.heard == "Hold on"
    assert f.replies() == [reply] and f.reply_state("r1") == reply and f.reply_state("nope") is None
    assert f.tool_call("c1") == call and f.tool_call("nope") is None
    assert f.latest_reply() == "r1" and f.knows("e2") and not f.knows("zz")


def test_interruption_applies_while_included_calls_have_not_started() -> None:
    tape = Tape(modality="text")
    tape.add("agent.reply.started", reply="r1")
    tape.call("c1", reply="r1")
    tape.add("agent.reply.done", reply="r1")
    assert not tape.fold().clean
    tape.add("interruption", cause="api")
    assert tape.items() == [
        ("call", "c1"),
        ("out", "c1", "cancelled", {"status": "cancelled", "reason": "interrupted"}),
    ]
    assert tape.fold().clean


def test_reply_named_only_by_a_tool_call_begins_there() -> None:
    tape = Tape(modality="text")
    tape.said("hi")
    tape.call("c1", reply="r9")
    assert not tape.fold().clean  # r9 is generating until its agent.reply.done
    tape.add("agent.text", reply="r9", text="Looking.")
    tape.add("agent.reply.done", reply="r9")
    tape.result("c1", "found")
    assert tape.items() == [
        ("user", "hi"),
        ("assistant", "Looking."),
        ("call", "c1"),
        ("out", "c1", "completed", "found"),
    ]
    assert tape.fold().clean


def test_snapshot_of_another_version_is_refused() -> None:
    tape = Tape()
    tape.said("hi")
    blob = tape.fold().to_snapshot()
    assert ContextFold.from_snapshot(blob).native() == tape.native()
    with pytest.raises(SnapshotMismatch, match="fold version 999"):
        ContextFold.from_snapshot(blob.replace(b'"v":%d' % FOLD_VERSION, b'"v":999'))
    with pytest.raises(SnapshotMismatch):
        ContextFold.from_snapshot(b"garbage")
    with pytest.raises(SnapshotMismatch, match="damaged"):
        ContextFold.from_snapshot(b'{"v":%d}' % FOLD_VERSION)
