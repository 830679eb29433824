"""One reply tracker for every adapter: which reply is current, and what of it was already recorded.

Every adapter turns a platform's stream into the same reply lifecycle (``agent.reply.started``,
``agent.text``, ``agent.reply.done``, ``agent.speech.started`` / ``progress`` / ``ended``,
``interruption``). Whether a reply is still generating, was interrupted, started playing, or what the
user heard of it is already known to the call's live fold (:class:`calltape.projections.ContextFold`,
the same fold a replay runs), so the tracker keeps none of it: it *reads* the fold, and *writes* each
lifecycle fact at most once. An adapter rebuilt after a restart therefore only needs the fold of the
log (:func:`calltape.projections.fold_events` or :func:`calltape.projections.build_context`), never a
hand-written second fold.

What stays in an adapter is what only its platform knows (Realtime's audio byte counts, Retell's
``response_id`` numbers, Pipecat's frame ids): map those to reply ids and let the tracker do the rest.

Using it::

    replies = ReplyTracker(call)          # call: a LiveCall, e.g. a CallSession (its live fold is used)
    rid = replies.begin()                 # agent.reply.started, a new id (or begin("resp_1"))
    replies.text(rid, "Let me check")     # agent.text (dropped once the reply is interrupted)
    replies.done(rid)                     # agent.reply.done, once
    replies.speech_started(rid)           # agent.speech.started, once, never after an interruption
    replies.heard(rid, "Let me")          # agent.speech.progress when the heard text changed
    replies.interrupt(rid, heard="Let me")  # interruption, unless the fold already has the reply interrupted
    replies.speech_ended(rid, interrupted=True)  # agent.speech.ended, once
    replies.state(rid)                    # a ReplyState read from the fold (None: unknown reply)

Hold-back: :meth:`ReplyTracker.hold` buffers the events emitted through the tracker (an adapter
waiting for a late user transcript that must precede the reply, as the Realtime tap does) while the
queries keep answering as if they were written: they read a scratch copy of the live fold with the
held events folded in. :meth:`ReplyTracker.emit` with ``jump=True`` writes past the buffer at once.
:meth:`ReplyTracker.release` writes the buffer in order.

A call without a fold (a bare :class:`~calltape.runtime.EventSink`: any object with
``emit(type, data) -> Event``, e.g. a test sink) is folded by the tracker itself, from the events
``emit`` returns. A :class:`~calltape.runtime.FoldedSink` (a live call, or an :class:`EventCollector`)
lends the tracker its own fold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calltape.events import Event, make_event, new_event_id
from calltape.projections import ContextFold, ReplyState
from calltape.runtime.protocol import EventSink, FoldedSink

# EventSink is re-exported from here (its first home) for code that imported it from the adapters.
__all__ = ["EventCollector", "EventSink", "ReplyTracker"]


class EventCollector:
    """A :class:`~calltape.runtime.FoldedSink` for webhook ingest: events with stable ids, folded, kept
    in :attr:`events`.

    Ids are ``{prefix}{n}`` (n counts from 1 since the last :meth:`reset`), so a redelivered payload
    mapped the same way yields the same ids and appends nothing. ``at_ms`` and ``agent`` apply to the
    events made from then on."""

    def __init__(self, session: str, fold: ContextFold | None = None, *, prefix: str = "", agent: str | None = None):
        self.session = session
        self.fold = fold if fold is not None else ContextFold(session)
        self.prefix = prefix
        self.agent = agent
        self.at_ms: int | None = None
        self.events: list[Event] = []

    def reset(self, prefix: str, at_ms: int | None = None) -> None:
        """Starts a new batch (one webhook): a new id prefix, numbering from 1, an empty list."""
        self.prefix, self.at_ms, self.events = prefix, at_ms, []

    def emit(self, type: str, data: Mapping[str, Any]) -> Event:
        """Makes the next event of the batch (id ``{prefix}{n}``), folds it and keeps it for the append."""
        event = make_event(
            self.session, type, data, id=f"{self.prefix}{len(self.events) + 1}", at_ms=self.at_ms, agent=self.agent
        )
        self.events.append(event)
        self.fold.apply(event)
        return event


class ReplyTracker:
    """Reply lifecycle of one call, read from its live fold and written once per fact.

    ``call``: where events go (an :class:`~calltape.runtime.EventSink`, normally the
    :class:`~calltape.runtime.LiveCall`). ``fold``: the live fold to read; by default ``call.fold``
    when the call is a :class:`~calltape.runtime.FoldedSink` (a live call folds what it emits), else a
    fold the tracker keeps from what ``emit`` returns.
    """

    def __init__(self, call: EventSink, *, fold: ContextFold | None = None) -> None:
        self.call = call
        live = fold if fold is not None else call.fold if isinstance(call, FoldedSink) else None
        self._own_fold = live is None
        self.fold: ContextFold = live if live is not None else ContextFold()
        self._held: list[tuple[str, dict[str, Any]]] | None = None
        self._scratch: ContextFold | None = None

    # -- writing ------------------------------------------------------------------------------

    def emit(self, type: str, data: Mapping[str, Any], *, jump: bool = False) -> None:
        """Writes one event (any type) through the tracker: buffered while holding unless ``jump``."""
        if self._held is not None and not jump:
            self._held.append((type, dict(data)))
            if self._scratch is not None:
                self._scratch.apply(make_event(self.fold.session or "held", type, data))
            return
        event = self.call.emit(type, data)
        if self._own_fold:
            self.fold.apply(event)
        self._scratch = None  # rebuilt on the next query: the jumped event goes before the held ones

    def begin(self, reply: str | None = None) -> str:
        """Starts a reply (``agent.reply.started``) unless ``reply`` is known; returns its id.

        Without an id a fresh one is made. The new reply becomes :attr:`current`."""
        rid = reply if reply is not None else new_event_id()
        if self.state(rid) is None:
            self.emit("agent.reply.started", {"reply": rid})
        return rid

    def text(self, reply: str, delta: str) -> bool:
        """Records generated text; False (nothing written) when empty or the reply was interrupted."""
        st = self.state(reply)
        if not delta or (st is not None and st.interrupted):
            return False
        self.emit("agent.text", {"reply": reply, "text": delta})
        return True

    def done(self, reply: str) -> bool:
        """``agent.reply.done`` once per reply; False when already recorded or the reply is unknown."""
        st = self.state(reply)
        if st is None or st.done:
            return False
        self.emit("agent.reply.done", {"reply": reply})
        return True

    def speech_started(self, reply: str) -> bool:
        """``agent.speech.started`` once, never for an interrupted or unknown reply."""
        st = self.state(reply)
        if st is None or st.speech_started or st.interrupted:
            return False
        self.emit("agent.speech.started", {"reply": reply})
        return True

    def heard(self, reply: str, heard: str) -> bool:
        """``agent.speech.progress`` when ``heard`` differs from the heard text last reported."""
        st = self.state(reply)
        if st is None or st.reported_heard == heard:
            return False
        self.emit("agent.speech.progress", {"reply": reply, "heard": heard})
        return True

    def speech_ended(self, reply: str, *, interrupted: bool = False, heard: str | None = None) -> bool:
        """``agent.speech.ended`` once per reply (a second report of the same playout writes nothing)."""
        st = self.state(reply)
        if st is None or st.speech_ended:
            return False
        self._emit_heard("agent.speech.ended", {"reply": reply, "interrupted": interrupted}, heard)
        return True

    def interrupt(self, reply: str | None = None, *, cause: str = "user_speech", heard: str | None = None) -> bool:
        """``interruption`` of ``reply`` (default: the latest) unless the fold has it interrupted already.

        The fold decides whether it applies (SPEC rule: only an active reply is cut); its ``heard``
        applies either way."""
        rid = reply if reply is not None else self.current
        st = None if rid is None else self.state(rid)
        if rid is None or st is None or st.interrupted:
            return False
        self._emit_heard("interruption", {"reply": rid, "cause": cause}, heard)
        return True

    def _emit_heard(self, type: str, data: dict[str, Any], heard: str | None) -> None:
        self.emit(type, data if heard is None else {**data, "heard": heard})

    # -- hold-back ------------------------------------------------------------------------------

    @property
    def holding(self) -> bool:
        """Whether writes are being held back until :meth:`release` (see :meth:`hold`)."""
        return self._held is not None

    def hold(self) -> None:
        """Buffers further writes (but ``jump`` ones) until :meth:`release`; queries still see them."""
        if self._held is None:
            self._held = []
            self._scratch = None

    def release(self) -> None:
        """Writes the buffered events, in order, and stops holding."""
        held, self._held, self._scratch = self._held, None, None
        for type, data in held or ():
            self.emit(type, data)

    # -- reading --------------------------------------------------------------------------------

    def view(self) -> ContextFold:
        """The fold the queries read: the live fold, plus what is held back (a scratch copy)."""
        if not self._held:
            return self.fold
        if self._scratch is None:
            scratch = ContextFold.from_snapshot(self.fold.to_snapshot())
            for type, data in self._held:
                scratch.apply(make_event(self.fold.session or "held", type, data))
            self._scratch = scratch
        return self._scratch

    def state(self, reply: str) -> ReplyState | None:
        """The reply as folded (held events included); None when it never began."""
        return self.view().reply_state(reply)

    @property
    def current(self) -> str | None:
        """The latest reply (the one an ``interruption`` without ``reply`` targets)."""
        return self.view().latest_reply()

    def count(self) -> int:
        """How many replies the call has (anonymous ones included)."""
        return len(self.view().replies())

    def active(self, reply: str) -> bool:
        """Whether an interruption would cut it now: the fold's test (still generating, its playout
        unfinished, or an included call of it still running), held events included."""
        return self.view().reply_active(reply)

    def finished(self, reply: str) -> bool:
        """Nothing more will happen to it: interrupted, or its playout ended, or done with nothing to play."""
        st = self.state(reply)
        return st is not None and (
            st.interrupted or st.speech_ended or (st.done and not st.awaiting_playout and not st.speech_started)
        )

    def user_spoke_since(self, reply: str | None) -> bool:
        """User content (a final transcript or typed text) was folded after ``reply`` began: the next
        agent output answers it, so it belongs to a new reply. VAD edges and interims do not count:
        the user may be coughing. ``reply`` None: whether the user said anything at all."""
        view = self.view()
        user = view.user_turn_seq
        if reply is None:
            return user is not None
        st = view.reply_state(reply)
        return st is None or (user is not None and user > st.seq)
