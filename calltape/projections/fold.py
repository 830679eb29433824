"""The one fold that turns a session's events into its chat context (SPEC section 2).

The live runtime calls :meth:`ContextFold.apply` as events are emitted and replay folds stored rows
with the very same code, so the context an agent saw and the context a replay rebuilds can never
drift apart. The fold is incremental: after every event it knows whether the state is *clean* and
the latest clean seq, which is what resume and snapshots need, without a second pass.

Where each rule of SPEC section 2 is implemented (one function each; ``F`` is :class:`ContextFold`,
records are in :mod:`calltape.projections.records`, rendering in :mod:`calltape.projections.native`):

======================  ==========================================================================
rule                    function
======================  ==========================================================================
1. System               ``F._switch_agent`` (agent and instructions, from every event that sets them)
2. User turns           ``F._user_content`` (turn split and joining); pending interim: ``F._on_transcript``
3. Assistant = heard    ``records.heard_text`` (late tokens: ``F._on_text``; marking: ``F._interrupt``)
4. Calls in their reply ``F._on_tool_call`` (the reply it joins, excluded if late); ``F._ran`` (ran: included)
5. One output per call  ``records.call_status`` (the decision; ``records.call_outcome`` adds the output)
6. Empty items omitted  ``native.reply_items``
7. Handoff              ``F._on_handoff`` (item and agent switch); provider formats drop it
8. Duplicates, unknown  ``F.apply`` / ``F.apply_many`` (seen ids, dispatch miss)
9. Order                ``F._begin`` (every item enters the list at the seq that began it)
Clean                   ``F._is_clean`` (``last_clean_seq`` is kept by ``apply``/``apply_many``)
Snapshot                :mod:`calltape.projections.snapshot`
======================  ==========================================================================

Handlers are registered next to their code with ``@_handles("<event type>")``.

Rules where SPEC section 2 is silent (decided by the lead, implemented here):

* **Seq.** ``event.seq`` when set, else the running count of folded events (pure tests).
* **Duplicates.** Ids already folded are skipped. The set of seen ids lives in memory only and is
  *not* part of a snapshot: the tail folded after a snapshot comes from the store, which is unique
  by id, so it cannot repeat an event that went into the snapshot.
* **Effects.** ``tool.effect`` (SPEC section 8) has no handler: it changes no context (the call's
  ``tool.result`` carries the output), and is counted with the skipped events.
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
from typing import Any, Final

from calltape.events import Event
from calltape.gcpause import gc_paused
from calltape.projections import native as _native
from calltape.projections import snapshot as _snapshot
from calltape.projections.records import (
    Call,
    Handoff,
    Item,
    Reply,
    ReplyState,
    ToolCallState,
    User,
    arguments_text,
    call_open,
    call_state,
    heard_text,
)
from calltape.projections.snapshot import FOLD_VERSION

__all__ = ["FOLD_VERSION", "ContextFold", "ReplyState", "ToolCallState", "fold_events"]

_Handler = Callable[["ContextFold", dict[str, Any], int], None]

_DISPATCH: Final[dict[str, _Handler]] = {}
"""Event type -> handler, filled by :func:`_handles` as the class body runs."""


def _handles(event_type: str) -> Callable[[_Handler], _Handler]:
    """Registers the decorated method as the handler of ``event_type``."""

    def register(fn: _Handler) -> _Handler:
        _DISPATCH[event_type] = fn
        return fn

    return register


class ContextFold:
    """Incremental fold of one session's events; see the module docstring for the rules."""

    __slots__ = (
        "_calls",
        "_count",
        "_cur_user",
        "_flags",
        "_frozen",
        "_generating",
        "_interim",
        "_items",
        "_last_reply",
        "_ncalls",
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
        self._items: list[Item] = []
        self._replies: dict[str, Reply] = {}
        self._calls: dict[str, Call] = {}
        self._cur_user: User | None = None
        self._last_reply: Reply | None = None
        self._interim: str | None = None
        # user mid-utterance ("speaking", "interim") and "dropped": the non-reply clean conditions
        self._flags: set[str] = set()
        self._generating: set[str] = set()
        self._unheard: set[str] = set()
        self._open_calls: set[str] = set()
        self._ncalls = 0
        # the settled prefix of the items, kept as bytes once a snapshot was taken or restored
        self._frozen: _snapshot.Frozen | None = None

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
            frozen = self._frozen
            if frozen is not None and (event.type == "session.started" or frozen.names(event.data)):
                _snapshot.thaw(self)
            try:
                handler(self, event.data, seq)
            except (KeyError, TypeError, AttributeError):
                self.counters["malformed"] += 1
        self.seq = seq
        if self._is_clean():
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
        is_clean = self._is_clean
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
                    frozen = self._frozen
                    if frozen is not None and (event.type == "session.started" or frozen.names(event.data)):
                        _snapshot.thaw(self)
                    try:
                        handler(self, event.data, seq)
                    except (KeyError, TypeError, AttributeError):
                        counters["malformed"] += 1
                if is_clean():
                    last_clean = seq
        finally:
            self._count = count
            self.seq = seq
            self.last_clean_seq = last_clean
            if self.session is None and event is not None:
                self.session = event.session

    # -- state ------------------------------------------------------------------------------

    def _is_clean(self) -> bool:
        """The clean test (SPEC section 2): no reply generating or waiting to be heard, no included
        call in progress, the user not mid-utterance, the session not dropped."""
        return not (self._generating or self._unheard or self._open_calls or self._flags)

    @property
    def clean(self) -> bool:
        """Whether the state after the latest event is clean (see :meth:`_is_clean`)."""
        return self._is_clean()

    @property
    def dropped(self) -> bool:
        """``session.dropped`` folded and no ``session.resumed`` since."""
        return "dropped" in self._flags

    @property
    def user_speaking(self) -> bool:
        """``user.speech.started`` without ``user.speech.stopped`` yet."""
        return "speaking" in self._flags

    @property
    def pending_user_text(self) -> str | None:
        """The latest interim transcript not yet replaced by a final (``pending.user_text``)."""
        return self._interim

    @property
    def user_turn_seq(self) -> int | None:
        """The seq at which the current (latest) user message began; None before any user content."""
        return None if self._cur_user is None else self._cur_user.seq

    def _reply_state(self, r: Reply) -> ReplyState:
        return ReplyState(
            reply=r.id,
            generating=r.id in self._generating,
            awaiting_playout=r.id in self._unheard,
            interrupted=r.interrupted,
            speech_started=r.speech_started,
            heard=heard_text(r),
            seq=r.seq,
            done=r.done,
            speech_ended=r.speech_ended,
            generated="".join(r.parts),
            reported_heard=r.heard,
        )

    def tool_calls(self) -> list[ToolCallState]:
        """Every known call (excluded ones too, ``included=False``), in ``tool.call`` order."""
        _snapshot.thaw(self)
        return [call_state(c) for c in self._calls.values()]

    def tool_call(self, call_id: str) -> ToolCallState | None:
        """One call's state (the runtime's exactly-once and never-start checks)."""
        c = self._calls.get(call_id)
        if c is None and self._frozen is not None and call_id in self._frozen.calls:
            _snapshot.thaw(self)
            c = self._calls.get(call_id)
        return None if c is None else call_state(c)

    def _reply_record(self, reply: str) -> Reply | None:
        r = self._replies.get(reply)
        if r is None and self._frozen is not None and reply in self._frozen.replies:
            _snapshot.thaw(self)
            r = self._replies.get(reply)
        return r

    def reply_state(self, reply: str) -> ReplyState | None:
        """One reply's state (the runtime's interruption-aware waits); None: never seen."""
        r = self._reply_record(reply)
        return None if r is None else self._reply_state(r)

    def replies(self) -> list[ReplyState]:
        """Every reply, in the order they began (anonymous ones have ids starting with NUL)."""
        _snapshot.thaw(self)
        return [self._reply_state(item) for item in self._items if isinstance(item, Reply)]

    def reply_active(self, reply: str) -> bool:
        """Whether an interruption would cut ``reply`` now: still generating, its playout unfinished,
        or an included call of it unsettled (the one test; see "Interruption targeting" above).
        False for an unknown reply."""
        r = self._reply_record(reply)
        return r is not None and self._active(r)

    def open_replies(self) -> list[ReplyState]:
        """Replies that keep the state unclean: still generating or waiting to be heard (never frozen)."""
        return [
            self._reply_state(item)
            for item in self._items
            if isinstance(item, Reply) and (item.id in self._generating or item.id in self._unheard)
        ]

    def knows(self, event_id: str) -> bool:
        """Whether this event id was folded already (the runtime's cheap duplicate check)."""
        return event_id in self._seen

    def latest_reply(self) -> str | None:
        """The reply an ``interruption`` without ``reply`` targets."""
        return self._last_reply.id if self._last_reply is not None else None

    def native(self, *, frozen: bool = True) -> dict[str, Any]:
        """The ``native`` context (SPEC section 2, Formats). ``frozen=False`` leaves out the frozen
        items (those right after the system item): a resume plan adds them as the bytes they are."""
        items = [_native.system_item(self.instructions)]
        if frozen and self._frozen is not None:
            items.extend(self._frozen.native())
        pending: list[dict[str, Any]] = []
        _native.items_json(self._items, items, pending)
        return {
            "session": self.session,
            "seq": self.seq,
            "agent": self.agent,
            "epoch": self.epoch,
            "clean": self._is_clean(),
            "last_clean_seq": self.last_clean_seq,
            "items": items,
            "pending": {"user_text": self._interim, "tools": pending},
        }

    def render(self, format: str = "native") -> Any:
        """The context in a format of :data:`calltape.projections.formats.FORMATS`."""
        from calltape.projections.formats import render

        return render(self.native(), format)

    # -- bookkeeping of the clean conditions ------------------------------------------------

    def _refresh_reply(self, r: Reply) -> None:
        if not r.done and not r.interrupted:
            self._generating.add(r.id)
        else:
            self._generating.discard(r.id)
        if self.modality == "voice" and r.has_text and not r.speech_ended and not r.interrupted:
            self._unheard.add(r.id)
        else:
            self._unheard.discard(r.id)

    def _refresh_call(self, c: Call) -> None:
        if call_open(c):
            self._open_calls.add(c.id)
        else:
            self._open_calls.discard(c.id)

    def _refresh_all(self) -> None:
        """Recomputes every clean condition of the records (after a restore or a modality change)."""
        for r in self._replies.values():
            self._refresh_reply(r)
        for c in self._calls.values():
            self._refresh_call(c)

    def _begin(self, item: Item) -> None:
        """Rule 9: an item enters the context at the seq of the event that began it."""
        self._items.append(item)

    def _reply(self, rid: str, seq: int, done: bool = False) -> Reply:
        r = self._replies.get(rid)
        if r is None:
            r = Reply(rid, seq)
            r.done = done
            self._replies[rid] = r
            self._begin(r)
            self._last_reply = r
            self._refresh_reply(r)
        return r

    def _active(self, r: Reply) -> bool:
        if r.interrupted:
            return False
        if not r.done:
            return True
        if self.modality == "voice" and r.has_text and not r.speech_ended:
            return True
        return any(call_open(c) for c in r.calls)

    def _interrupt(self, r: Reply | None, heard: str | None) -> bool:
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
            self._cur_user = User(seq, [text])
            self._begin(self._cur_user)
        else:
            cur.parts.append(text)

    def _switch_agent(self, agent: str | None, instructions: str | None) -> None:
        """Rule 1: the agent current at N, and its instructions (kept when an event gives none)."""
        if agent is not None:
            self.agent = agent
        if instructions is not None:
            self.instructions = instructions

    def _ran(self, c: Call) -> None:
        """Rule 4: a call with a ``tool.started`` or a ``tool.result`` ran, so it is included."""
        c.included = True
        self._refresh_call(c)

    # -- handlers (one per event type; data fields are read before anything is mutated) -------

    @_handles("session.started")
    def _on_session_started(self, data: dict[str, Any], seq: int) -> None:
        agent = data["agent"]
        self._switch_agent(agent, data.get("instructions"))
        self.modality = data.get("modality") or "voice"
        self.epoch = max(self.epoch, 1)
        for r in self._replies.values():
            self._refresh_reply(r)

    @_handles("session.ended")
    def _on_session_ended(self, data: dict[str, Any], seq: int) -> None:
        pass

    @_handles("session.dropped")
    def _on_session_dropped(self, data: dict[str, Any], seq: int) -> None:
        self._flags.add("dropped")

    @_handles("session.resumed")
    def _on_session_resumed(self, data: dict[str, Any], seq: int) -> None:
        agent, epoch = data["agent"], int(data["epoch"])
        self._switch_agent(agent, None)
        self.epoch = epoch
        self._flags.clear()
        self._interim = None

    @_handles("agent.handoff")
    def _on_handoff(self, data: dict[str, Any], seq: int) -> None:
        from_, to = data["from"], data["to"]
        instructions = data.get("instructions")
        self._begin(Handoff(seq, from_, to))
        self._switch_agent(to, instructions)

    @_handles("agent.instructions")
    def _on_instructions(self, data: dict[str, Any], seq: int) -> None:
        self._switch_agent(None, data["text"])

    @_handles("user.speech.started")
    def _on_speech_started(self, data: dict[str, Any], seq: int) -> None:
        self._flags.add("speaking")

    @_handles("user.speech.stopped")
    def _on_speech_stopped(self, data: dict[str, Any], seq: int) -> None:
        self._flags.discard("speaking")

    @_handles("user.transcript")
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

    @_handles("user.text")
    def _on_user_text(self, data: dict[str, Any], seq: int) -> None:
        self._user_content(data["text"], seq)

    @_handles("agent.reply.started")
    def _on_reply_started(self, data: dict[str, Any], seq: int) -> None:
        r = self._reply(data["reply"], seq)
        if not r.started:
            r.started = True
            self._refresh_reply(r)

    @_handles("agent.text")
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

    @_handles("agent.reply.done")
    def _on_reply_done(self, data: dict[str, Any], seq: int) -> None:
        r = self._replies.get(data["reply"])
        if r is not None and not r.done:
            r.done = True
            self._refresh_reply(r)

    @_handles("agent.speech.started")
    def _on_agent_speech_started(self, data: dict[str, Any], seq: int) -> None:
        r = self._replies.get(data["reply"])
        if r is not None:
            r.speech_started = True

    @_handles("agent.speech.progress")
    def _on_speech_progress(self, data: dict[str, Any], seq: int) -> None:
        heard = data["heard"]
        r = self._replies.get(data["reply"])
        if r is not None:
            r.heard = heard
            r.speech_started = True

    @_handles("agent.speech.ended")
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

    @_handles("interruption")
    def _on_interruption(self, data: dict[str, Any], seq: int) -> None:
        rid, heard = data.get("reply"), data.get("heard")
        self.counters["interruptions"] += 1
        if not self._interrupt(self._last_reply if rid is None else self._replies.get(rid), heard):
            self.counters["interruptions_ignored"] += 1

    @_handles("tool.call")
    def _on_tool_call(self, data: dict[str, Any], seq: int) -> None:
        """Rule 4: the call joins its reply (named, else the latest, else an anonymous one), and is
        excluded when that reply was interrupted already."""
        cid, name, arguments = data["call"], data["name"], arguments_text(data["arguments"])
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
        c = Call(cid, name, arguments, r, seq, not r.interrupted, self._ncalls)
        self._ncalls += 1
        self._calls[cid] = c
        r.calls.append(c)
        self._refresh_call(c)

    @_handles("tool.started")
    def _on_tool_started(self, data: dict[str, Any], seq: int) -> None:
        c = self._calls.get(data["call"])
        if c is not None:
            c.started = True
            self._ran(c)

    @_handles("tool.progress")
    def _on_tool_progress(self, data: dict[str, Any], seq: int) -> None:
        c = self._calls.get(data["call"])
        if c is not None:
            c.progress = data.get("state")
            c.has_progress = True

    @_handles("tool.result")
    def _on_tool_result(self, data: dict[str, Any], seq: int) -> None:
        c = self._calls.get(data["call"])
        if c is not None and not c.has_result:
            c.has_result = True
            c.output = data.get("output")
            c.error = bool(data.get("error"))
            self._ran(c)  # a result proves the call ran: the truth wins (rule 4)

    @_handles("tool.cancelled")
    def _on_tool_cancelled(self, data: dict[str, Any], seq: int) -> None:
        reason, outcome = str(data["reason"]), data.get("outcome")
        c = self._calls.get(data["call"])
        if c is not None and not c.has_result and c.cancel_reason is None:
            c.cancel_reason = reason
            c.cancel_outcome = outcome
            self._refresh_call(c)

    def adopt(self, other: ContextFold) -> None:
        """Takes ``other``'s whole state in place (``other`` must not be used after), so whoever
        holds this fold, such as an adapter's reply tracker, reads the new state. The live session
        uses it to drop a write the store refused: it refolds the log and adopts the result."""
        for name in ContextFold.__slots__:
            setattr(self, name, getattr(other, name))

    # -- snapshots (the codec is :mod:`calltape.projections.snapshot`) ----------------------

    def to_snapshot(self) -> bytes:
        """The fold state (but the seen ids, see the module docstring) as bytes.

        The settled items get frozen on the way (kept as rendered bytes, see
        :mod:`calltape.projections.snapshot`); nothing a caller can observe changes.
        """
        return _snapshot.encode(self)

    def capture(self) -> _snapshot.Captured:
        """The snapshot of this instant, encoded only when :meth:`Captured.to_bytes` is called."""
        return _snapshot.capture(self)

    @classmethod
    def from_snapshot(cls, blob: bytes) -> ContextFold:
        """Restores :meth:`to_snapshot` output; raises :class:`SnapshotMismatch` for another
        :data:`FOLD_VERSION` or damaged bytes."""
        f = cls()
        _snapshot.decode(f, blob)
        return f


def fold_events(events: Iterable[Event], session: str | None = None) -> ContextFold:
    """A fresh fold of ``events`` (the whole list: cut it to the instant first)."""
    f = ContextFold(session)
    f.apply_many(events)
    return f
