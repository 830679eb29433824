"""Against the nearest voice peer: pipecat-session-continuity 0.2.1 (a bench-only dependency), both on
SQLite, the same call at 10, 100 and 1,000 turns.

A turn is what ``workload.py``'s generator makes of it: a user utterance (interim transcripts, the
final one), sometimes a tool round trip (a call, its start, maybe progress, its result), an assistant
reply streamed as one- or two-word deltas and played out (about 15% barged into). Each side does what a live
agent using it does at the end of each turn:

- **the peer** adds the turn's messages (OpenAI chat messages: the user's final transcript, the
  assistant's tool call and the tool's output, the reply as heard) to a pipecat ``LLMContext`` and
  calls ``SessionContinuity.checkpoint(context, session_id, {})``: the whole context as one JSON
  document, upserted into its ``SQLiteStorage`` (a new ``sqlite3`` connection per save, in a thread,
  the library's defaults: rollback journal, ``synchronous=FULL``);
- **calltape** emits the turn's events through a ``CallSession`` on a ``Recorder`` (no I/O) and
  appends the turn's last event durably (``emit_durable``): it returns once the turn's events have
  committed (the ``SQLiteStore`` defaults: WAL, ``synchronous=NORMAL``).

Each timed figure is wall time (``perf_counter``) and CPU time of the whole process
(``process_time``, every thread). The two sides run in one process, turn by turn, alternating which
goes first, each on a fresh file in its own temporary directory.

After the last turn the call is dropped (calltape: ``session.dropped``, as an adapter records a lost
transport; the peer has nothing to record). Then, alternating again: the peer's restore
(``manager.load_context`` + ``LLMContext.set_messages``, what ``resume_or_start`` does before it
queues its greeting frame) against ``calltape.resume`` for real (plan, settling events,
``session.resumed``, the append with ``expected_seq``), a dry run, and the rendering of the resumed
context in the OpenAI format (``plan.context``, which ``resume`` leaves to its first read).

``python -m bench.peer`` runs this alone; ``--profile-resume N`` writes cProfile statistics of
calltape's resume of an N-turn call.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.stats import percentile
from bench.workload import Step, call_steps

PEER = "pipecat-session-continuity"
SESSION = "peer-call"


def available() -> bool:
    """Whether the peer can be imported (it is in the ``bench`` extra, and pulls in pipecat-ai)."""
    return importlib.util.find_spec("pipecat_session_continuity") is not None


# -- the call, as turns ---------------------------------------------------------------------------


@dataclass(slots=True)
class Turn:
    steps: list[Step]
    """calltape's events of the turn, in order (the last one is appended durably)."""
    messages: list[dict[str, Any]]
    """The same turn as the OpenAI chat messages the peer's context gains."""


def _messages(steps: list[Step]) -> list[dict[str, Any]]:
    """The chat messages a pipecat context gains from one turn: what the LLM sees next turn."""
    out: list[dict[str, Any]] = []
    text: dict[str, str] = {}
    for kind, data in steps:
        if kind == "user.transcript" and data.get("final"):
            out.append({"role": "user", "content": data["text"]})
        elif kind == "agent.text":
            text[data["reply"]] = text.get(data["reply"], "") + data["text"]
        elif kind == "tool.call":
            call = {
                "id": data["call"],
                "type": "function",
                "function": {"name": data["name"], "arguments": json.dumps(data["arguments"])},
            }
            out.append({"role": "assistant", "content": text.pop(data["reply"], None), "tool_calls": [call]})
        elif kind == "tool.result":
            out.append({"role": "tool", "tool_call_id": data["call"], "content": json.dumps(data["output"])})
        elif kind == "agent.speech.ended" and data["reply"] in text:
            spoken = data["heard"] if data.get("interrupted") else text[data["reply"]]
            del text[data["reply"]]
            out.append({"role": "assistant", "content": spoken})
    return out


def call_turns(seed: int, turns: int) -> tuple[dict[str, Any], list[Turn]]:
    """``session.started``'s data and the first ``turns`` turns of one call of ``workload.py``."""
    steps: Iterator[Step] = call_steps(seed)
    kind, started = next(steps)
    assert kind == "session.started"
    out: list[Turn] = []
    current: list[Step] = []
    for step in steps:
        current.append(step)
        kind, data = step
        # a turn ends when its spoken reply ends (a tool round trip's own reply ends in "t")
        if kind == "agent.speech.ended" and not data["reply"].endswith("t"):
            out.append(Turn(current, _messages(current)))
            current = []
            if len(out) == turns:
                break
    return started, out


# -- the two sides ---------------------------------------------------------------------------------


class PeerSide:
    """pipecat-session-continuity on its SQLite storage, used as its README shows."""

    def __init__(self, path: Path, instructions: str) -> None:
        from pipecat.processors.aggregators.llm_context import LLMContext
        from pipecat_session_continuity import SessionContinuity, SQLiteStorage

        self.continuity = SessionContinuity(storage_backend=SQLiteStorage(str(path)))
        self.context = LLMContext([{"role": "system", "content": instructions}])
        self.new_context = LLMContext
        self.samples = Samples()

    async def turn(self, turn: Turn) -> None:
        self.context.add_messages(turn.messages)  # the aggregators' work during the turn, not timed
        t = _Timer()
        await self.continuity.checkpoint(self.context, SESSION, {})
        t.stop(self.samples)

    async def restore(self, context: Any) -> int:
        """``load_context`` and the messages set on the new process's context (``resume_or_start``
        before its frame; the context is made before, as the peer's README shows)."""
        restored = await self.continuity.manager.load_context(SESSION)
        assert restored is not None
        context.set_messages(restored["messages"])
        return len(context.get_messages())

    async def load_only(self) -> int:
        restored = await self.continuity.manager.load_context(SESSION)
        assert restored is not None
        return len(restored["messages"])


class CalltapeSide:
    """A live agent on calltape's embedded store: a ``CallSession`` on a ``Recorder``."""

    def __init__(self, path: Path) -> None:
        self.url = f"sqlite:///{path}"
        self.store: Any = None
        self.recorder: Any = None
        self.call: Any = None
        self.samples = Samples()

    async def open(self, started: dict[str, Any]) -> None:
        from calltape.eventstore import open_store
        from calltape.eventstore.recorder import Recorder
        from calltape.runtime import CallSession

        self.store = await open_store(self.url)
        self.recorder = Recorder(self.store)
        await self.recorder.start()
        data = {k: v for k, v in started.items() if k in ("instructions", "modality", "framework")}
        self.call = await CallSession.start(self.recorder, SESSION, agent=started["agent"], **data)

    async def turn(self, turn: Turn) -> None:
        call = self.call
        *body, (last_kind, last_data) = turn.steps
        t = _Timer()
        for kind, data in body:
            call.emit(kind, data)
        await call.emit_durable(last_kind, last_data)
        t.stop(self.samples)

    async def drop(self) -> None:
        await self.call.drop("transport lost")
        await self.recorder.close()

    async def close(self) -> None:
        if self.recorder is not None:
            await self.recorder.close()
        if self.store is not None:
            await self.store.close()


@dataclass(slots=True)
class Samples:
    wall_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        def r(x: float) -> float:
            return round(x, 3)

        return {
            "n": len(self.wall_ms),
            "p50_ms": r(percentile(self.wall_ms, 50)),
            "p99_ms": r(percentile(self.wall_ms, 99)),
            "cpu_p50_ms": r(percentile(self.cpu_ms, 50)),
            "cpu_p99_ms": r(percentile(self.cpu_ms, 99)),
        }


class _Timer:
    __slots__ = ("cpu", "wall")

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def stop(self, into: Samples) -> None:
        into.cpu_ms.append((time.process_time() - self.cpu) * 1000)
        into.wall_ms.append((time.perf_counter() - self.wall) * 1000)


# -- one size ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class SizeRun:
    turns: int
    events: int
    messages: int
    context_bytes: int
    peer_checkpoint: Samples
    calltape_turn: Samples
    peer_restore: Samples = field(default_factory=Samples)
    peer_load_only: Samples = field(default_factory=Samples)
    calltape_resume: Samples = field(default_factory=Samples)
    calltape_dry_run: Samples = field(default_factory=Samples)
    calltape_render: Samples = field(default_factory=Samples)
    """``plan.context`` (OpenAI format) after a real resume: what the resumed agent reads first."""
    first_dry_run_ms: float = 0.0
    """The first resume plan after the call: no snapshot exists yet (a live call saves none), so it
    folds the whole call (and saves one)."""


async def one_size(turns: int, *, resumes: int, seed: int = 5) -> SizeRun:
    """One call of ``turns`` turns on both sides, then ``resumes`` restores each (after 3 warm-ups)."""
    from calltape.runtime import resume

    started, call = call_turns(seed, turns)
    with tempfile.TemporaryDirectory(prefix="calltape-peer-") as tmp:
        peer = PeerSide(Path(tmp) / "peer.db", started["instructions"])
        ct = CalltapeSide(Path(tmp) / "calltape.db")
        try:
            await ct.open(started)
            gc.collect()
            for k, turn in enumerate(call):
                if k % 2:
                    await ct.turn(turn)
                    await peer.turn(turn)
                else:
                    await peer.turn(turn)
                    await ct.turn(turn)
            await ct.drop()
            raw = await peer.continuity.manager.storage.load(peer.continuity.manager._get_key(SESSION))
            run = SizeRun(
                turns=turns,
                events=sum(len(t.steps) for t in call) + 2,
                messages=len(peer.context.get_messages()),
                context_bytes=len(raw or ""),
                peer_checkpoint=peer.samples,
                calltape_turn=ct.samples,
            )
            store = ct.store
            t0 = time.perf_counter()
            await resume(store, SESSION, "rescue", dry_run=True)
            run.first_dry_run_ms = (time.perf_counter() - t0) * 1000

            async def peer_restore() -> None:
                context = peer.new_context()
                t = _Timer()
                await peer.restore(context)
                t.stop(run.peer_restore)

            async def peer_load() -> None:
                t = _Timer()
                await peer.load_only()
                t.stop(run.peer_load_only)

            async def calltape_dry() -> None:
                t = _Timer()
                await resume(store, SESSION, "rescue", dry_run=True)
                t.stop(run.calltape_dry_run)

            counter = [0]

            async def calltape_real() -> None:
                counter[0] += 1
                t = _Timer()
                plan = await resume(store, SESSION, f"rescue-{counter[0]}", format="openai")
                t.stop(run.calltape_resume)
                t = _Timer()
                assert plan.context
                t.stop(run.calltape_render)

            variants: list[Callable[[], Any]] = [peer_restore, calltape_real, peer_load, calltape_dry]
            for i in range(resumes + 3):
                if i == 3:
                    for s in (run.peer_restore, run.peer_load_only, run.calltape_resume, run.calltape_dry_run):
                        s.wall_ms.clear()
                        s.cpu_ms.clear()
                    run.calltape_render.wall_ms.clear()
                    run.calltape_render.cpu_ms.clear()
                order = variants[i % 4 :] + variants[: i % 4]
                for variant in order:
                    gc.collect()
                    await variant()
        finally:
            await ct.close()
    return run


# -- the suite's figures ----------------------------------------------------------------------------


@dataclass(slots=True)
class PeerResults:
    runs: dict[int, list[SizeRun]]

    def largest(self) -> list[SizeRun]:
        return self.runs[max(self.runs)]

    def smallest(self) -> list[SizeRun]:
        return self.runs[min(self.runs)]


async def peer_benchmark(
    *, sizes: tuple[int, ...], repeats: int, resumes: int, log: Callable[[str], None]
) -> PeerResults:
    """``repeats`` calls per size (the sizes interleaved), each measured on both sides."""
    runs: dict[int, list[SizeRun]] = {n: [] for n in sizes}
    # a warm-up call: imports, the first connections, the first folds
    await one_size(min(sizes), resumes=1, seed=1)
    for rep in range(repeats):
        for n in sizes:
            r = await one_size(n, resumes=resumes, seed=100 + rep)
            runs[n].append(r)
            p, c = r.peer_checkpoint.summary(), r.calltape_turn.summary()
            log(
                f"  {n:,} turns ({r.events:,} events, {r.messages:,} messages, {r.context_bytes / 1024:,.0f} KiB "
                f"context), repeat {rep + 1}/{repeats}: per turn p50/p99 peer {p['p50_ms']}/{p['p99_ms']} ms, "
                f"calltape {c['p50_ms']}/{c['p99_ms']} ms; restore p50 peer "
                f"{percentile(r.peer_restore.wall_ms, 50):.2f} ms, calltape resume "
                f"{percentile(r.calltape_resume.wall_ms, 50):.2f} ms (dry run "
                f"{percentile(r.calltape_dry_run.wall_ms, 50):.2f}, first {r.first_dry_run_ms:.1f})"
            )
    return PeerResults(runs)


def ratio(num: list[float], den: list[float], q: float) -> float:
    return percentile(num, q) / percentile(den, q)


def details(results: PeerResults) -> dict[str, Any]:
    """The curve: per size, each side's median over repeats of every figure."""

    def med(runs: list[SizeRun], name: str) -> dict[str, Any]:
        summaries = [getattr(r, name).summary() for r in runs]
        return {k: round(statistics.median(s[k] for s in summaries), 3) for k in summaries[0]}

    curve = []
    for n, runs in sorted(results.runs.items()):
        curve.append(
            {
                "turns": n,
                "events": runs[0].events,
                "messages": runs[0].messages,
                "peer_context_bytes": runs[0].context_bytes,
                "repeats": len(runs),
                "peer_checkpoint": med(runs, "peer_checkpoint"),
                "calltape_turn_durable": med(runs, "calltape_turn"),
                "peer_restore": med(runs, "peer_restore"),
                "peer_load_context_only": med(runs, "peer_load_only"),
                "calltape_resume": med(runs, "calltape_resume"),
                "calltape_resume_dry_run": med(runs, "calltape_dry_run"),
                "calltape_render_openai": med(runs, "calltape_render"),
                "calltape_first_dry_run_ms": round(statistics.median(r.first_dry_run_ms for r in runs), 2),
                "checkpoint_p99_ratio": round(
                    statistics.median(ratio(r.peer_checkpoint.wall_ms, r.calltape_turn.wall_ms, 99) for r in runs), 3
                ),
                "checkpoint_cpu_p99_ratio": round(
                    statistics.median(ratio(r.peer_checkpoint.cpu_ms, r.calltape_turn.cpu_ms, 99) for r in runs), 3
                ),
                "resume_p50_ratio": round(
                    statistics.median(ratio(r.peer_restore.wall_ms, r.calltape_resume.wall_ms, 50) for r in runs), 3
                ),
                "resume_cpu_p50_ratio": round(
                    statistics.median(ratio(r.peer_restore.cpu_ms, r.calltape_resume.cpu_ms, 50) for r in runs), 3
                ),
            }
        )
    small = results.smallest()
    within = statistics.median(ratio(r.calltape_resume.wall_ms, r.peer_restore.wall_ms, 50) for r in small)
    return {
        "peer": PEER,
        "storage": "SQLite on both sides, fresh files in a temporary directory",
        "curve": curve,
        "smallest_turns": min(results.runs),
        "resume_vs_restore_at_smallest": round(within, 3),
        "resume_within_2x_of_restore_at_smallest": within <= 2.0,
    }


# -- python -m bench.peer ------------------------------------------------------------------------------


async def _profile_resume(turns: int, resumes: int, out: str | None) -> None:
    import cProfile
    import pstats

    from calltape.runtime import resume

    started, call = call_turns(7, turns)
    with tempfile.TemporaryDirectory(prefix="calltape-peer-") as tmp:
        ct = CalltapeSide(Path(tmp) / "calltape.db")
        try:
            await ct.open(started)
            for turn in call:
                await ct.turn(turn)
            await ct.drop()
            for i in range(3):
                await resume(ct.store, SESSION, f"warm-{i}")
            profiler = cProfile.Profile()
            cpu = time.process_time()
            profiler.enable()
            for i in range(resumes):
                await resume(ct.store, SESSION, f"rescue-{i}")
            profiler.disable()
            cpu = time.process_time() - cpu
        finally:
            await ct.close()
    print(f"calltape resume of a {turns:,}-turn call: {cpu / resumes * 1000:.2f} ms CPU each ({resumes} resumes)")
    stats = pstats.Stats(profiler).sort_stats("cumulative")
    stats.print_stats(30)
    if out:
        profiler.dump_stats(out)


def main() -> None:
    """``python -m bench.peer``: the comparison alone, or a profile of calltape's resume."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.peer", description=__doc__)
    parser.add_argument("--sizes", default="10,100,1000", help="turns per call, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--resumes", type=int, default=20)
    parser.add_argument("--profile-resume", type=int, metavar="TURNS", help="profile calltape's resume only")
    parser.add_argument("--profile-out", metavar="PATH", help="with --profile-resume: write the cProfile stats")
    args = parser.parse_args()
    if args.profile_resume:
        asyncio.run(_profile_resume(args.profile_resume, args.resumes, args.profile_out))
        return
    sizes = tuple(int(x) for x in args.sizes.split(","))
    results = asyncio.run(peer_benchmark(sizes=sizes, repeats=args.repeats, resumes=args.resumes, log=print))
    print(json.dumps(details(results), indent=2))


if __name__ == "__main__":
    main()
