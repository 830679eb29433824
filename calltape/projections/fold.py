"""The one fold that turns a session's events into its chat context (SPEC section 2).

The live runtime calls :meth:`ContextFold.apply` as events are emitted and replay folds stored rows
with the very same code, so the context an agent saw and the context a replay rebuilds can never
drift apart. The fold is incremental: after every event it knows whether the state is *clean* and
the latest clean seq, which is what resume and snapshots need, without a second pass.

Rules where SPEC section 2 is silent (decided by the lead, implemented here):

* **Seq.** ``event.seq`` when set, else the running count of folded events (pure tests).
* **Duplicates.** Ids already folded are skipped. The set of seen ids lives in memory only and is
  *not* part of a snapshot: the tail folded after a snapshot comes from the store, which is unique
  by id, so it cannot repeat an event that went into the snapshot.
* **Unknown types** (newer versions, ``x.*``) are skipped; so is an event of a known type whose
  ``data`` lacks a required field (counted in ``counters["malformed"]``). Skipped events still
  advance ``seq`` and can be a clean point.
* **System.** The instructions of the agent current at N: ``session.started.instructions``, then
  the latest ``agent.instructions.text`` or ``agent.handoff.instructions``. A handoff without
  instructions keeps the previous ones; ``session.resumed`` switches agent and epoch but keeps the
  instructions (resume appends ``agent.instructions`` when the new agent needs other ones). No
  instructions at all: the system message content is ``""`` (provider formats omit it).
* **User turns.** Final transcripts and ``user.text`` are stripped and joined with single spaces
  (empty pieces skipped). A new user message starts when content arrives after a reply *began*
  later than the current user message did: ``agent.reply.started``, or the first event of a reply
  that has none (``agent.text`` / ``tool.call``) -- otherwise a user message could be ordered before
  an assistant reply it actually answers. An interim replaces the pending interim (an empty interim
  clears it); a final transcript clears it; ``user.text`` (typed input) leaves it alone.
  ``session.resumed`` clears the pending interim and the user's open speech edge: the new transport
  starts a new STT stream, and no event could ever settle them otherwise.
* **Heard text.** Latest ``heard`` given wins; else, if interrupted, ``""`` when speech never
  started, else the text generated before the interruption; else the full generated text
  (``agent.text`` deltas concatenated verbatim). ``agent.text`` after the interruption is ignored.
  A heard text that is empty or only whitespace counts as *no heard text* (rule 6). A
  ``agent.speech.progress`` implies the speech started. In a ``text`` session there is no playout:
  an interrupted reply keeps the text streamed before the interruption (read literally, the SPEC
  would give ``""`` — text the user did see).
  Reply events (``agent.reply.done``, ``agent.speech.*``) naming an unknown reply are ignored.
* **Interruption targeting.** ``interruption.data.reply``, else the latest reply. It applies only
  while that reply is *active*: still generating, or its playout is unfinished (voice session,
  text generated, speech not ended), or it has included calls not yet settled (a barge-in while a
  tool runs interrupts the turn, so ``cancel``-policy tools stop). An interruption of a complete
  reply (or of an unknown or already interrupted one) does not mark it; only its ``heard``, when
  given, still applies (rule 3: the latest ``heard`` wins — e.g. an OpenAI Realtime truncate that
  arrives after ``response.done``); it counts in ``counters["interruptions_ignored"]``.
  ``agent.speech.ended`` with ``interrupted: true`` is an interruption of its reply (same activity
  test); its ``heard``, like any ``heard``, applies
  either way. That is what resume writes for a playout cut by a drop (SPEC section 4), and what
  frameworks report when only the playout knows about a barge-in.
* **Tool calls.** A ``tool.call`` without ``reply`` joins the latest reply; with no reply at all, an
  anonymous (already done) reply begins at the call. A reply without ``agent.reply.started`` begins
  at its first ``agent.text`` or ``tool.call``. A call arriving after its reply's interruption is
  excluded until a ``tool.started`` or a ``tool.result`` for it arrives (a result proves it ran).
  A repeated ``tool.call`` id is ignored, as are tool events for unknown call ids. Arguments are
  kept as a JSON string (an object is dumped; a
  blank string becomes ``"{}"``). The latest ``tool.progress`` state is kept for resume.
* **Outputs.** The first ``tool.result`` (status ``completed``, or ``error`` when ``error: true``)
  wins, even over an earlier ``tool.cancelled``; a cancel after a result, or a second cancel, is
  ignored. Otherwise a synthetic object: ``{"status": "timeout"}`` (reason ``timeout``),
  ``{"status": "unknown"}`` (outcome ``unknown``), ``{"status": "cancelled", "reason": R}`` (other
  cancels, and an included call of an interrupted reply that never started: ``interrupted``),
  ``{"status": "in_progress"}`` otherwise.
* **Clean.** SPEC text. ``session.dropped`` makes the state unclean until ``session.resumed``;
  ``session.ended`` does not. ``last_clean_seq`` is 0 until the first clean event.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass
from typing import Any, Final

import orjson

from calltape.errors import CalltapeError
from calltape.events import Event
from calltape.gcpause import gc_paused

FOLD_VERSION: Final = 1
"""Bump whenever a rule above changes: snapshots of another version are refused and rebuilt."""

_INTERRUPTED: Final = "interrupted"


class SnapshotMismatch(CalltapeError):
    """A snapshot written by other fold rules (or damaged) cannot be restored."""


# ---------------------------------------------------------------------------------------------
# Records. Plain slotted classes: the fold touches them 100k times per replay.


class _User:
    __slots__ = ("parts", "seq")

    def __init__(self, seq: int, parts: list[str]) -> None:
        self.seq = seq
        self.parts = parts


class _Handoff:
    __slots__ = ("from_", "seq", "to")

    def __init__(self, seq: int, from_: str, to: str) -> None:
        self.seq = seq
        self.from_ = from_
        self.to = to


class _Reply:
    __slots__ = (
        "calls",
        "done",
        "has_text",
        "heard",
        "id",
        "interrupted",
        "parts",
        "seq",
        "speech_ended",
        "speech_started",
        "started",
    )

    def __init__(self, rid: str, seq: int) -> None:
        self.id = rid
        self.seq = seq
        self.started = False
        self.done = False
        self.parts: list[str] = []
        self.has_text = False
        self.interrupted = False
        self.heard: str | None = None
        self.speech_started = False
        self.speech_ended = False
        self.calls: list[_Call] = []

    def text(self) -> str:
        if self.heard is not None:
            return self.heard
        if self.interrupted and not self.speech_started:
            return ""
        return "".join(self.parts)


class _Call:
    __slots__ = (
        "arguments",
        "cancel_outcome",
        "cancel_reason",
        "error",
        "has_progress",
        "has_result",
        "id",
        "included",
        "name",
        "output",
        "progress",
        "reply",
        "seq",
        "started",
    )

    def __init__(self, cid: str, name: str, arguments: str, reply: _Reply, seq: int, included: bool) -> None:
        self.id = cid
        self.name = name
        self.arguments = arguments
        self.reply = reply
        self.seq = seq
        self.included = included
        self.started = False
        self.has_result = False
        self.output: Any = None
        self.error = False
        self.cancel_reason: str | None = None
        self.cancel_outcome: str | None = None
        self.has_progress = False
        self.progress: Any = None

    def status(self) -> str:
        if self.has_result:
            return "error" if self.error else "completed"
        reason = self.cancel_reason
        if reason is not None:
            if reason == "timeout":
                return "timeout"
            if self.cancel_outcome == "unknown":
                return "unknown"
            return "cancelled"
        if self.reply.interrupted and not self.started:
            return "cancelled"
        return "in_progress"

    def result(self) -> Any:
        """The output an LLM sees: the tool's own, or a synthetic ``{"status": ...}`` object."""
        if self.has_result:
            return self.output
        status = self.status()
        if status == "cancelled":
            return {"status": "cancelled", "reason": self.cancel_reason or _INTERRUPTED}
        return {"status": status}


_Item = _User | _Reply | _Handoff


# ---------------------------------------------------------------------------------------------
# Read-only views for the runtime (resume, guarded tools).


@dataclass(frozen=True, slots=True)
class ToolCallState:
    """A read-only view of one tool call: what resume and guarded execution decide from."""

    call_id: str
    name: str
    arguments: str
    reply: str
    included: bool
    started: bool
    status: str
    output: Any
    progress: Any
    has_progress: bool


@dataclass(frozen=True, slots=True)
class ReplyState:
    """One reply as folded so far (what :mod:`calltape.adapters.replies` and the runtime read)."""

    reply: str
    generating: bool
    awaiting_playout: bool
    interrupted: bool
    speech_started: bool
    heard: str
    """The context's text for the reply (rule 3)."""
    seq: int = 0
    """The seq at which the reply began."""
    done: bool = False
    """``agent.reply.done`` was folded."""
    speech_ended: bool = False
    generated: str = ""
    """Every ``agent.text`` delta kept (late tokens of an interrupted reply excluded)."""
    reported_heard: str | None = None
    """The latest ``heard`` given by an event, None when none was."""


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        return value if value.strip() else "{}"
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


# ---------------------------------------------------------------------------------------------


class ContextFold:
    """Incremental fold of one session's events; see the module docstring for the rules."""

    __slots__ = (
        "_calls",
        "_count",
        "_cur_user",
        "_flags",
        "_generating",
        "_interim",
        "_items",
        "_last_reply",
        "_open_calls",
        "_replies",
        "_seen",
        "_unheard",
        "agent",
        "counters",
        "epoch",
        "instructions",
        "last_clean_seq",
        "modality",
        "seq",
        "session",
    )

    def __init__(self, session: str | None = None) -> None:
        self.session = session
        self.seq = 0
        self.last_clean_seq = 0
        self.agent: str | None = None
        self.epoch = 0
        self.modality = "voice"
        self.instructions = ""
        self.counters: dict[str, int] = {
            "interruptions": 0,
            "interruptions_ignored": 0,
            "skipped": 0,
            "malformed": 0,
        }
        self._count = 0
        self._seen: set[str] = set()
        self._items: list[_Item] = []
        self._replies: dict[str, _Reply] = {}
        self._calls: dict[str, _Call] = {}
        self._cur_user: _User | None = None
        self._last_reply: _Reply | None = None
        self._interim: str | None = None
        # user mid-utterance ("speaking", "interim") and "dropped": the non-reply clean conditions
        self._flags: set[str] = set()
        self._generating: set[str] = set()
        self._unheard: set[str] = set()
        self._open_calls: set[str] = set()

    # -- entry points -----------------------------------------------------------------------

    def apply(self, event: Event) -> bool:
        """Folds one event; False when it was a duplicate (already folded)."""
        eid = event.id
        seen = self._seen
        if eid in seen:
            return False
        seen.add(eid)
        if self.session is None:
            self.session = event.session
        seq = event.seq
        if seq is None:
            seq = self._count + 1
        self._count = seq
        handler = _DISPATCH.get(event.type)
        if handler is None:
            self.counters["skipped"] += 1
        else:
            try:
                handler(self, event.data, seq)
            except (KeyError, TypeError, AttributeError):
                self.counters["malformed"] += 1
        self.seq = seq
        if not (self._generating or self._unheard or self._open_calls or self._flags):
            self.last_clean_seq = seq
        return True

    def apply_many(self, events: Iterable[Event]) -> None:
        """Same as :meth:`apply` per event, with the look-ups hoisted out of the loop.

        A long batch (a replay) runs with the cyclic garbage collector paused: the fold allocates
        only acyclic records, and collections triggered by them would rescan every event in
        memory (about 15% of the replay time).
        """
        with contextlib.ExitStack() as stack:
            if isinstance(events, Sized):
                stack.enter_context(gc_paused(len(events)))
            self._apply_all(events)

    def _apply_all(self, events: Iterable[Event]) -> None:
        seen = self._seen
        dispatch = _DISPATCH
        counters = self.counters
        generating, unheard, open_calls, flags = self._generating, self._unheard, self._open_calls, self._flags
        count = self._count
        last_clean = self.last_clean_seq
        seq = self.seq
        event: Event | None = None
        try:
            for event in events:
                eid = event.id
                if eid in seen:
                    continue
                seen.add(eid)
                event_seq = event.seq
                seq = count + 1 if event_seq is None else event_seq
                count = seq
                handler = dispatch.get(event.type)
                if handler is None:
                    counters["skipped"] += 1
                else:
                    try:
                        handler(self, event.data, seq)
                    except (KeyError, TypeError, AttributeError):
                        counters["malformed"] += 1
                if not (generating or unheard or open_calls or flags):
                    last_clean = seq
        finally:
            self._count = count
            self.seq = seq
            self.last_clean_seq = last_clean
            if self.session is None and event is not None:
                self.session = event.session

    # -- state ------------------------------------------------------------------------------

    @property
    def clean(self) -> bool:
        """Whether nothing is in flight after the last event (a point resume can start from)."""
        return not (self._generating or self._unheard or self._open_calls or self._flags)

    @property
    def dropped(self) -> bool:
        """Whether the session is dropped and not resumed yet."""
        return "dropped" in self._flags

    @property
    def user_speaking(self) -> bool:
        """Whether the user is mid-utterance (speech started, not stopped)."""
        return "speaking" in self._flags

    @property
    def pending_user_text(self) -> str | None:
        """The latest interim transcript not yet made final, if any."""
        return self._interim

    @property
    def user_turn_seq(self) -> int | None:
        """The seq at which the current (latest) user message began; None before any user content."""
        return None if self._cur_user is None else self._cur_user.seq

    @staticmethod
    def _call_state(c: _Call) -> ToolCallState:
        return ToolCallState(
            call_id=c.id,
            name=c.name,
            arguments=c.arguments,
            reply=c.reply.id,
            included=c.included,
            started=c.started,
            status=c.status(),
            output=c.result(),
            progress=c.progress,
            has_progress=c.has_progress,
        )

    def _reply_state(self, r: _Reply) -> ReplyState:
        return ReplyState(
            reply=r.id,
            generating=r.id in self._generating,
            awaiting_playout=r.id in self._unheard,
            interrupted=r.interrupted,
            speech_started=r.speech_started,
            heard=r.text(),
            seq=r.seq,
            done=r.done,
            speech_ended=r.speech_ended,
            generated="".join(r.parts),
            reported_heard=r.heard,
        )

    def tool_calls(self) -> list[ToolCallState]:
        """Every known call (excluded ones too, ``included=False``), in ``tool.call`` order."""
        return [self._call_state(c) for c in self._calls.values()]

    def tool_call(self, call_id: str) -> ToolCallState | None:
        """One call's state (the runtime's exactly-once and never-start checks)."""
        c = self._calls.get(call_id)
        return None if c is None else self._call_state(c)

    def reply_state(self, reply: str) -> ReplyState | None:
        """One reply's state (the runtime's interruption-aware waits); None: never seen."""
        r = self._replies.get(reply)
        return None if r is None else self._reply_state(r)

    def replies(self) -> list[ReplyState]:
        """Every reply, in the order they began (anonymous ones have ids starting with NUL)."""
        return [self._reply_state(item) for item in self._items if isinstance(item, _Reply)]

    def open_replies(self) -> list[ReplyState]:
        """Replies that keep the state unclean: still generating or waiting to be heard."""
        return [
            self._reply_state(item)
            for item in self._items
            if isinstance(item, _Reply) and (item.id in self._generating or item.id in self._unheard)
        ]

    def knows(self, event_id: str) -> bool:
        """Whether this event id was folded already (the runtime's cheap duplicate check)."""
        return event_id in self._seen

    def latest_reply(self) -> str | None:
        """The reply an ``interruption`` without ``reply`` targets."""
        return self._last_reply.id if self._last_reply is not None else None

    def native(self) -> dict[str, Any]:
        """The ``native`` context (SPEC section 2, Formats)."""
        items: list[dict[str, Any]] = [{"type": "message", "role": "system", "content": self.instructions}]
        pending: list[dict[str, Any]] = []
        for item in self._items:
            if isinstance(item, _User):
                items.append({"type": "message", "role": "user", "content": " ".join(item.parts)})
            elif isinstance(item, _Reply):
                calls = [c for c in item.calls if c.included]
                text = item.text()
                has_text = bool(text.strip())
                if not has_text and not calls:
                    continue
                if has_text:
                    msg: dict[str, Any] = {"type": "message", "role": "assistant", "content": text}
                    if item.interrupted:
                        msg["interrupted"] = True
                    items.append(msg)
                for c in calls:
                    items.append({"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments})
                for c in calls:
                    status = c.status()
                    items.append(
                        {
                            "type": "function_call_output",
                            "call_id": c.id,
                            "output": c.result(),
                            "status": status,
                        }
                    )
                    if status == "in_progress":
                        pending.append({"call_id": c.id, "name": c.name, "status": status})
            else:
                items.append({"type": "handoff", "from": item.from_, "to": item.to})
        return {
            "session": self.session,
            "seq": self.seq,
            "agent": self.agent,
            "epoch": self.epoch,
            "clean": self.clean,
            "last_clean_seq": self.last_clean_seq,
            "items": items,
            "pending": {"user_text": self._interim, "tools": pending},
        }

    def render(self, format: str = "native") -> Any:
        """The context in a format of :data:`calltape.projections.formats.FORMATS`."""
        from calltape.projections.formats import render

        return render(self.native(), format)

    # -- bookkeeping of the clean conditions ------------------------------------------------

    def _refresh_reply(self, r: _Reply) -> None:
        if not r.done and not r.interrupted:
            self._generating.add(r.id)
        else:
            self._generating.discard(r.id)
        if self.modality == "voice" and r.has_text and not r.speech_ended and not r.interrupted:
            self._unheard.add(r.id)
        else:
            self._unheard.discard(r.id)

    def _refresh_call(self, c: _Call) -> None:
        if c.included and not c.has_result and c.cancel_reason is None and (c.started or not c.reply.interrupted):
            self._open_calls.add(c.id)
        else:
            self._open_calls.discard(c.id)

    def _reply(self, rid: str, seq: int, done: bool = False) -> _Reply:
        r = self._replies.get(rid)
        if r is None:
            r = _Reply(rid, seq)
            r.done = done
            self._replies[rid] = r
            self._items.append(r)
            self._last_reply = r
            self._refresh_reply(r)
        return r

    def _active(self, r: _Reply) -> bool:
        if r.interrupted:
            return False
        if not r.done:
            return True
        if self.modality == "voice" and r.has_text and not r.speech_ended:
            return True
        return any(c.included and not c.has_result and c.cancel_reason is None for c in r.calls)

    def _interrupt(self, r: _Reply | None, heard: str | None) -> bool:
        if r is None:
            return False
        if not self._active(r):
            if heard is not None:  # a late but authoritative word on what was heard (rule 3)
                r.heard = heard
                self._refresh_reply(r)
            return False
        r.interrupted = True
        if heard is not None:
            r.heard = heard
        elif self.modality == "text":  # no playout: the user saw what streamed before the interruption
            r.heard = "".join(r.parts)
        self._refresh_reply(r)
        for c in r.calls:
            self._refresh_call(c)
        return True

    def _user_content(self, text: str, seq: int) -> None:
        text = text.strip()
        if not text:
            return
        cur = self._cur_user
        last = self._last_reply
        if cur is None or (last is not None and last.seq > cur.seq):
            self._cur_user = _User(seq, [text])
            self._items.append(self._cur_user)
        else:
            cur.parts.append(text)

    # -- handlers (one per event type; data fields are read before anything is mutated) -------

    def _on_session_started(self, data: dict[str, Any], seq: int) -> None:
        agent = data["agent"]
        self.agent = agent
        instructions = data.get("instructions")
        if instructions is not None:
            self.instructions = instructions
        self.modality = data.get("modality") or "voice"
        self.epoch = max(self.epoch, 1)
        for r in self._replies.values():
            self._refresh_reply(r)

    def _on_session_ended(self, data: dict[str, Any], seq: int) -> None:
        pass

    def _on_session_dropped(self, data: dict[str, Any], seq: int) -> None:
        self._flags.add("dropped")

    def _on_session_resumed(self, data: dict[str, Any], seq: int) -> None:
        agent, epoch = data["agent"], int(data["epoch"])
        self.agent = agent
        self.epoch = epoch
        self._flags.clear()
        self._interim = None

    def _on_handoff(self, data: dict[str, Any], seq: int) -> None:
        from_, to = data["from"], data["to"]
        instructions = data.get("instructions")
        self._items.append(_Handoff(seq, from_, to))
        self.agent = to
        if instructions is not None:
            self.instructions = instructions

    def _on_instructions(self, data: dict[str, Any], seq: int) -> None:
        self.instructions = data["text"]

    def _on_speech_started(self, data: dict[str, Any], seq: int) -> None:
        self._flags.add("speaking")

    def _on_speech_stopped(self, data: dict[str, Any], seq: int) -> None:
        self._flags.discard("speaking")

    def _on_transcript(self, data: dict[str, Any], seq: int) -> None:
        text = data["text"]
        if data["final"]:
            self._interim = None
            self._flags.discard("interim")
            self._user_content(text, seq)
        else:
            interim = self._interim = text.strip() or None
            if interim is None:
                self._flags.discard("interim")
            else:
                self._flags.add("interim")

    def _on_user_text(self, data: dict[str, Any], seq: int) -> None:
        self._user_content(data["text"], seq)

    def _on_reply_started(self, data: dict[str, Any], seq: int) -> None:
        r = self._reply(data["reply"], seq)
        if not r.started:
            r.started = True
            self._refresh_reply(r)

    def _on_text(self, data: dict[str, Any], seq: int) -> None:
        rid, text = data["reply"], data["text"]
        r = self._replies.get(rid)
        if r is None:
            r = self._reply(rid, seq)
        elif r.interrupted:
            return
        if text:
            r.parts.append(text)
            if not r.has_text:
                r.has_text = True
                self._refresh_reply(r)

    def _on_reply_done(self, data: dict[str, Any], seq: int) -> None:
        r = self._replies.get(data["reply"])
        if r is not None and not r.done:
            r.done = True
            self._refresh_reply(r)

    def _on_agent_speech_started(self, data: dict[str, Any], seq: int) -> None:
        r = self._replies.get(data["reply"])
        if r is not None:
            r.speech_started = True

    def _on_speech_progress(self, data: dict[str, Any], seq: int) -> None:
        heard = data["heard"]
        r = self._replies.get(data["reply"])
        if r is not None:
            r.heard = heard
            r.speech_started = True

    def _on_agent_speech_ended(self, data: dict[str, Any], seq: int) -> None:
        heard, interrupted = data.get("heard"), data.get("interrupted")
        r = self._replies.get(data["reply"])
        if r is None:
            return
        if interrupted:
            self._interrupt(r, None)
        if heard is not None:
            r.heard = heard
        r.speech_ended = True
        self._refresh_reply(r)

    def _on_interruption(self, data: dict[str, Any], seq: int) -> None:
        rid, heard = data.get("reply"), data.get("heard")
        self.counters["interruptions"] += 1
        if not self._interrupt(self._last_reply if rid is None else self._replies.get(rid), heard):
            self.counters["interruptions_ignored"] += 1

    def _on_tool_call(self, data: dict[str, Any], seq: int) -> None:
        cid, name, arguments = data["call"], data["name"], _arguments(data["arguments"])
        if cid in self._calls:
            return
        rid = data.get("reply")
        if rid is not None:
            r = self._replies.get(rid)
            if r is None:
                r = self._reply(rid, seq)
        elif self._last_reply is not None:
            r = self._last_reply
        else:
            r = self._reply(f"\x00call:{cid}", seq, done=True)
        c = _Call(cid, name, arguments, r, seq, not r.interrupted)
        self._calls[cid] = c
        r.calls.append(c)
        self._refresh_call(c)

    def _on_tool_started(self, data: dict[str, Any], seq: int) -> None:
        c = self._calls.get(data["call"])
        if c is not None:
            c.started = True
            c.included = True
            self._refresh_call(c)

    def _on_tool_progress(self, data: dict[str, Any], seq: int) -> None:
        c = self._calls.get(data["call"])
        if c is not None:
            c.progress = data.get("state")
            c.has_progress = True

    def _on_tool_result(self, data: dict[str, Any], seq: int) -> None:
        c = self._calls.get(data["call"])
        if c is not None and not c.has_result:
            c.has_result = True
            c.included = True  # a result proves the call ran: the truth wins (rule 4)
            c.output = data.get("output")
            c.error = bool(data.get("error"))
            self._refresh_call(c)

    def _on_tool_cancelled(self, data: dict[str, Any], seq: int) -> None:
        reason, outcome = str(data["reason"]), data.get("outcome")
        c = self._calls.get(data["call"])
        if c is not None and not c.has_result and c.cancel_reason is None:
            c.cancel_reason = reason
            c.cancel_outcome = outcome
            self._refresh_call(c)

    # -- snapshots --------------------------------------------------------------------------

    def to_snapshot(self) -> bytes:
        """The whole fold state (but the seen ids, see the module docstring) as bytes."""
        items: list[list[Any]] = []
        index: dict[int, int] = {}
        for i, item in enumerate(self._items):
            index[id(item)] = i
            if isinstance(item, _User):
                items.append(["u", item.seq, item.parts])
            elif isinstance(item, _Reply):
                items.append(
                    [
                        "r",
                        item.id,
                        item.seq,
                        item.started,
                        item.done,
                        item.parts,
                        item.has_text,
                        item.interrupted,
                        item.heard,
                        item.speech_started,
                        item.speech_ended,
                    ]
                )
            else:
                items.append(["h", item.seq, item.from_, item.to])
        calls = [
            [
                c.id,
                c.name,
                c.arguments,
                c.reply.id,
                c.seq,
                c.included,
                c.started,
                c.has_result,
                c.output,
                c.error,
                c.cancel_reason,
                c.cancel_outcome,
                c.has_progress,
                c.progress,
            ]
            for c in self._calls.values()
        ]
        state = {
            "v": FOLD_VERSION,
            "session": self.session,
            "seq": self.seq,
            "count": self._count,
            "last_clean_seq": self.last_clean_seq,
            "agent": self.agent,
            "epoch": self.epoch,
            "modality": self.modality,
            "instructions": self.instructions,
            "counters": self.counters,
            "interim": self._interim,
            "flags": sorted(self._flags),
            "cur_user": -1 if self._cur_user is None else index[id(self._cur_user)],
            "last_reply": None if self._last_reply is None else self._last_reply.id,
            "items": items,
            "calls": calls,
        }
        return orjson.dumps(state)

    @classmethod
    def from_snapshot(cls, blob: bytes) -> ContextFold:
        """Restores :meth:`to_snapshot` output; refuses another :data:`FOLD_VERSION`."""
        try:
            with gc_paused(len(blob) // 64):  # tens of thousands of small acyclic objects
                state = orjson.loads(blob)
            version = state.get("v") if isinstance(state, dict) else None
        except orjson.JSONDecodeError:
            version = None
        if version != FOLD_VERSION:
            raise SnapshotMismatch(
                f"the snapshot was written by fold version {version}, this calltape folds version {FOLD_VERSION}"
            )
        try:
            with gc_paused(len(state.get("items", ()))):
                return cls._restore(state)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise SnapshotMismatch(f"the snapshot is damaged ({type(exc).__name__})") from None

    @classmethod
    def _restore(cls, s: dict[str, Any]) -> ContextFold:
        f = cls(s["session"])
        f.seq, f._count, f.last_clean_seq = s["seq"], s["count"], s["last_clean_seq"]
        f.agent, f.epoch, f.modality, f.instructions = (
            s["agent"],
            s["epoch"],
            s["modality"],
            s["instructions"],
        )
        f.counters = dict(s["counters"])
        f._interim = s["interim"]
        f._flags = set(s["flags"])
        for row in s["items"]:
            kind = row[0]
            if kind == "u":
                f._items.append(_User(row[1], list(row[2])))
            elif kind == "r":
                r = _Reply(row[1], row[2])
                (r.started, r.done, r.parts, r.has_text, r.interrupted, r.heard) = row[3:9]
                r.speech_started, r.speech_ended = row[9], row[10]
                f._replies[r.id] = r
                f._items.append(r)
            elif kind == "h":
                f._items.append(_Handoff(row[1], row[2], row[3]))
            else:
                raise ValueError(kind)
        for row in s["calls"]:
            r = f._replies[row[3]]
            c = _Call(row[0], row[1], row[2], r, row[4], row[5])
            (c.started, c.has_result, c.output, c.error, c.cancel_reason, c.cancel_outcome) = row[6:12]
            c.has_progress, c.progress = row[12], row[13]
            f._calls[c.id] = c
            r.calls.append(c)
        if s["cur_user"] >= 0:
            user = f._items[s["cur_user"]]
            if not isinstance(user, _User):
                raise ValueError("cur_user")
            f._cur_user = user
        if s["last_reply"] is not None:
            f._last_reply = f._replies[s["last_reply"]]
        for r in f._replies.values():
            f._refresh_reply(r)
        for c in f._calls.values():
            f._refresh_call(c)
        return f


_Handler = Callable[[ContextFold, dict[str, Any], int], None]

_DISPATCH: Final[dict[str, _Handler]] = {
    "session.started": ContextFold._on_session_started,
    "session.ended": ContextFold._on_session_ended,
    "session.dropped": ContextFold._on_session_dropped,
    "session.resumed": ContextFold._on_session_resumed,
    "agent.handoff": ContextFold._on_handoff,
    "agent.instructions": ContextFold._on_instructions,
    "user.speech.started": ContextFold._on_speech_started,
    "user.speech.stopped": ContextFold._on_speech_stopped,
    "user.transcript": ContextFold._on_transcript,
    "user.text": ContextFold._on_user_text,
    "agent.reply.started": ContextFold._on_reply_started,
    "agent.text": ContextFold._on_text,
    "agent.reply.done": ContextFold._on_reply_done,
    "agent.speech.started": ContextFold._on_agent_speech_started,
    "agent.speech.progress": ContextFold._on_speech_progress,
    "agent.speech.ended": ContextFold._on_agent_speech_ended,
    "interruption": ContextFold._on_interruption,
    "tool.call": ContextFold._on_tool_call,
    "tool.started": ContextFold._on_tool_started,
    "tool.progress": ContextFold._on_tool_progress,
    "tool.result": ContextFold._on_tool_result,
    "tool.cancelled": ContextFold._on_tool_cancelled,
}


def fold_events(events: Iterable[Event], session: str | None = None) -> ContextFold:
    """A fresh fold of ``events`` (the whole list: cut it to the instant first)."""
    f = ContextFold(session)
    f.apply_many(events)
    return f
