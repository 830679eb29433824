"""A call's ledger as OpenTelemetry traces (the ``otel`` extra): one trace per call, a span per turn,
reply, playout, tool call and effect, for the tracing tools voice teams already use (Langfuse, Arize
Phoenix, Grafana Tempo, Jaeger) over OTLP.

The tree, with the OpenTelemetry GenAI semantic conventions where they apply::

    invoke_agent {agent}          the call: gen_ai.operation.name=invoke_agent, gen_ai.agent.name,
    │                             gen_ai.conversation.id and session.id = the session id
    ├── turn                      a user turn and the agent's answer to it (calltape.turn.*)
    │   └── chat                  one reply (gen_ai.operation.name=chat): calltape.reply.interrupted,
    │       │                     calltape.interruption.cause, calltape.reply.text_chars,
    │       │                     calltape.reply.heard_chars; an ``interruption`` span event
    │       ├── agent.speech      its playout: calltape.speech.interrupted, calltape.speech.heard_chars
    │       └── execute_tool {name}   a tool call (gen_ai.tool.name, gen_ai.tool.call.id,
    │           │                     calltape.tool.outcome; status ERROR for an error result)
    │           └── effect {name}     a tool.effect (SPEC section 8): calltape.effect.phase
    └── session.dropped           from the drop to the resume (status ERROR)

Spans carry the events' own times (``at``), so a call re-emitted from the log next week has the same
shape and timing as it had live. Every span also has ``calltape.seq`` (the event that opened it), so a
tracing tool's span leads back to the log. What was said is never an attribute unless the operator opts
in (``content=True``): then the user's words of a turn, a reply's text and what was heard of it
(``calltape.reply.heard``), tool arguments and results (``gen_ai.tool.call.arguments``,
``gen_ai.tool.call.result``, and OpenInference's ``input.value``/``output.value``, which Phoenix and
Langfuse display) are added, after the redaction rules given (``redactor``) have run over them.

Two ways in: :func:`trace_recorder` follows a live process's recorder (the spans of each call as its
events commit), and :func:`trace_events` re-emits a stored call (``calltape export --otlp``).

What a span says is read from the call's read model, :class:`~calltape.projections.callrecord.CallRecord`
(the fold and the effect log underneath), folded one event at a time as the events come: which reply an
event belongs to and which reply a tool call joins (the fold's choice), whether an interruption cut its
reply, when a reply is over (no longer active: SPEC section 2), its text and what was heard of it, a
tool call's outcome (SPEC section 2 rule 5) and an effect's phase. The tracer adds only what is its own:
the turns, the span tree, and when a span ends in time (a parent waits for its children; a drop ends
when the call is heard from again, since a live process may not see a resume another writer made).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson

from calltape.events import Event
from calltape.extras import requires_extra
from calltape.projections.callrecord import Applied, CallRecord
from calltape.projections.effects import PHASES
from calltape.projections.records import ReplyState

if TYPE_CHECKING:
    from calltape.eventstore.recorder import Recorder
    from calltape.redaction import Redactor

SCOPE = "calltape"
"""The instrumentation scope (tracer name) of every span."""

_IDENTIFIER = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_MS = 1_000_000


def _word(value: Any) -> str | None:
    """A short identifier-like value (a drop's reason, a cancel's reason) as an attribute, else None:
    free text a writer put there is not copied into a trace without opt-in."""
    return value if isinstance(value, str) and _IDENTIFIER.fullmatch(value) else None


@dataclass(eq=False)
class _Node:
    """One span being built: it ends once its own ending came and its children have ended."""

    span: Any
    parent: _Node | None
    end_ms: int
    open_children: int = 0
    done: bool = False
    closed: bool = False


@dataclass(eq=False)
class _Reply:
    """The spans of one reply (its state is the fold's)."""

    rid: str
    node: _Node
    speech: _Node | None = None
    cause: str | None = None


@dataclass(eq=False)
class _Call:
    """One session's spans in the making, beside its read model."""

    record: CallRecord
    root: _Node
    session: str
    nodes: list[_Node] = field(default_factory=list)
    turn: _Node | None = None
    turn_answered: bool = False
    turn_words: list[str] = field(default_factory=list)
    turns: int = 0
    replies: dict[str, _Reply] = field(default_factory=dict)
    open_replies: dict[str, _Reply] = field(default_factory=dict)
    """The reply spans not yet done (a new generation ends those the playout never picked up)."""
    tools: dict[str, _Node] = field(default_factory=dict)
    """Call id -> its latest span (a call run again after it settled gets a new one)."""
    effects: dict[tuple[str, str], _Node] = field(default_factory=dict)
    drop: _Node | None = None
    last_seq: int = 0
    last_at: int = 0


class CallTracer:
    """Turns events into spans as they come, for several calls at once.

    ``tracer_provider`` defaults to the global one (configure it with your OTLP exporter); ``content``
    opts in to what was said (see the module's docstring); ``redactor`` runs over that content first.
    Events already seen (a seq not past the call's last, or an id the call's fold has) are ignored, so a
    redelivered batch adds no span.
    """

    def __init__(
        self,
        tracer_provider: Any = None,
        *,
        content: bool = False,
        redactor: Redactor | None = None,
        max_calls: int = 10_000,
    ) -> None:
        with requires_extra("otel", "traces"):
            from opentelemetry import trace
            from opentelemetry.context import Context
            from opentelemetry.trace import Status, StatusCode
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self._tracer = provider.get_tracer(SCOPE)
        self._trace = trace
        self._empty = Context
        self._status = (Status, StatusCode.ERROR)
        self.content = content
        self.redactor = redactor
        self._calls: OrderedDict[str, _Call] = OrderedDict()
        self._max_calls = max_calls
        self.spans = 0
        """Spans ended so far."""

    # -- spans ------------------------------------------------------------------------------

    def _error(self, message: str) -> Any:
        status, error = self._status
        return status(error, message)

    def _start(self, call: _Call | None, parent: _Node | None, name: str, event: Event, **attributes: Any) -> _Node:
        if parent is None:
            context = self._empty()  # a root: never the caller's current span
        else:
            context = self._trace.set_span_in_context(parent.span)
        session = call.session if call is not None else event.session
        attrs: dict[str, Any] = {"session.id": session, "calltape.seq": event.seq or 0}
        attrs.update({k.replace("__", "."): v for k, v in attributes.items() if v is not None})
        span = self._tracer.start_span(name, context=context, attributes=attrs, start_time=event.at_ms * _MS)
        live = parent if parent is not None and not parent.closed else None
        node = _Node(span, live, event.at_ms)
        if live is not None:
            live.open_children += 1
        if call is not None:
            call.nodes.append(node)
        return node

    def _finish(self, node: _Node, at: int) -> None:
        """The node's own ending came at ``at``: it ends now, or once its children have."""
        node.done = True
        node.end_ms = max(node.end_ms, at)
        self._close(node)

    def _close(self, node: _Node) -> None:
        while node.done and not node.closed and node.open_children == 0:
            node.closed = True
            node.span.end(end_time=node.end_ms * _MS)
            self.spans += 1
            parent = node.parent
            if parent is None:
                return
            parent.open_children -= 1
            parent.end_ms = max(parent.end_ms, node.end_ms)
            node = parent

    def _text(self, value: Any) -> str:
        text = value if isinstance(value, str) else orjson.dumps(value).decode()
        return self.redactor.text(text) if self.redactor is not None else text

    # -- events -----------------------------------------------------------------------------

    def __call__(self, events: Sequence[Event]) -> None:
        """Observes a batch of stored events (the recorder's ``on_commit`` hook)."""
        for event in events:
            self.observe(event)

    def observe(self, event: Event) -> None:
        """Observes one event of a call: folds it into the call's read model, then moves the spans."""
        kind = event.type
        if kind.startswith("x."):
            return
        call = self._calls.get(event.session)
        if call is not None and event.seq is not None and event.seq <= call.last_seq:
            return  # seen already
        if call is None:
            call = self._open(event)
        else:
            self._calls.move_to_end(event.session)
        applied = call.record.apply(event)
        if not applied.new:
            return  # an id the call has: it never happened twice
        if event.seq is not None:
            call.last_seq = event.seq
        call.last_at = max(call.last_at, event.at_ms)
        if call.drop is not None and not call.drop.done and kind not in ("session.dropped", "session.resumed"):
            self._finish(call.drop, event.at_ms)  # heard from again: a resume this process did not see
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, call, event, applied)
        if call.turn is not None and not call.turn.done:
            call.turn.end_ms = max(call.turn.end_ms, event.at_ms)

    def _open(self, event: Event) -> _Call:
        data = event.data if event.type == "session.started" else {}
        agent = data.get("agent") if isinstance(data.get("agent"), str) else event.agent
        root = self._start(
            None,
            None,
            f"invoke_agent {agent}" if agent else "invoke_agent",
            event,
            gen_ai__operation__name="invoke_agent",
            gen_ai__agent__name=agent,
            gen_ai__conversation__id=event.session,
            openinference__span__kind="AGENT",
            calltape__framework=_word(data.get("framework")),
            calltape__modality=_word(data.get("modality")) or ("voice" if data else None),
            calltape__call__partial=None if event.type == "session.started" else True,
        )
        call = _Call(CallRecord(event.session), root, event.session)
        call.nodes.append(root)
        self._calls[event.session] = call
        if len(self._calls) > self._max_calls:
            self._calls.popitem(last=False)  # the call heard from least recently; its spans stay open
        return call

    def finish(self, session: str | None = None) -> None:
        """Ends what is still open (of one call, or of every call) at its last event's time, marked
        ``calltape.unfinished``: a stored call that never ended, or a process shutting down."""
        for name in [session] if session is not None else list(self._calls):
            call = self._calls.pop(name, None)
            if call is not None:
                self._settle(call, call.last_at, unfinished=True)

    def _settle(self, call: _Call, at: int, *, unfinished: bool = False) -> None:
        """Ends every span of the call, children first (they were opened after their parents)."""
        for reply in call.open_replies.values():
            self._reply_attributes(call, reply)
        call.open_replies.clear()
        for node in reversed(call.nodes):
            if node.closed:
                continue
            end = node.end_ms
            if not node.done and (unfinished or node is not call.root):  # its ending never came
                node.span.set_attribute("calltape.unfinished", True)
                end = at
            self._finish(node, max(at, end) if node is call.root else end)

    # -- turns ------------------------------------------------------------------------------

    def _turn(self, call: _Call, event: Event, initiator: str) -> _Node:
        self._end_turn(call)
        call.turns += 1
        call.turn = self._start(
            call,
            call.root,
            "turn",
            event,
            calltape__turn__index=call.turns,
            calltape__turn__initiator=initiator,
            openinference__span__kind="CHAIN",
        )
        call.turn_answered = False
        call.turn_words = []
        return call.turn

    def _end_turn(self, call: _Call) -> None:
        turn = call.turn
        if turn is None or turn.done:
            return
        if self.content and call.turn_words:
            words = self._text(" ".join(call.turn_words))
            turn.span.set_attribute("calltape.turn.user_text", words)
            turn.span.set_attribute("input.value", words)
        self._finish(turn, turn.end_ms)  # it ends once its replies have

    # -- replies ----------------------------------------------------------------------------

    def _reply(self, call: _Call, rid: str, event: Event) -> _Reply:
        """The spans of a reply the fold knows (opened, with its turn, at its first event)."""
        reply = call.replies.get(rid)
        if reply is not None:
            return reply
        if call.turn is None or call.turn.done:
            self._turn(call, event, "agent")
        assert call.turn is not None
        call.turn_answered = True
        span = call.record.replies.get(rid)
        node = self._start(
            call,
            call.turn,
            "chat",
            event,
            gen_ai__operation__name="chat",
            gen_ai__agent__name=event.agent or call.record.fold.agent,
            calltape__reply__id=None if span is not None and span.anonymous else rid,
            openinference__span__kind="LLM",
        )
        reply = call.replies[rid] = call.open_replies[rid] = _Reply(rid, node)
        return reply

    def _reply_attributes(self, call: _Call, reply: _Reply) -> None:
        """The reply as the fold has it: its text (late tokens aside), interrupted, what was heard."""
        state = call.record.reply_state(reply.rid)
        if state is None:
            return
        span = reply.node.span
        span.set_attribute("calltape.reply.text_chars", len(state.generated))
        span.set_attribute("calltape.reply.interrupted", state.interrupted)
        if reply.cause is not None:
            span.set_attribute("calltape.interruption.cause", reply.cause)
        heard = _heard(state)
        if heard is not None:
            span.set_attribute("calltape.reply.heard_chars", len(heard))
        if self.content:
            if state.generated:
                said = self._text(state.generated)
                span.set_attribute("calltape.reply.text", said)
                span.set_attribute("output.value", said)
            if heard is not None:
                span.set_attribute("calltape.reply.heard", self._text(heard))

    def _end_reply(self, call: _Call, reply: _Reply, at: int) -> None:
        if reply.node.done:
            return
        self._reply_attributes(call, reply)
        call.open_replies.pop(reply.rid, None)
        self._finish(reply.node, at)

    def _maybe_end_reply(self, call: _Call, rid: str | None, at: int) -> None:
        """A reply is over once the fold says it is no longer active (SPEC section 2: generated, played
        out, its calls settled; or cut) and its playout span, if any, has ended."""
        reply = call.open_replies.get(rid) if rid is not None else None
        if reply is None or (reply.speech is not None and not reply.speech.done):
            return
        if not call.record.active(reply.rid):
            self._end_reply(call, reply, at)

    def _interrupt(self, call: _Call, reply: _Reply, event: Event) -> None:
        """The fold says this event cut the reply: an ``interruption`` span event at its time."""
        cause = _word(event.data.get("cause")) or ("playout" if event.type == "agent.speech.ended" else None)
        reply.cause = cause
        if reply.node.closed:
            return
        attributes: dict[str, Any] = {"calltape.seq": event.seq or 0}
        if cause is not None:
            attributes["calltape.interruption.cause"] = cause
        state = call.record.reply_state(reply.rid)
        if state is not None and state.reported_heard is not None:
            attributes["calltape.reply.heard_chars"] = len(state.reported_heard)
        reply.node.span.add_event("interruption", attributes, timestamp=event.at_ms * _MS)
        if reply.node.done:  # ended already (its playout never came), its children still open
            self._reply_attributes(call, reply)
        if call.turn is not None and not call.turn.closed:
            call.turn.span.set_attribute("calltape.turn.barge_in", True)

    # -- tools ------------------------------------------------------------------------------

    def _tool_span(self, call: _Call, cid: str, event: Event, *, retry: bool = False) -> _Node | None:
        """The call's span: opened under the reply the fold joined it to; a call already settled
        (cancelled at a drop, then run again after the resume) gets a new span beside the first."""
        span = call.record.calls.get(cid)
        if span is None:
            return None
        parent = self._reply(call, span.reply, event).node if span.reply is not None else call.root
        node = self._start(
            call,
            parent,
            f"execute_tool {span.name}",
            event,
            gen_ai__operation__name="execute_tool",
            gen_ai__tool__name=span.name,
            gen_ai__tool__call__id=cid,
            gen_ai__tool__type="function",
            openinference__span__kind="TOOL",
            calltape__tool__retry=True if retry else None,
        )
        call.tools[cid] = node
        return node

    def _running_tool(self, call: _Call, cid: str, event: Event) -> _Node | None:
        node = call.tools.get(cid)
        if node is None or not node.done:
            return node
        return self._tool_span(call, cid, event, retry=True)


_MAY_END_A_REPLY: Final = frozenset({"agent.reply.done", "agent.speech.ended"})
"""The reply events after which a reply may no longer be active (text and playout starts never end one)."""


def _heard(state: ReplyState) -> str | None:
    """What was heard of a reply, once anything says (a report, the playout's end, the cut): the fold's
    text of the reply (SPEC section 2 rule 3); None before."""
    if state.reported_heard is not None or state.speech_ended or state.interrupted:
        return state.heard
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _on_user(tracer: CallTracer, call: _Call, event: Event, applied: Applied) -> None:
    # The user speaking (or typing) after the agent answered opens the next turn; a transcript
    # belongs to the turn whose speech it transcribes, even when it lands after the answer began.
    opens = event.type != "user.transcript" and call.turn_answered
    if call.turn is None or call.turn.done or opens:
        tracer._turn(call, event, "user")
    assert call.turn is not None
    if event.type == "user.speech.started":
        call.turn.span.add_event("user.speech.started", timestamp=event.at_ms * _MS)
    elif tracer.content and call.record.last_user_seq == call.record.last_seq:  # a user turn (the record's)
        text = event.data.get("text")
        if isinstance(text, str):
            call.turn_words.append(text)


def _on_user_stopped(tracer: CallTracer, call: _Call, event: Event, applied: Applied) -> None:
    if call.turn is not None and not call.turn.closed:
        call.turn.span.add_event("user.speech.stopped", timestamp=event.at_ms * _MS)


def _on_reply_event(tracer: CallTracer, call: _Call, event: Event, applied: Applied) -> None:
    """Every ``agent.*`` event of a reply: the record names the reply (None: the fold ignored it)."""
    rid = applied.target
    if rid is None or rid not in call.record.replies:
        return
    kind = event.type
    if kind == "agent.reply.started":
        for other in list(call.open_replies.values()):  # a new generation: one the playout never took is over
            state = call.record.reply_state(other.rid) if other.speech is None and other.rid != rid else None
            if state is not None and state.done and not state.speech_started:
                tracer._end_reply(call, other, call.record.replies[other.rid].end_at_ms or other.node.end_ms)
    reply = tracer._reply(call, rid, event)
    node = reply.node
    if not node.done:
        node.end_ms = max(node.end_ms, event.at_ms)
    if kind in ("agent.speech.started", "agent.speech.progress"):
        if reply.speech is None and not node.done:
            reply.speech = tracer._start(call, node, "agent.speech", event)
    elif kind == "agent.speech.ended":
        speech = reply.speech
        if speech is not None and not speech.done:
            state = call.record.reply_state(rid)
            if state is not None:
                speech.span.set_attribute("calltape.speech.interrupted", state.interrupted)
                if state.reported_heard is not None:
                    speech.span.set_attribute("calltape.speech.heard_chars", len(state.reported_heard))
            tracer._finish(speech, event.at_ms)
    if applied.cut is not None:
        tracer._interrupt(call, reply, event)
    if kind in _MAY_END_A_REPLY:
        tracer._maybe_end_reply(call, rid, event.at_ms)


def _on_interruption(tracer: CallTracer, call: _Call, event: Event, applied: Applied) -> None:
    reply = call.replies.get(applied.target) if applied.target is not None else None
    if reply is None:
        return
    if applied.cut is not None:
        tracer._interrupt(call, reply, event)
    tracer._maybe_end_reply(call, reply.rid, event.at_ms)


def _on_tool_call(tracer: CallTracer, call: _Call, event: Event, applied: Applied) -> None:
    cid = _str(event.data.get("call"))
    if cid is None or cid in call.tools:
        return
    node = tracer._tool_span(call, cid, event)
    if node is not None and tracer.content:
        arguments = tracer._text(call.record.calls[cid].arguments or {})
        node.span.set_attribute("gen_ai.tool.call.arguments", arguments)
        node.span.set_attribute("input.value", arguments)


def _on_tool_started(tracer: CallTracer, call: _Call, event: Event, applied: Applied) -> None:
    cid = _str(event.data.get("call"))
    node = tracer._running_tool(call, cid, event) if cid is not None else None
    if node is not None:
        node.span.add_event("tool.started", {"calltape.seq": event.seq or 0}, timestamp=event.at_ms * _MS)


def _on_tool_settled(tracer: CallTracer, call: _Call, event: Event, applied: Applied) -> None:
    cid = _str(event.data.get("call"))
    node = call.tools.get(cid) if cid is not None else None
    if cid is None or node is None:
        return
    cancelled = event.type == "tool.cancelled"
    if node.done:
        if cancelled:
            return  # the call had settled: the fold ignores a cancel after a result or another cancel
        node = tracer._tool_span(call, cid, event, retry=True)
        if node is None:
            return
    state = call.record.fold.tool_call(cid)
    if state is None:
        return
    span = node.span
    span.set_attribute("calltape.tool.outcome", state.status)  # the call's one outcome (SPEC section 2 rule 5)
    if state.status == "error":
        span.set_status(tracer._error("the tool reported an error"))
    if cancelled:
        reason = _word(event.data.get("reason"))
        if reason is not None:
            span.set_attribute("calltape.tool.cancel_reason", reason)
    elif tracer.content:
        result = tracer._text(state.output)
        span.set_attribute("gen_ai.tool.call.result", result)
        span.set_attribute("output.value", result)
    tracer._finish(node, event.at_ms)
    tracer._maybe_end_reply(call, state.reply, event.at_ms)


def _on_effect(tracer: CallTracer, call: _Call, event: Event, applied: Applied) -> None:
    data = event.data
    name, key, phase = _str(data.get("name")), _str(data.get("key")), data.get("phase")
    effect = call.record.effects.get(name, key) if name is not None and key is not None else None
    if effect is None or name is None or key is None or phase not in PHASES:
        return  # the effect log ignored it
    node = call.effects.get((name, key))
    if node is None or node.done:
        cid = _str(data.get("call"))
        tool = call.tools.get(cid) if cid is not None else None
        parent = tool if tool is not None and not tool.closed else call.root
        node = tracer._start(
            call,
            parent,
            f"effect {name}",
            event,
            gen_ai__tool__name=name,
            gen_ai__tool__call__id=cid,
            calltape__effect__heard_first=data.get("heard") if isinstance(data.get("heard"), bool) else None,
            calltape__effect__key=tracer._text(key) if tracer.content else None,
            openinference__span__kind="TOOL",
        )
        call.effects[(name, key)] = node
    node.span.set_attribute("calltape.effect.phase", effect.phase or "?")
    if effect.phase != "started":
        if effect.phase != "done":
            node.span.set_status(tracer._error(f"the effect's outcome is {effect.phase}"))
        tracer._finish(node, event.at_ms)


def _on_dropped(tracer: CallTracer, call: _Call, event: Event, applied: Applied) -> None:
    tracer._end_turn(call)
    if call.drop is None or call.drop.done:
        call.drop = tracer._start(
            call, call.root, "session.dropped", event, calltape__drop__reason=_word(event.data.get("reason"))
        )
        call.drop.span.set_status(tracer._error("the call dropped"))


def _on_resumed(tracer: CallTracer, call: _Call, event: Event, applied: Applied) -> None:
    fold = call.record.fold  # the resume switched its agent and epoch
    attributes = {"calltape.seq": event.seq or 0, "gen_ai.agent.name": fold.agent or "?", "calltape.epoch": fold.epoch}
    call.root.span.add_event("session.resumed", attributes, timestamp=event.at_ms * _MS)
    if call.drop is not None and not call.drop.done:
        tracer._finish(call.drop, event.at_ms)


def _on_handoff(tracer: CallTracer, call: _Call, event: Event, applied: Applied) -> None:
    attributes: dict[str, Any] = {"calltape.seq": event.seq or 0}
    for side in ("from", "to"):
        value = event.data.get(side)
        if isinstance(value, str):
            attributes[f"calltape.handoff.{side}"] = value
    call.root.span.add_event("agent.handoff", attributes, timestamp=event.at_ms * _MS)


def _on_ended(tracer: CallTracer, call: _Call, event: Event, applied: Applied) -> None:
    reason = _word(event.data.get("reason"))
    if reason is not None:
        call.root.span.set_attribute("calltape.end_reason", reason)
    tracer._end_turn(call)
    tracer._calls.pop(call.session, None)
    tracer._settle(call, event.at_ms)


_HANDLERS: Final[dict[str, Callable[[CallTracer, _Call, Event, Applied], None]]] = {
    "session.ended": _on_ended,
    "session.dropped": _on_dropped,
    "session.resumed": _on_resumed,
    "agent.handoff": _on_handoff,
    "user.speech.started": _on_user,
    "user.speech.stopped": _on_user_stopped,
    "user.transcript": _on_user,
    "user.text": _on_user,
    "agent.reply.started": _on_reply_event,
    "agent.text": _on_reply_event,
    "agent.reply.done": _on_reply_event,
    "agent.speech.started": _on_reply_event,
    "agent.speech.progress": _on_reply_event,
    "agent.speech.ended": _on_reply_event,
    "interruption": _on_interruption,
    "tool.call": _on_tool_call,
    "tool.started": _on_tool_started,
    "tool.result": _on_tool_settled,
    "tool.cancelled": _on_tool_settled,
    "tool.effect": _on_effect,
}
"""Event type -> what it does to the spans (after the record folded it)."""


def trace_events(
    events: Iterable[Event],
    tracer_provider: Any = None,
    *,
    content: bool = False,
    redactor: Redactor | None = None,
) -> int:
    """Emits a stored call's spans (the events of one or more sessions, in log order); a call that
    never ended is closed at its last event. Returns the number of spans."""
    tracer = CallTracer(tracer_provider, content=content, redactor=redactor)
    for event in events:
        tracer.observe(event)
    tracer.finish()
    return tracer.spans


def trace_recorder(
    recorder: Recorder,
    tracer_provider: Any = None,
    *,
    content: bool = False,
    redactor: Redactor | None = None,
) -> CallTracer:
    """Emits the spans of the calls ``recorder`` writes, live, as their events commit (a call's span
    ends with its ``session.ended``; :meth:`CallTracer.finish` ends what is open at shutdown)."""
    tracer = CallTracer(tracer_provider, content=content, redactor=redactor)
    recorder.on_commit.append(tracer)
    return tracer
