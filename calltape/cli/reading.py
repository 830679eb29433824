"""Reading ``calltape import``'s input: files (plain or gzip) → checked events, in batches.

Reading and checking a line costs about as much CPU as storing it, and in one process the two take
turns (SQLite's writer thread needs the GIL for every row). A large import therefore reads in a
second process (:class:`ReaderProcess`): it parses and checks every line and hands the writer
batches of plain tuples (pickling :class:`~calltape.events.Event` objects costs more than parsing
them), so the import runs at the pace of the slower side instead of the sum of both. Small inputs
and standard input are read in the importing process (starting a process costs about 0.3 s).

An event without an ``id`` gets a *deterministic* one (UUIDv5 of its session, its canonical JSON
and how often that exact line occurred before in this import), so re-importing such a file is a
no-op too, where a random id would duplicate every event.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import hashlib
import io
import os
import signal
import subprocess
import sys
import uuid
import zlib
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import orjson

from calltape.canonical_json import canonical_bytes
from calltape.errors import CalltapeError, CliError

if TYPE_CHECKING:
    from calltape.events import Event

MAX_REPORTED = 20
"""Invalid lines reported one by one; the rest are counted."""
CHILD_READER_BYTES = 4 << 20
"""Inputs of at least this many bytes (about 15,000 events) are read in a second process."""
_ID_NAMESPACE = uuid.UUID("8f5b0c1e-2d1a-4c57-9f0e-6a3c7d1b2e40")


@dataclass(slots=True)
class Source:
    """One input: a file (plain or gzip, recognised by its first bytes) or standard input."""

    name: str
    path: Path | None
    size: int | None = None
    consumed: int = 0
    """Bytes of the underlying file read so far (compressed bytes for gzip), for progress."""

    @contextlib.contextmanager
    def open(self) -> Iterator[IO[bytes]]:
        """The input's bytes, decompressed when it starts like gzip."""
        raw: IO[bytes] = sys.stdin.buffer if self.path is None else self.path.open("rb")
        try:
            buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(cast(Any, raw))
            if buffered.peek(2)[:2] == b"\x1f\x8b":
                yield io.BufferedReader(cast(Any, gzip.GzipFile(fileobj=buffered, mode="rb")), buffer_size=1 << 20)
            else:
                yield buffered
        finally:
            if self.path is not None:
                raw.close()
            self.consumed = self.size or 0

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """Numbered lines; a file that is not readable (or not valid gzip) is one sentence."""
        try:
            with self.open() as handle:
                for lineno, line in enumerate(handle, start=1):
                    if self.path is not None and lineno % 4096 == 0:
                        with contextlib.suppress(OSError, ValueError, AttributeError):
                            self.consumed = self._position(handle)
                    yield lineno, line
        except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise CliError(f"cannot read '{self.name}': {reason}") from None

    @staticmethod
    def _position(handle: IO[bytes]) -> int:
        inner = getattr(handle, "raw", None)
        if isinstance(inner, gzip.GzipFile):
            return int(inner.fileobj.tell())  # type: ignore[union-attr]
        return int(handle.tell())


def open_sources(files: list[str]) -> list[Source]:
    """The command line's FILE arguments as sources; one that cannot be read is one sentence."""
    sources: list[Source] = []
    stdin_used = False
    for name in files:
        if name == "-":
            if stdin_used:
                raise CliError("'-' (stdin) can be given only once")
            stdin_used = True
            sources.append(Source("<stdin>", None))
            continue
        path = Path(name)
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise CliError(f"cannot read '{name}': {exc.strerror or exc}") from None
        if path.is_dir():
            raise CliError(f"cannot read '{name}': it is a directory")
        sources.append(Source(name, path, path.stat().st_size))
    return sources


class LineParser:
    """Line → Event, with deterministic ids for events that have none.

    How often each line occurred is kept under a 16-byte digest of its canonical JSON, not the JSON
    itself: a file of a million events without ids held every line twice over (4 GB); the digests
    cost about 100 bytes a line. The id is still computed from the JSON, so it does not change."""

    def __init__(self) -> None:
        self.occurrences: dict[bytes, int] = {}

    def parse(self, line: bytes) -> Event:
        """The line's event; raises :class:`~calltape.errors.InvalidEvent` saying what is wrong."""
        from calltape.errors import InvalidEvent
        from calltape.events import MAX_DEPTH, parse_event, parse_read

        try:
            obj: Any = orjson.loads(line)
        except orjson.JSONDecodeError:
            return parse_event(line)  # raises InvalidEvent with the JSON error
        if isinstance(obj, dict) and obj.get("id") is None and isinstance(obj.get("session"), str):
            body = {k: v for k, v in obj.items() if k != "seq"}
            try:
                canonical = canonical_bytes(body)
            except orjson.JSONEncodeError:
                # Nested deeper than orjson writes (254 levels), so far beyond what an event may
                # hold: the checks say so, in their own words, before any id is needed.
                parse_read(obj, line)
                raise InvalidEvent(f"'data' is nested deeper than {MAX_DEPTH} levels") from None
            key = hashlib.blake2b(canonical, digest_size=16).digest()
            n = self.occurrences.get(key, 0)
            self.occurrences[key] = n + 1
            obj["id"] = str(uuid.uuid5(_ID_NAMESPACE, f"{obj['session']}\x00{n}\x00{canonical!r}"))
        return parse_read(obj, line)


@dataclass(slots=True)
class Batch:
    """Checked events and where each came from (for a refusal's FILE:LINE)."""

    events: list[Event]
    lines: list[tuple[Source, int]]


class Problems:
    """The invalid lines: the first few reported as FILE:LINE: reason, all of them counted."""

    def __init__(self) -> None:
        self.reported: list[str] = []
        self.count = 0

    def add(self, source: Source, lineno: int, reason: str) -> None:
        """Counts an invalid line (and keeps its report while there are few)."""
        self.count += 1
        if len(self.reported) < MAX_REPORTED:
            self.reported.append(f"{source.name}:{lineno}: {reason}")

    def fail(self) -> CliError:
        """Writes the reports to stderr; the error that ends the import."""
        for problem in self.reported:
            sys.stderr.write(problem + "\n")
        if self.count > len(self.reported):
            sys.stderr.write(f"… and {self.count - len(self.reported)} more invalid lines\n")
        sys.stderr.flush()
        n = self.count
        return CliError(
            f"nothing was imported: {n} invalid line{'s' if n != 1 else ''} "
            f"(fix {'them' if n != 1 else 'it'} and run the import again)"
        )


def batches(
    sources: list[Source], size: int, problems: Problems, slice_lines: int | None = None
) -> Iterator[Batch | None]:
    """Parsed events in batches; invalid lines go to ``problems`` (after the first, no more batches
    are yielded with events, but every line is still checked so that all of them are reported).
    ``slice_lines``: also yield None after every that many lines (the caller's moment to yield)."""
    parser = LineParser()
    batch = Batch([], [])
    for source in sources:
        for lineno, raw in source.lines():
            if slice_lines is not None and lineno % slice_lines == 0:
                yield None
            line = raw.strip()
            if not line:
                continue
            try:
                event = parser.parse(line)
            except CalltapeError as exc:
                problems.add(source, lineno, str(exc))
                continue
            if problems.count:
                continue
            batch.events.append(event)
            batch.lines.append((source, lineno))
            if len(batch.events) >= size:
                yield batch
                batch = Batch([], [])
    if batch.events and not problems.count:
        yield batch


# ---------------------------------------------------------------------------------------------
# The reader process


_Fields = tuple[str, dict[str, Any], str, str, int, "str | None", "int | None", "int | None"]
"""An event as the reader process sends it: type, data, session, id, at_ms, agent, epoch, seq."""


def _read_and_send(names: list[str], paths: list[str], sizes: list[int | None], size: int, conn: Connection) -> None:
    """The reader process's body: every line checked, batches sent as tuples, then how it ended.

    Messages: ``("batch", fields, [(source index, line)], bytes consumed)`` any number of times,
    then ``("end", reported, count)`` or ``("error", sentence)``. Event content never goes into
    anything but a batch (an invalid line's reason names the field, not its value)."""
    sources = [Source(n, Path(p), s) for n, p, s in zip(names, paths, sizes, strict=True)]
    index = {id(s): i for i, s in enumerate(sources)}
    problems = Problems()
    try:
        for part in batches(sources, size, problems):
            assert part is not None
            fields = [(e.type, e.data, e.session, e.id, e.at_ms, e.agent, e.epoch, e.seq) for e in part.events]
            where = [(index[id(s)], n) for s, n in part.lines]
            conn.send(("batch", fields, where, sum(s.consumed for s in sources)))
        conn.send(("end", problems.reported, problems.count))
    except CliError as exc:
        conn.send(("error", str(exc)))
    except BrokenPipeError:
        pass  # the importer stopped (a refused event, Ctrl-C): nothing more to say
    finally:
        conn.close()


class ReaderProcess:
    """Reads ``sources`` in a second process; :meth:`batches` yields them as they are checked.

    The process is ``python -m calltape.cli.reading`` (not :mod:`multiprocessing`, which would run
    the importing program's own main script again in the child), writing to a pipe that holds about
    one batch, so the reader stays a batch or two ahead of the writer and memory stays bounded
    however large the file. Leaving early (a refused event) stops it."""

    def __init__(self, sources: list[Source], size: int, problems: Problems) -> None:
        assert all(s.path is not None for s in sources), "standard input is read in this process"
        self.sources = sources
        self._problems = problems
        read_fd, write_fd = os.pipe()
        job = {"names": [s.name for s in sources], "paths": [str(s.path) for s in sources], "size": size}
        job["sizes"] = [s.size for s in sources]
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "calltape.cli.reading", str(write_fd), orjson.dumps(job).decode()],
                pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(write_fd)
        self._conn = Connection(read_fd, writable=False)

    @staticmethod
    def wanted(sources: list[Source]) -> bool:
        """Whether reading ``sources`` in a second process pays for starting it."""
        if os.name != "posix" or any(s.path is None or s.size is None for s in sources):
            return False
        return sum(s.size or 0 for s in sources) >= CHILD_READER_BYTES

    def _receive(self) -> Any:
        """The next message, its events built (in the receiving thread: while this process's loop
        waits on a write, this thread unpickles and builds the next batch)."""
        from calltape.events import Event

        try:
            message = self._conn.recv()
        except (EOFError, OSError):
            return ("error", "the import's reader process stopped unexpectedly")
        if message[0] != "batch":
            return message
        _, fields, where, consumed = message
        events = [
            Event(t, data, session, id_, at_ms, agent, epoch, seq, True)
            for t, data, session, id_, at_ms, agent, epoch, seq in fields
        ]
        return ("batch", events, where, consumed)

    async def batches(self) -> AsyncGenerator[Batch, None]:
        """The checked batches; invalid lines go to ``problems`` once the whole input is read."""
        loop = asyncio.get_running_loop()
        coming = loop.run_in_executor(None, self._receive)
        try:
            while True:
                message = await coming
                kind = message[0]
                if kind == "end":
                    self._problems.reported, self._problems.count = message[1], message[2]
                    return
                if kind == "error":
                    raise CliError(message[1])
                _, events, where, consumed = message
                coming = loop.run_in_executor(None, self._receive)  # the next one arrives while this is stored
                sources = self.sources
                for source in sources:  # progress: the reader's bytes, shown on the writer's side
                    source.consumed = min(source.size or 0, consumed)
                    consumed -= source.consumed
                yield Batch(events, [(sources[i], n) for i, n in where])
        finally:
            self._stop()
            if not coming.done():  # the reader is gone, so the receiving thread gets its end of file
                await asyncio.wait([coming])
            self._conn.close()

    def _stop(self) -> None:
        """Ends the reader: it has finished, or it is stopped mid-file (the import was refused)."""
        try:
            self._process.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            self._process.terminate()
            self._process.wait()


def _main(argv: list[str]) -> None:
    """``python -m calltape.cli.reading FD JOB``: the reader process (started by :class:`ReaderProcess`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the importer's to handle: it stops this process
    gc.disable()  # events are acyclic and freed by reference counting; the collector's rescans cost half
    fd, job = int(argv[0]), orjson.loads(argv[1])
    _read_and_send(job["names"], job["paths"], job["sizes"], job["size"], Connection(fd, readable=False))


if __name__ == "__main__":
    _main(sys.argv[1:])
