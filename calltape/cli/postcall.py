"""``calltape import --format PLATFORM FILE…``: hosted platforms' saved post-call payloads into the log.

Every file is read and converted before anything is written (a file that is not the platform's shape
is one sentence naming it, and the store is left as it was); then all the calls go in through one
import transaction, as a JSONL import does. A call that calltape recorded live (its session exists and
was not rebuilt from a report) is left alone: the live log says more than the payload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from calltape.cli.common import note, opened_store, out, run, write_json
from calltape.cli.reading import Source
from calltape.errors import CliError, InvalidEvent

if TYPE_CHECKING:
    import typer

    from calltape.events import Event


def _read(source: Source) -> object:
    try:
        with source.open() as handle:
            raw = handle.read()
    except OSError as exc:
        raise CliError(f"cannot read '{source.name}': {exc.strerror or exc}") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise CliError(f"{source.name}: not a JSON document (a saved post-call payload is one JSON object)") from None


def convert(sources: list[Source], platform: str) -> list[tuple[Source, list[Event]]]:
    """Every call of every file as events, in file order; the first file that is not the platform's
    shape stops everything (one sentence naming it)."""
    from calltape.adapters.postcall import PLATFORMS, postcall_events

    calls: list[tuple[Source, list[Event]]] = []
    for source in sources:
        try:
            sessions = postcall_events(platform, _read(source))
        except InvalidEvent as exc:
            name = PLATFORMS[platform][0]
            article = "an" if name[0] in "AEIOU" else "a"
            raise CliError(
                f"{source.name} is not {article} {name} post-call payload: {exc}; nothing was imported"
            ) from None
        calls.extend((source, events) for events in sessions)
    return calls


def import_postcall(
    ctx: typer.Context, sources: list[Source], platform: str, *, json_out: bool, allow_after_resume: bool
) -> None:
    """The ``--format`` branch of ``calltape import``: convert, skip calls recorded live, import."""
    from calltape.adapters.postcall import PLATFORMS
    from calltape.adapters.reconstruct import is_reconstructed
    from calltape.cli.common import import_refusal
    from calltape.errors import ImportRefused
    from calltape.eventstore.bulk import bulk_import

    if platform not in PLATFORMS:
        raise CliError(f"unknown --format '{platform}' (use one of: jsonl, {', '.join(PLATFORMS)})")
    calls = convert(sources, platform)

    async def append_all() -> tuple[int, int, int, list[str]]:
        live: list[str] = []
        async with opened_store(ctx, create=True) as store:
            chosen: list[tuple[Source, list[Event]]] = []
            for source, events in calls:
                first = await store.read(events[0].session, limit=1)
                if first and not is_reconstructed(first[0]):
                    live.append(events[0].session)
                    continue
                chosen.append((source, events))
            async with bulk_import(store, allow_after_resume=allow_after_resume) as imp:
                for source, events in chosen:
                    try:
                        await imp.add(events)
                    except ImportRefused as exc:
                        why = import_refusal(exc, events[exc.index])
                        raise CliError(f"{source.name}: {why}; nothing was imported") from None
                counts = imp.counts
        return counts.new, counts.stored, len(counts.sessions), live

    new, skipped, touched, live = run(append_all())
    for session in live:
        note(f"Skipped '{session}': calltape recorded that call live, and its log says more than the payload.")
    if json_out:
        write_json({"imported": new, "skipped": skipped, "sessions": touched, "recorded_live": live})
        return
    if not touched:
        note("No calls to import.")
        return
    message = f"Imported {new} new event{'s' if new != 1 else ''} from {touched} call{'s' if touched != 1 else ''}"
    if skipped:
        message += f" ({skipped} already stored)"
    out().print(message + ".")
