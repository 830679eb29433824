"""``calltape demo``: the story of one bad call, recorded, settled and resumed -- offline, in seconds.

A caller asks a voice agent to book a table. While the booking tool runs, the caller barges in.
We compare what a naive in-memory chat history holds with the context calltape rebuilds from the
log. Then the agent process "crashes" in the middle of a second tool call; ``resume`` hands the
call to a new agent with the settled context (what was heard, what ran, what may have run); the
old process wakes up and tries to write -- and is fenced. Everything is in the log at the end, and
the demo prints the commands to inspect it.

It uses only the public runtime API (``CallSession``, ``run_tool``, ``interrupt``, ``resume``), so
it doubles as a worked example of wiring calltape into an agent.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import uuid
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from calltape.errors import CalltapeError
from calltape.events import make_event
from calltape.eventstore import EventStore, open_store, resolve_url
from calltape.eventstore.recorder import Recorder
from calltape.projections import build_context, render
from calltape.runtime import CallSession, ToolSpec, resume

INSTRUCTIONS = "You are the concierge of Luigi's. Book tables; confirm details briefly."
ASK = "Hi, can you book a table for two at eight tonight?"
REPLY_1 = "Sure, booking a table for two at eight tonight. I'll confirm the reference in a moment."
HEARD_1 = "Sure, booking a table for two"
BARGE_IN = "Actually, make it four people."
REPLY_2 = "No problem, changing it to four. One moment while I update the booking."
HEARD_2 = "No problem, changing it to four."
TOOL_LATENCY = 0.35


class _Demo:
    def __init__(self, console: Console, url: str | None) -> None:
        self.console = console
        self.url = url
        self.session = f"demo-{uuid.uuid4().hex[:8]}"
        self.step_no = 0

    # -- presentation -------------------------------------------------------------------------

    def section(self, title: str) -> None:
        self.step_no += 1
        self.console.print()
        self.console.rule(Text(f"{self.step_no} · {title}", style="bold"), align="left", style="cyan")

    def say(self, who: str, text: str, style: str) -> None:
        self.console.print(Text.assemble((f"  {who:>9} ", f"bold {style}"), (text, style)))

    def info(self, text: str) -> None:
        self.console.print(Text("  " + text, style="dim"))

    def good(self, text: str) -> None:
        self.console.print(Text.assemble(("  ✓ ", "bold green"), text))

    def bad(self, text: str) -> None:
        self.console.print(Text.assemble(("  ✗ ", "bold red"), text))

    # -- the story ----------------------------------------------------------------------------

    async def run(self) -> None:
        store = await open_store(self.url)
        try:
            await self._story(store)
        finally:
            await store.close()

    async def _story(self, store: EventStore) -> None:
        c = self.console
        c.print(
            Panel(
                Text.assemble(
                    ("calltape demo", "bold"),
                    " · a voice call with a barge-in during a tool call, a crash, and a resume\n",
                    (f"database: {_where(store)} · session: {self.session}", "dim"),
                ),
                expand=False,
                border_style="cyan",
            )
        )
        recorder = await Recorder(store).start()
        zombie_recorder = recorder
        try:
            tools = {
                "book_table": ToolSpec(timeout=5, on_interrupt="finish"),
                "update_booking": ToolSpec(timeout=5),
            }
            call = await CallSession.start(
                recorder,
                self.session,
                agent="concierge-v1",
                instructions=INSTRUCTIONS,
                framework="demo",
                tools=tools,
            )
            naive = await self._barge_in(call)
            await recorder.flush()
            barge_seq = await _last_seq(store, self.session)
            await self._compare(call, naive)

            # A second recorder plays the old agent process from here on: it will become the zombie.
            zombie_recorder = await Recorder(store, on_rejected=lambda events, error: None).start()
            zombie = await CallSession.attach(zombie_recorder, self.session, tools=tools)
            release = asyncio.Event()
            zombie_task = await self._crash(zombie, release)
            await zombie_recorder.flush()
            crash_seq = await self._drop(store)

            await self._resume(store)
            await self._fence(zombie_task, release)
            end_seq = await self._carry_on(store, tools)
        finally:
            await recorder.close()
            if zombie_recorder is not recorder:
                await zombie_recorder.close()
        self._inspect(barge_seq, crash_seq, end_seq)

    async def _barge_in(self, call: CallSession) -> list[dict[str, Any]]:
        self.section("A caller asks for a booking")
        naive: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS}]
        call.emit("user.speech.started", {"source": "vad"})
        call.emit("user.transcript", {"text": "Hi, can you book", "final": False})
        call.emit("user.transcript", {"text": ASK, "final": True})
        call.emit("user.speech.stopped")
        naive.append({"role": "user", "content": ASK})
        self.say("caller", ASK, "cyan")

        call.emit("agent.reply.started", {"reply": "r1"})
        call.emit("agent.text", {"reply": "r1", "text": REPLY_1})
        arguments = {"people": 2, "time": "20:00"}
        call.emit("tool.call", {"call": "call_book", "name": "book_table", "arguments": arguments, "reply": "r1"})
        call.emit("agent.reply.done", {"reply": "r1"})
        naive.append(
            {
                "role": "assistant",
                "content": REPLY_1,
                "tool_calls": [{"id": "call_book", "name": "book_table", "arguments": arguments}],
            }
        )
        self.say("agent", REPLY_1, "white")
        self.info("→ book_table(people=2, time=20:00) starts; the agent starts speaking")

        async def book_table() -> dict[str, Any]:
            await asyncio.sleep(TOOL_LATENCY)  # the restaurant's booking API
            return {"reference": "BK-1042", "people": 2, "time": "20:00"}

        booking = asyncio.create_task(call.run_tool("call_book", "book_table", arguments, book_table, reply="r1"))
        await asyncio.sleep(0.05)
        call.emit("agent.speech.started", {"reply": "r1"})
        await asyncio.sleep(0.1)
        call.emit("agent.speech.progress", {"reply": "r1", "heard": HEARD_1})

        self.section("The caller barges in while the booking runs")
        call.emit("user.speech.started", {"source": "vad"})
        call.interrupt("r1", heard=HEARD_1)
        call.emit("user.transcript", {"text": BARGE_IN, "final": True})
        call.emit("user.speech.stopped")
        naive.append({"role": "user", "content": BARGE_IN})
        self.say("caller", BARGE_IN, "cyan")
        self.info(f"the caller heard only: {HEARD_1!r}")
        self.info("a typical agent cancels the reply's work here; calltape's book_table policy is 'finish'")
        outcome = await booking
        self.info(f"book_table returned after the barge-in: {outcome.output} (a late result)")
        return naive

    async def _compare(self, call: CallSession, naive: list[dict[str, Any]]) -> None:
        self.section("What the next LLM request would contain")
        left = Table(box=None, show_header=False, pad_edge=False)
        left.add_column(style="dim", no_wrap=True)
        left.add_column()
        for message in naive[1:]:
            content = message.get("content") or ""
            line = Text(repr(content))
            if message.get("tool_calls"):
                line.append("\n+ tool_call book_table", "bold")
                line.append("\n  (no result: the task was cancelled at the barge-in)", "red")
            left.add_row(message["role"], line)
        right = Table(box=None, show_header=False, pad_edge=False)
        right.add_column(style="dim", no_wrap=True)
        right.add_column()
        for message in call.context("openai")[1:]:
            if message["role"] == "tool":
                right.add_row("tool", Text(message["content"], style="green"))
                continue
            line = Text(repr(message.get("content") or ""))
            if message.get("tool_calls"):
                line.append("\n+ tool_call book_table", "bold")
            right.add_row(message["role"], line)
        grid = Table.grid(expand=True, padding=(0, 2))
        grid.add_column(ratio=1)
        grid.add_column(ratio=1)
        grid.add_row(
            Panel(left, title="naive in-memory history", border_style="red"),
            Panel(right, title="calltape context (openai format)", border_style="green"),
        )
        self.console.print(grid)
        self.bad("naive: claims the agent said a sentence the caller never heard")
        self.bad("naive: a tool_call without a tool message: the API rejects it, or the LLM books again")
        self.good("calltape: the assistant turn is what was heard, marked interrupted")
        self.good("calltape: the booking's late result sits right after its call: BK-1042 is not lost")

    async def _crash(self, zombie: CallSession, release: asyncio.Event) -> asyncio.Task[Any]:
        self.section("The agent answers, starts updating the booking… and its process freezes")
        zombie.emit("agent.reply.started", {"reply": "r2"})
        zombie.emit("agent.text", {"reply": "r2", "text": REPLY_2})
        arguments = {"reference": "BK-1042", "people": 4}
        zombie.emit(
            "tool.call", {"call": "call_update", "name": "update_booking", "arguments": arguments, "reply": "r2"}
        )
        zombie.emit("agent.reply.done", {"reply": "r2"})
        zombie.emit("agent.speech.started", {"reply": "r2"})
        zombie.emit("agent.speech.progress", {"reply": "r2", "heard": HEARD_2})
        self.say("agent", REPLY_2, "white")

        asked = asyncio.Event()

        async def update_booking(progress: Any) -> dict[str, Any]:
            progress({"step": "change_requested", "reference": "BK-1042"}, "asked the restaurant for 4 seats")
            asked.set()
            await release.wait()  # frozen: a GC pause, a hung socket, a stuck event loop…
            return {"reference": "BK-1042", "people": 4}

        task = asyncio.create_task(zombie.run_tool("call_update", "update_booking", arguments, update_booking))
        await asked.wait()  # the tool has started and reported progress (however slow the machine is)
        self.info("→ update_booking(reference=BK-1042, people=4) started; playout cut after: " + repr(HEARD_2))
        return task

    async def _drop(self, store: EventStore) -> int:
        event = make_event(self.session, "session.dropped", {"reason": "agent process stopped answering"})
        (stored,) = await store.append([event])
        self.bad("the media server loses the agent and records session.dropped")
        return stored.seq or 0

    async def _resume(self, store: EventStore) -> None:
        self.section("resume: a new agent takes the call with the settled context")
        plan = await resume(store, self.session, "concierge-v2", tools={"update_booking": ToolSpec()})
        self.info(
            f"checkpoint (last clean seq) {plan.checkpoint_seq} · new epoch {plan.epoch} · "
            f"session.resumed at seq {plan.resumed_at_seq}"
        )
        for tool in plan.tools:
            summary = f"{tool.name} [{tool.call_id}]: {tool.status} → decision {tool.decision!r}"
            if tool.has_progress:
                summary += f", last progress {tool.progress}"
            self.console.print(Text.assemble(("  • ", "bold yellow"), summary))
        fold = await build_context(store, self.session)
        items = Table(box=None, show_header=False, pad_edge=False)
        items.add_column(style="dim", no_wrap=True)
        items.add_column()
        for message in render(fold.native(), "openai")[1:]:
            if message["role"] == "tool":
                items.add_row("tool", Text(message["content"], style="green"))
                continue
            line = Text(repr(message.get("content") or ""))
            for tc in message.get("tool_calls") or []:
                line.append(f"\n+ tool_call {tc['function']['name']} {tc['function']['arguments']}", "bold")
            items.add_row(message["role"], line)
        self.console.print(Panel(items, title="the context concierge-v2 starts with", border_style="green"))
        self.info("what was heard is kept, the booking's result stays, and the update may or may not have run:")
        self.info("it is marked 'unknown' with its last progress, and never re-run blindly")

    async def _fence(self, zombie_task: asyncio.Task[Any], release: asyncio.Event) -> None:
        self.section("The frozen process wakes up and writes its result")
        release.set()
        try:
            await zombie_task
        except CalltapeError as exc:
            self.good(f"fenced: {exc}")
        else:  # pragma: no cover - the store enforces fencing
            self.bad("the zombie's write went through")
        self.info("the log stays the new agent's: no stale result, no double update")

    async def _carry_on(self, store: EventStore, tools: dict[str, ToolSpec]) -> int:
        self.section("concierge-v2 carries on")
        recorder = await Recorder(store).start()
        try:
            call = await CallSession.attach(recorder, self.session, tools=tools)
            text = (
                "Sorry, I lost you for a second. Your table is booked, reference BK-1042; "
                "I'm checking that the change to four people went through."
            )
            call.emit("agent.reply.started", {"reply": "r3"})
            call.emit("agent.text", {"reply": "r3", "text": text})
            call.emit("agent.reply.done", {"reply": "r3"})
            call.emit("agent.speech.started", {"reply": "r3"})
            call.emit("agent.speech.ended", {"reply": "r3", "interrupted": False})
            self.say("agent", text, "white")
            call.emit("user.text", {"text": "Great, thank you!"})
            self.say("caller", "Great, thank you!", "cyan")
            await call.end("completed")
            await recorder.flush()
        finally:
            await recorder.close()
        return await _last_seq(store, self.session)

    def _inspect(self, barge_seq: int, crash_seq: int, end_seq: int) -> None:
        self.section("Inspect what was recorded")
        db = f" --db {shlex.quote(self.url)}" if self.url else ""
        s = self.session
        commands = [
            (f"calltape{db} show {s}", "the timeline: lanes, heard vs generated, late result, drop, resume"),
            (
                f"calltape{db} context {s} --at {barge_seq} --format openai",
                "the context after the barge-in and the late result",
            ),
            (
                f"calltape{db} diff {s} --at {crash_seq} --vs-at {end_seq}",
                "the context at the crash vs after the resume",
            ),
            (f"calltape{db} stats {s}", "tool outcomes and the recoveries calltape performed"),
        ]
        rows = Table.grid(padding=(0, 2))
        rows.add_column(no_wrap=True, style="bold")
        rows.add_column(style="dim")
        for command, what in commands:
            rows.add_row(command, what)
        self.console.print(Group(rows))
        self.console.print()


async def _last_seq(store: EventStore, session: str) -> int:
    info = await store.session_info(session)
    return info.last_seq if info is not None else 0


def _where(store: EventStore) -> str:
    from calltape.eventstore.errors import where

    return where(store.url)


async def run_demo(url: str | None = None, console: Console | None = None) -> str:
    """Runs the demo against ``url`` (default: the embedded database); returns the session id."""
    resolve_url(url)  # a bad URL fails before any output
    logger = logging.getLogger("calltape")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # the demo narrates recoveries itself
    try:
        demo = _Demo(console or Console(highlight=False), url)
        await demo.run()
        return demo.session
    finally:
        logger.setLevel(level)
