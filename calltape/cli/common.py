"""What every command shares: the store, the error style, output helpers, time and instant parsing.

Heavy modules (the store, SQLAlchemy, the projections) are imported inside functions, so
``calltape --help`` and shell completion stay fast.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
import typer

from calltape.canonical_json import json_text
from calltape.errors import CalltapeError, CliError

if TYPE_CHECKING:
    from rich.console import Console

    from calltape.errors import ImportRefused
    from calltape.events import Event
    from calltape.eventstore import EventStore

T = TypeVar("T")


@dataclass(slots=True)
class CliState:
    """The global options, read once by the root callback and shared by every command."""

    db: str | None = None


def state(ctx: typer.Context) -> CliState:
    """The global options of this invocation (kept on the root context)."""
    root = ctx.find_root()
    obj = root.obj
    if not isinstance(obj, CliState):
        obj = root.obj = CliState()
    return obj


# ---------------------------------------------------------------------------------------------
# Consoles. When stdout is not a terminal, rich would wrap at 80 columns: widen it so a piped
# `show` or `sessions` keeps one row per line.


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    # markup=False: session ids, agent names and messages are user data; "[/x]" in one must print as
    # itself, never be parsed as a style tag (styles are applied with Text and style= only).
    from rich.console import Console  # here: `calltape --help` and `--version` print without rich

    return Console(stderr=stderr, width=width, highlight=False, soft_wrap=False, markup=False)


_out: Console | None = None
_err: Console | None = None


def out() -> Console:
    """The console for results (stdout); markup off, so user data is never read as markup."""
    global _out
    if _out is None:
        _out = _console()
    return _out


def err() -> Console:
    """The console for messages and progress (stderr)."""
    global _err
    if _err is None:
        _err = _console(stderr=True)
    return _err


def write_json(value: Any, *, indent: bool = True) -> None:
    """JSON on stdout, bypassing rich (no wrapping, no markup)."""
    option = orjson.OPT_INDENT_2 if indent else 0
    sys.stdout.buffer.write(orjson.dumps(value, option=option | orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.buffer.flush()


def note(message: str) -> None:
    """A side remark on stderr (never mixed into JSON on stdout)."""
    err().print(message, style="dim", markup=False)


# ---------------------------------------------------------------------------------------------
# Running async command bodies against the store.


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Runs a command's coroutine to completion (one event loop per command)."""
    import asyncio  # here, not at start-up: `calltape --help` and `--version` need no event loop

    return asyncio.run(coro)


def database_url(ctx: typer.Context) -> str:
    """The resolved URL of the database this command uses (``--db``, the environment, the default)."""
    from calltape.eventstore import resolve_url

    return resolve_url(state(ctx).db)


def ensure_exists(url: str) -> None:
    """A read command creates nothing: an SQLite file that is not there is one sentence naming it."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    path = Path(parsed.database or "")
    if not path.exists():
        from calltape.eventstore import default_path

        if path == default_path():
            raise CliError(
                f"there is no calltape database yet at '{path}' (the embedded default): "
                "`calltape import FILE` or `calltape demo` creates it"
            )
        from calltape.eventstore.connect import absolute_hint, check_relative_sqlite

        check_relative_sqlite(url)
        relative = ""
        if not path.is_absolute():
            relative = f", a path relative to the current directory ({absolute_hint(str(path))})"
        raise CliError(
            f"there is no calltape database at '{path}'{relative}: check the path "
            "(`calltape import` or `calltape db upgrade` creates one)"
        )
    if path.is_dir():
        raise CliError(f"'{path}' is a directory, not an SQLite database")


@contextlib.asynccontextmanager
async def opened_store(ctx: typer.Context, *, create: bool = False) -> AsyncIterator[EventStore]:
    """The store named by ``--db``, ``$CALLTAPE_DATABASE_URL`` or the embedded default.

    Read commands (``create=False``) never create a database file or directory; every database failure a
    user can cause becomes one sentence naming the fix.
    """
    from calltape.cli.dberrors import database_errors
    from calltape.eventstore import open_store

    url = database_url(ctx)
    if not create:
        ensure_exists(url)
    with database_errors(url):
        store = await open_store(url)
        try:
            yield store
        finally:
            await store.close()


async def require_session(store: EventStore, session: str) -> Any:
    """The session's summary, or the one-sentence error for a session the store does not hold."""
    from calltape.errors import SessionNotFound

    info = await store.session_info(session)
    if info is None:
        raise SessionNotFound(session)
    return info


def within(info: Any, seq: int, option: str) -> None:
    """``--at N`` / ``--to N`` must name a seq the session has: past its end is one sentence."""
    if seq > info.last_seq:
        raise CliError(
            f"{option} {seq} is past the end of session '{info.session}', which has {info.last_seq} "
            f"event{'s' if info.last_seq != 1 else ''} (seqs 1 to {info.last_seq})"
        )


# ---------------------------------------------------------------------------------------------
# Times.

_AGO = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d|w)")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 7 * 86_400_000}


def parse_when(value: str, option: str) -> int:
    """``--since``/``--until``: RFC 3339, a date, or a duration ago (``30m``, ``2h``, ``7d``)."""
    from calltape.events import now_ms, parse_time

    text = value.strip()
    match = _AGO.fullmatch(text)
    if match:
        return now_ms() - round(float(match.group(1)) * _UNIT_MS[match.group(2)])
    try:
        return parse_time(text)
    except CalltapeError:
        raise CliError(
            f"{option} '{value}' is not a time: use RFC 3339 (2025-01-31T09:30:00Z), a date (2025-01-31) "
            "or a duration ago (30m, 2h, 7d)"
        ) from None


def clock(at_ms: int | None) -> str:
    """A UTC wall-clock time for tables: ``2025-01-31 09:30:12``."""
    if at_ms is None:
        return ""
    return datetime.fromtimestamp(at_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration(ms: int | None) -> str:
    """``850ms``, ``12.4s``, ``3m05s``, ``1h02m``."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def offset(ms: int) -> str:
    """Time since the session start: ``+12.345``."""
    sign = "-" if ms < 0 else "+"
    ms = abs(ms)
    minutes, rest = divmod(ms, 60_000)
    if minutes:
        return f"{sign}{minutes}:{rest // 1000:02d}.{rest % 1000:03d}"
    return f"{sign}{rest // 1000}.{rest % 1000:03d}"


def shorten(text: str, limit: int = 80) -> str:
    """One line of at most ``limit`` characters, whitespace collapsed (for table cells)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def compact_json(value: Any, limit: int = 80) -> str:
    """A value as compact JSON, shortened for a table cell."""
    return shorten(json_text(value), limit)


# ---------------------------------------------------------------------------------------------
# Shared option definitions.

FORMAT_HELP = "Context format: native, openai, anthropic, realtime or ultravox (initialMessages)."


def format_names() -> list[str]:
    """The provider formats ``--format`` accepts."""
    from calltape.projections import FORMATS

    return list(FORMATS)


def check_format(value: str) -> str:
    """Refuses an unknown ``--format`` with one sentence naming the known ones."""
    if value not in format_names():
        raise CliError(f"unknown context format '{value}' (use one of: {', '.join(format_names())})")
    return value


def complete_format(incomplete: str) -> list[str]:
    """Shell completion of ``--format``."""
    return [name for name in format_names() if name.startswith(incomplete)]


def one_of(*values: str) -> Any:
    """An option callback accepting only ``values`` (a usage error otherwise), for any typer version."""

    def check(value: str | None) -> str | None:
        if value is not None and value not in values:
            raise typer.BadParameter(f"'{value}' is not one of: {', '.join(values)}")
        return value

    return check


def completer(*values: str) -> Any:
    """A shell completion function over a fixed set of values."""

    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return complete


def import_refusal(exc: ImportRefused, event: Event) -> str:
    """Why the store refused an imported event, in the words of the import."""
    from calltape.errors import FencedWrite

    cause = exc.cause
    if isinstance(cause, FencedWrite) and event.epoch is None:
        return (
            f"session '{cause.session}' was resumed (it is at epoch {cause.current}) after this event's writer "
            "lost it, so the event was refused (--allow-after-resume imports it anyway)"
        )
    return f"the store refused this event: {exc}"
