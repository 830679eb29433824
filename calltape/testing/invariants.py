"""Invariants of a recorded call: the rules of `calltape check` plus the context's own (SPEC 2, 7).

``assert_invariants`` runs the very rules of ``calltape check`` (SPEC section 7) plus the section 2
invariants of the context (every included call has exactly one output right after its assistant
message; the OpenAI, Anthropic and Realtime formats are requests those APIs accept), at the end of
the call and at every instant an LLM read the context (each reply's start). On failure it raises
``AssertionError`` listing every violation, and prints the call's timeline on stderr.

The pytest plugin (:mod:`calltape.testing.plugin`) adds the ``calltape_store`` fixture.
"""

from __future__ import annotations

import sys
from collections.abc import Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, overload

from calltape.checks import CheckOptions, Violation, check_events, to_events
from calltape.checks.context import context_problems
from calltape.events import Event
from calltape.projections.fold import ContextFold

if TYPE_CHECKING:
    from calltape.eventstore import EventStore

__all__ = ["assert_invariants", "context_violations", "invariant_violations", "timeline_text"]

_CONTEXT_INSTANTS = frozenset({"agent.reply.started"})


def context_violations(events: list[Event]) -> list[Violation]:
    """The section 2 invariants (rule id ``context``) of one session's contexts: at every reply start
    (what the LLM was sent) and after the last event."""
    fold = ContextFold()
    found: list[Violation] = []
    reported: set[str] = set()

    def check(seq: int) -> None:
        for problem in context_problems(fold.native()):
            if problem not in reported:
                reported.add(problem)
                found.append(Violation(fold.session or "", seq, "context", problem))

    for event in events:
        if event.type in _CONTEXT_INSTANTS:
            check(fold.seq)  # the context the new reply was generated from
        fold.apply(event)
    check(fold.seq)
    return found


def _sessions(events: list[Event], session: str | None) -> dict[str, list[Event]]:
    groups: dict[str, list[Event]] = {}
    for event in events:
        if session is None or event.session == session:
            groups.setdefault(event.session, []).append(event)
    return groups


def invariant_violations(
    events: Iterable[Event | Mapping[str, Any]], session: str | None = None, options: CheckOptions | None = None
) -> list[Violation]:
    """Every violation ``assert_invariants`` would report (an empty list when the call is sound)."""
    found: list[Violation] = []
    for name, group in _sessions(to_events(events), session).items():
        found += check_events(group, options, session=name)
        found += context_violations(group)
    found.sort(key=lambda v: (v.session, v.seq))
    return found


def timeline_text(events: list[Event], width: int = 140, *, around: int | None = None, radius: int = 6) -> str:
    """A session's timeline as ``calltape show`` prints it, as plain text (for failure messages).

    With ``around``, only the events within ``radius`` seqs of that seq, one line each (``calltape show
    --verbose``), that seq's line marked ``▶``: the instant a rule names, in its surroundings."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from calltape.cli.common import offset
    from calltape.cli.timeline import build_timeline

    tl = build_timeline(events, verbose=around is not None)
    rows = tl.rows
    if around is not None:
        rows = [r for r in rows if abs(r.seq - around) <= radius]
        if not any(r.seq == around for r in rows):
            # an event ``show`` folds into another line (a reply's start): name it on its own line
            from calltape.cli.timeline import Row

            event = next((e for e in events if e.seq == around), None)
            if event is not None:
                rows.append(Row(around, event.at_ms, "agent", event.type).add(event.type))
                rows.sort(key=lambda r: r.seq)
    table = Table(box=None, header_style="bold", pad_edge=False, expand=False)
    if around is not None:
        table.add_column("")
    table.add_column("#", justify="right")
    table.add_column("time", justify="right")
    for name in ("user", "agent", "✓"):
        table.add_column(name)
    for r in rows:
        text = Text("".join(segment for segment, _ in r.segments))
        user, agent = (text, Text()) if r.lane == "user" else (Text(), text)
        cells: list[Any] = [str(r.seq), offset(r.at_ms - tl.first_at), user, agent, "✓" if r.clean else ""]
        if around is not None:
            cells.insert(0, "▶" if r.seq == around else "")
        table.add_row(*cells)
    buffer = StringIO()
    Console(file=buffer, width=width, color_system=None, force_terminal=False).print(table)
    return buffer.getvalue()


def _failure(violations: list[Violation], events: list[Event]) -> AssertionError:
    """The error names rules, seqs, calls and replies only; the timeline (which shows the call's
    words and tool outputs) goes to stderr, where pytest shows it under the failing test."""
    lines = [f"{len(violations)} invariant violation{'s' if len(violations) != 1 else ''}:"]
    lines += [f"  {v}" for v in violations]
    for name, group in _sessions(events, None).items():
        if any(v.session == name for v in violations):
            try:
                text = timeline_text(group)
            except Exception as exc:  # the timeline is a courtesy: never hide the violations
                text = f"(timeline unavailable: {type(exc).__name__})\n"
            sys.stderr.write(f"calltape: timeline of {name} (first violation at seq {_first(violations, name)}):\n")
            sys.stderr.write(text)
    return AssertionError("\n".join(lines))


def _first(violations: list[Violation], session: str) -> int:
    return min(v.seq for v in violations if v.session == session)


def _assert_events(events: list[Event], session: str | None, options: CheckOptions | None) -> None:
    violations = invariant_violations(events, session, options)
    if violations:
        raise _failure(violations, events)


async def _assert_store(store: EventStore, session: str, options: CheckOptions | None) -> None:
    from calltape.errors import SessionNotFound

    events = await store.read(session)
    if not events:
        raise SessionNotFound(session)
    _assert_events(events, session, options)


@overload
def assert_invariants(
    events: Iterable[Event | Mapping[str, Any]], session: str | None = None, *, options: CheckOptions | None = None
) -> None: ...


@overload
def assert_invariants(
    events: EventStore, session: str, *, options: CheckOptions | None = None
) -> Coroutine[Any, Any, None]: ...


def assert_invariants(
    events: Any, session: str | None = None, *, options: CheckOptions | None = None
) -> Coroutine[Any, Any, None] | None:
    """Raises ``AssertionError`` listing every violation (and the timeline) of a recorded call.

    ``events``: wire-format dicts (as in a JSONL file) or store events, of one session or several
    (``session`` picks one); or an :class:`~calltape.eventstore.EventStore` with the ``session`` to
    read, in which case the result must be awaited: ``await assert_invariants(store, "call-1")``.
    """
    from calltape.eventstore import EventStore

    if isinstance(events, EventStore):
        if session is None:
            raise TypeError("assert_invariants(store, session): name the session to check")
        return _assert_store(events, session, options)
    _assert_events(to_events(events), session, options)
    return None
