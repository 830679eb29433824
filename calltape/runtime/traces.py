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
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from calltape.events import Event
from calltape.extras import requires_extra

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


@dataclass
class _Reply:
    node: _Node
    text_chars: int = 0
    text: list[str] = field(default_factory=list)
    heard: str | None = None
    generated: bool = False
    interrupted: bool = False
    cause: str | None = None
    speech: _Node | None = None
    spoken: bool = False


@dataclass
class _Tool:
    node: _Node
    name: str
    reply: _Reply | None


@dataclass
class _Call:
    """One session's spans in the making."""

    root: _Node
    session: str
    agent: str | None
    voice: bool = True
    nodes: list[_Node] = field(default_factory=list)
    turn: _Node | None = None
    turn_answered: bool = False
    turn_words: list[str] = field(default_factory=list)
    turns: int = 0
    replies: dict[str, _Reply] = field(default_factory=dict)
    latest: _Reply | None = None
    tools: dict[str, _Tool] = field(default_factory=dict)
    effects: dict[tuple[str, str], _Node] = field(default_factory=dict)
    drop: _Node | None = None
    last_seq: int = 0
    last_at: int = 0


class CallTracer:
    """Turns events into spans as they come, for several calls at once.

    ``tracer_provider`` defaults to the global one (configure it with your OTLP exporter); ``content``
    opts in to what was said (see the module's docstring); ``redactor`` runs over that content first.
    Events already seen (a seq not past the call's last) are ignored, so a redelivered batch adds no span.
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
        """Observes one event of a call."""
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
        if event.seq is not None:
            call.last_seq = event.seq
        call.last_at = max(call.last_at, event.at_ms)
        if call.drop is not None and not call.drop.done and kind not in ("session.dropped", "session.resumed"):
            self._finish(call.drop, event.at_ms)  # heard from again: a resume this process did not see
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, call, event)
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
        call = _Call(root, event.session, agent, voice=data.get("modality", "voice") == "voice")
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
        for reply in call.replies.values():
            if not reply.node.done:
                self._reply_attributes(reply)
        for node in reversed(call.nodes):
            if node.closed:
                continue
            end = node.end_ms
            if not node.done and (unfinished or node is not call.root):  # its ending never came
                node.span.set_attribute("calltape.unfinished", True)
                end = at
            self._finish(node, max(at, end) if node is call.root else end)

    # -- turns and replies ------------------------------------------------------------------

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

    def _user(self, call: _Call, event: Event) -> None:
        # The user speaking (or typing) after the agent answered opens the next turn; a transcript
        # belongs to the turn whose speech it transcribes, even when it lands after the answer began.
        opens = event.type != "user.transcript" and call.turn_answered
        if call.turn is None or call.turn.done or opens:
            self._turn(call, event, "user")
        assert call.turn is not None
        if event.type == "user.speech.started":
            call.turn.span.add_event("user.speech.started", timestamp=event.at_ms * _MS)
        elif event.type in ("user.text", "user.transcript"):
            final = event.type == "user.text" or event.data.get("final") is True
            text = event.data.get("text")
            if final and isinstance(text, str):
                call.turn_words.append(text)

    def _reply(self, call: _Call, rid: str | None, event: Event) -> _Reply:
        if rid is not None and rid in call.replies:
            return call.replies[rid]
        if rid is None and call.latest is not None and not call.latest.node.done:
            return call.latest
        if call.turn is None or call.turn.done:
            self._turn(call, event, "agent")
        assert call.turn is not None
        call.turn_answered = True
        node = self._start(
            call,
            call.turn,
            "chat",
            event,
            gen_ai__operation__name="chat",
            gen_ai__agent__name=event.agent or call.agent,
            calltape__reply__id=rid,
            openinference__span__kind="LLM",
        )
        reply = _Reply(node)
        call.replies[rid if rid is not None else f"#{event.seq or id(node)}"] = reply
        call.latest = reply
        return reply

    def _reply_attributes(self, reply: _Reply) -> None:
        span = reply.node.span
        span.set_attribute("calltape.reply.text_chars", reply.text_chars)
        span.set_attribute("calltape.reply.interrupted", reply.interrupted)
        if reply.cause is not None:
            span.set_attribute("calltape.interruption.cause", reply.cause)
        heard = reply.heard if reply.heard is not None else ("".join(reply.text) if reply.spoken else None)
        if heard is not None or reply.interrupted:
            span.set_attribute("calltape.reply.heard_chars", len(heard or ""))
        if self.content:
            if reply.text:
                said = self._text("".join(reply.text))
                span.set_attribute("calltape.reply.text", said)
                span.set_attribute("output.value", said)
            if heard is not None:
                span.set_attribute("calltape.reply.heard", self._text(heard))

    def _end_reply(self, reply: _Reply, at: int) -> None:
        if reply.node.done:
            return
        self._reply_attributes(reply)
        self._finish(reply.node, at)

    def _maybe_end_reply(self, call: _Call, reply: _Reply, at: int) -> None:
        """A reply is over once it is generated (or cut) and its playout, if any is due, has ended."""
        if reply.speech is not None and not reply.speech.done:
            return
        if reply.interrupted or (reply.generated and (reply.spoken or not call.voice or not reply.text_chars)):
            self._end_reply(reply, at)

    def _interrupt(self, call: _Call, reply: _Reply, event: Event) -> None:
        if reply.node.done:
            return
        heard = event.data.get("heard")
        if isinstance(heard, str):
            reply.heard = heard
        if reply.interrupted:
            return  # the playout's end of an interruption already recorded
        reply.interrupted = True
        cause = _word(event.data.get("cause")) or ("playout" if event.type == "agent.speech.ended" else None)
        reply.cause = cause
        attributes: dict[str, Any] = {"calltape.seq": event.seq or 0}
        if cause is not None:
            attributes["calltape.interruption.cause"] = cause
        if isinstance(heard, str):
            attributes["calltape.reply.heard_chars"] = len(heard)
        reply.node.span.add_event("interruption", attributes, timestamp=event.at_ms * _MS)
        if call.turn is not None and not call.turn.closed:
            call.turn.span.set_attribute("calltape.turn.barge_in", True)


def _on_started(tracer: CallTracer, call: _Call, event: Event) -> None:
    pass  # the root span opened with the call


def _on_user(tracer: CallTracer, call: _Call, event: Event) -> None:
    tracer._user(call, event)


def _on_user_stopped(tracer: CallTracer, call: _Call, event: Event) -> None:
    if call.turn is not None and not call.turn.closed:
        call.turn.span.add_event("user.speech.stopped", timestamp=event.at_ms * _MS)


def _rid(event: Event) -> str | None:
    rid = event.data.get("reply")
    return rid if isinstance(rid, str) else None


def _on_reply_started(tracer: CallTracer, call: _Call, event: Event) -> None:
    for other in list(call.replies.values()):  # a new generation: an earlier one not playing is over
        if not other.node.done and other.speech is None and other.generated:
            tracer._end_reply(other, other.node.end_ms)
    tracer._reply(call, _rid(event), event)


def _on_text(tracer: CallTracer, call: _Call, event: Event) -> None:
    reply = tracer._reply(call, _rid(event), event)
    text = event.data.get("text")
    if isinstance(text, str) and not reply.node.done:
        reply.text_chars += len(text)
        reply.text.append(text)
        reply.node.end_ms = max(reply.node.end_ms, event.at_ms)


def _on_reply_done(tracer: CallTracer, call: _Call, event: Event) -> None:
    reply = tracer._reply(call, _rid(event), event)
    reply.generated = True
    reply.node.end_ms = max(reply.node.end_ms, event.at_ms)
    tracer._maybe_end_reply(call, reply, event.at_ms)


def _on_speech_started(tracer: CallTracer, call: _Call, event: Event) -> None:
    reply = tracer._reply(call, _rid(event), event)
    if reply.speech is None and not reply.node.done:
        reply.speech = tracer._start(call, reply.node, "agent.speech", event)


def _on_progress(tracer: CallTracer, call: _Call, event: Event) -> None:
    reply = tracer._reply(call, _rid(event), event)
    heard = event.data.get("heard")
    if isinstance(heard, str):
        reply.heard = heard


def _on_speech_ended(tracer: CallTracer, call: _Call, event: Event) -> None:
    reply = tracer._reply(call, _rid(event), event)
    heard = event.data.get("heard")
    if isinstance(heard, str):
        reply.heard = heard
    if event.data.get("interrupted") is True:
        tracer._interrupt(call, reply, event)
    reply.spoken = True
    speech = reply.speech
    if speech is not None and not speech.done:
        interrupted = event.data.get("interrupted") is True
        speech.span.set_attribute("calltape.speech.interrupted", interrupted)
        if reply.heard is not None:
            speech.span.set_attribute("calltape.speech.heard_chars", len(reply.heard))
        tracer._finish(speech, event.at_ms)
    tracer._maybe_end_reply(call, reply, event.at_ms)


def _on_interruption(tracer: CallTracer, call: _Call, event: Event) -> None:
    rid = _rid(event)
    reply = call.replies.get(rid) if rid is not None else call.latest
    if reply is not None:
        tracer._interrupt(call, reply, event)
        tracer._maybe_end_reply(call, reply, event.at_ms)


def _on_tool_call(tracer: CallTracer, call: _Call, event: Event) -> None:
    cid, name = event.data.get("call"), event.data.get("name")
    if not isinstance(cid, str) or cid in call.tools:
        return
    reply = tracer._reply(call, _rid(event), event)
    tool_name = name if isinstance(name, str) else "?"
    node = tracer._start(
        call,
        reply.node,
        f"execute_tool {tool_name}",
        event,
        gen_ai__operation__name="execute_tool",
        gen_ai__tool__name=tool_name,
        gen_ai__tool__call__id=cid,
        gen_ai__tool__type="function",
        openinference__span__kind="TOOL",
    )
    if tracer.content:
        arguments = tracer._text(event.data.get("arguments", {}))
        node.span.set_attribute("gen_ai.tool.call.arguments", arguments)
        node.span.set_attribute("input.value", arguments)
    call.tools[cid] = _Tool(node, tool_name, reply)


def _tool(tracer: CallTracer, call: _Call, event: Event) -> _Tool | None:
    """The call's open span; a call already settled (cancelled at a drop, then run again after the
    resume) gets a new span beside the first, marked as a retry."""
    cid = event.data.get("call")
    tool = call.tools.get(cid) if isinstance(cid, str) else None
    if tool is None or not tool.node.done:
        return tool
    parent = tool.reply.node if tool.reply is not None else call.root
    node = tracer._start(
        call,
        parent,
        f"execute_tool {tool.name}",
        event,
        gen_ai__operation__name="execute_tool",
        gen_ai__tool__name=tool.name,
        gen_ai__tool__call__id=cid,
        gen_ai__tool__type="function",
        openinference__span__kind="TOOL",
        calltape__tool__retry=True,
    )
    tool = call.tools[str(cid)] = _Tool(node, tool.name, tool.reply)
    return tool


def _on_tool_started(tracer: CallTracer, call: _Call, event: Event) -> None:
    tool = _tool(tracer, call, event)
    if tool is not None:
        tool.node.span.add_event("tool.started", {"calltape.seq": event.seq or 0}, timestamp=event.at_ms * _MS)


def _on_tool_settled(tracer: CallTracer, call: _Call, event: Event) -> None:
    tool = _tool(tracer, call, event)
    if tool is None:
        return
    span = tool.node.span
    if event.type == "tool.result":
        error = event.data.get("error") is True
        span.set_attribute("calltape.tool.outcome", "error" if error else "completed")
        if error:
            span.set_status(tracer._error("the tool reported an error"))
        if tracer.content:
            result = tracer._text(event.data.get("output"))
            span.set_attribute("gen_ai.tool.call.result", result)
            span.set_attribute("output.value", result)
    else:
        reason = _word(event.data.get("reason"))
        unknown = event.data.get("outcome") == "unknown"
        outcome = "timeout" if reason == "timeout" else ("unknown" if unknown else "cancelled")
        span.set_attribute("calltape.tool.outcome", outcome)
        if reason is not None:
            span.set_attribute("calltape.tool.cancel_reason", reason)
    tracer._finish(tool.node, event.at_ms)


def _on_effect(tracer: CallTracer, call: _Call, event: Event) -> None:
    data = event.data
    name, key, phase = data.get("name"), data.get("key"), data.get("phase")
    if not isinstance(name, str) or not isinstance(key, str):
        return
    node = call.effects.get((name, key))
    if node is None or node.done:
        cid = data.get("call")
        tool = call.tools.get(cid) if isinstance(cid, str) else None
        parent = tool.node if tool is not None and not tool.node.closed else call.root
        node = tracer._start(
            call,
            parent,
            f"effect {name}",
            event,
            gen_ai__tool__name=name,
            gen_ai__tool__call__id=cid if isinstance(cid, str) else None,
            calltape__effect__heard_first=data.get("heard") if isinstance(data.get("heard"), bool) else None,
            calltape__effect__key=tracer._text(key) if tracer.content else None,
            openinference__span__kind="TOOL",
        )
        call.effects[(name, key)] = node
    node.span.set_attribute("calltape.effect.phase", phase if isinstance(phase, str) else "?")
    if phase in ("done", "failed", "unknown"):
        if phase != "done":
            node.span.set_status(tracer._error(f"the effect's outcome is {phase}"))
        tracer._finish(node, event.at_ms)


def _on_dropped(tracer: CallTracer, call: _Call, event: Event) -> None:
    tracer._end_turn(call)
    if call.drop is None or call.drop.done:
        call.drop = tracer._start(
            call, call.root, "session.dropped", event, calltape__drop__reason=_word(event.data.get("reason"))
        )
        call.drop.span.set_status(tracer._error("the call dropped"))


def _on_resumed(tracer: CallTracer, call: _Call, event: Event) -> None:
    agent = event.data.get("agent")
    attributes = {
        "calltape.seq": event.seq or 0,
        "gen_ai.agent.name": agent if isinstance(agent, str) else "?",
        "calltape.epoch": event.data.get("epoch") if isinstance(event.data.get("epoch"), int) else 0,
    }
    call.root.span.add_event("session.resumed", attributes, timestamp=event.at_ms * _MS)
    if call.drop is not None and not call.drop.done:
        tracer._finish(call.drop, event.at_ms)


def _on_handoff(tracer: CallTracer, call: _Call, event: Event) -> None:
    attributes: dict[str, Any] = {"calltape.seq": event.seq or 0}
    for side in ("from", "to"):
        value = event.data.get(side)
        if isinstance(value, str):
            attributes[f"calltape.handoff.{side}"] = value
    call.root.span.add_event("agent.handoff", attributes, timestamp=event.at_ms * _MS)


def _on_ended(tracer: CallTracer, call: _Call, event: Event) -> None:
    reason = _word(event.data.get("reason"))
    if reason is not None:
        call.root.span.set_attribute("calltape.end_reason", reason)
    tracer._end_turn(call)
    tracer._calls.pop(call.session, None)
    tracer._settle(call, event.at_ms)


_HANDLERS = {
    "session.started": _on_started,
    "session.ended": _on_ended,
    "session.dropped": _on_dropped,
    "session.resumed": _on_resumed,
    "agent.handoff": _on_handoff,
    "user.speech.started": _on_user,
    "user.speech.stopped": _on_user_stopped,
    "user.transcript": _on_user,
    "user.text": _on_user,
    "agent.reply.started": _on_reply_started,
    "agent.text": _on_text,
    "agent.reply.done": _on_reply_done,
    "agent.speech.started": _on_speech_started,
    "agent.speech.progress": _on_progress,
    "agent.speech.ended": _on_speech_ended,
    "interruption": _on_interruption,
    "tool.call": _on_tool_call,
    "tool.started": _on_tool_started,
    "tool.result": _on_tool_settled,
    "tool.cancelled": _on_tool_settled,
    "tool.effect": _on_effect,
}


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
