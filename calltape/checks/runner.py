"""Running the rules: over one session's events, over JSONL files, over a store session by session.

This is the one code path behind ``calltape check`` and ``calltape.testing.assert_invariants``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from msgspec.structs import replace

from calltape.checks.facts import SessionFacts, collect
from calltape.checks.rules import RULES, CheckOptions, Violation
from calltape.errors import CalltapeError, CheckInputError
from calltape.events import Event, parse_event

if TYPE_CHECKING:
    from calltape.eventstore import EventStore


def _rule_order(rule_ids: Sequence[str] | None) -> list[str]:
    if rule_ids is None:
        return list(RULES)
    unknown = [r for r in rule_ids if r not in RULES]
    if unknown:
        raise CheckInputError(f"unknown rule '{unknown[0]}' (the rules are: {', '.join(RULES)})")
    return [r for r in RULES if r in rule_ids]


def check_facts(
    facts: SessionFacts, options: CheckOptions | None = None, rules: Sequence[str] | None = None
) -> list[Violation]:
    """Applies the rules to collected facts; violations in seq order (then rule order)."""
    options = options or CheckOptions()
    order = _rule_order(rules)
    found: list[Violation] = []
    for rule_id in order:
        found.extend(RULES[rule_id].apply(facts, options))
    rank = {r: i for i, r in enumerate(order)}
    found.sort(key=lambda v: (v.seq, rank[v.rule]))
    return found


def check_events(
    events: Iterable[Event],
    options: CheckOptions | None = None,
    rules: Sequence[str] | None = None,
    session: str | None = None,
) -> list[Violation]:
    """The violations of one session's events (in seq order)."""
    return check_facts(collect(events, session), options, rules)


# ---------------------------------------------------------------------------------------------
# Wire-format events (dicts, JSONL lines): numbering as the store would.


def number_session(events: list[Event]) -> list[Event]:
    """Gives one session's events the seqs the store would: their own when every one carries a seq
    (an export), else their position among the unique ids, in order."""
    if events and all(e.seq is not None for e in events):
        return events
    seen: set[str] = set()
    numbered: list[Event] = []
    for event in events:
        if event.id in seen:
            continue
        seen.add(event.id)
        numbered.append(replace(event, seq=len(numbered) + 1))
    return numbered


def to_events(items: Iterable[Event | Mapping[str, Any]]) -> list[Event]:
    """Store events as they are; wire dicts validated (SPEC section 1) and numbered per session."""
    out: list[Event] = []
    wire = False
    for index, item in enumerate(items, start=1):
        if isinstance(item, Event):
            out.append(item)
            continue
        wire = True
        try:
            out.append(parse_event(dict(item)))
        except CalltapeError as exc:
            raise CheckInputError(f"event {index} is not a valid event: {exc}") from None
    if not wire:
        return out
    by_session: dict[str, list[Event]] = {}
    for event in out:
        by_session.setdefault(event.session, []).append(event)
    return [e for group in by_session.values() for e in number_session(group)]


def read_jsonl(path: str | Path) -> Iterator[tuple[str, list[Event]]]:
    """The sessions of one JSONL file, each as its numbered events, in order of first appearance.

    Every line is validated before the first session is returned: an invalid file is refused whole
    (``FILE:LINE: reason``), like ``calltape import`` does.
    """
    name = str(path)
    try:
        handle = Path(path).open("rb")
    except IsADirectoryError:
        raise CheckInputError(f"cannot read '{name}': it is a directory") from None
    except OSError as exc:
        raise CheckInputError(f"cannot read '{name}': {exc.strerror or exc}") from None
    sessions: dict[str, list[Event]] = {}
    with handle:
        try:
            for lineno, raw in enumerate(handle, start=1):
                line = raw.strip()
                if not line:
                    continue
                try:
                    event = parse_event(orjson.loads(line))
                except orjson.JSONDecodeError:
                    raise CheckInputError(f"{name}:{lineno}: not valid JSON") from None
                except CalltapeError as exc:
                    raise CheckInputError(f"{name}:{lineno}: {exc}") from None
                sessions.setdefault(event.session, []).append(event)
        except IsADirectoryError:
            raise CheckInputError(f"cannot read '{name}': it is a directory") from None
        except OSError as exc:
            raise CheckInputError(f"cannot read '{name}': {exc.strerror or exc}") from None
    for session, events in sessions.items():
        yield session, number_session(events)


# ---------------------------------------------------------------------------------------------
# The store, one session at a time.


@dataclass(slots=True)
class SessionReport:
    """The outcome of checking one session."""

    session: str
    events: int
    violations: list[Violation]


async def sweep_store(
    store: EventStore,
    sessions: Sequence[str],
    options: CheckOptions | None = None,
    rules: Sequence[str] | None = None,
) -> AsyncIterator[SessionReport]:
    """Checks the sessions one by one, reading the next while the current one is checked.

    Memory holds at most two sessions' events (the one being checked and the one being read).
    """
    options = options or CheckOptions()
    _rule_order(rules)
    if not sessions:
        return
    loop = asyncio.get_running_loop()
    pending: asyncio.Task[list[Event]] | None = loop.create_task(store.read(sessions[0]))
    for index, session in enumerate(sessions):
        assert pending is not None
        events = await pending
        pending = loop.create_task(store.read(sessions[index + 1])) if index + 1 < len(sessions) else None
        try:
            violations = check_events(events, options, rules, session)
        except BaseException:
            if pending is not None:
                pending.cancel()
            raise
        yield SessionReport(session, len(events), violations)
        del events


# ---------------------------------------------------------------------------------------------
# Several processes: a sweep of a day of calls is CPU-bound (decode and fold), so it uses every core.

CHUNK = 40
"""Sessions per worker task: large enough to amortize opening a store, small enough to balance."""


def _check_chunk(
    url: str | None, sessions: list[str], options: CheckOptions, rules: list[str] | None
) -> list[SessionReport]:
    """One worker's share: opens its own store, checks the sessions one by one, closes the store."""
    from calltape.eventstore import open_store

    async def run() -> list[SessionReport]:
        store = await open_store(url)
        try:
            return [report async for report in sweep_store(store, sessions, options, rules)]
        finally:
            await store.close()

    return asyncio.run(run())


def sweep_parallel(
    url: str | None,
    sessions: Sequence[str],
    options: CheckOptions | None = None,
    rules: Sequence[str] | None = None,
    *,
    jobs: int,
    chunk: int = CHUNK,
) -> Iterator[list[SessionReport]]:
    """Checks the sessions in ``jobs`` processes, ``chunk`` sessions per task; yields each chunk's
    reports in the order of ``sessions`` (so the output does not depend on scheduling). Each worker
    holds one session at a time (two while it reads ahead)."""
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor

    options = options or CheckOptions()
    rule_list = list(rules) if rules is not None else None
    _rule_order(rule_list)
    chunks = [list(sessions[i : i + chunk]) for i in range(0, len(sessions), chunk)]
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures: list[Future[list[SessionReport]]] = [
            pool.submit(_check_chunk, url, names, options, rule_list) for names in chunks
        ]
        try:
            for future in futures:
                yield future.result()
        finally:
            for future in futures:
                future.cancel()
