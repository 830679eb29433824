"""Guarded tools that need approval (the SDK's ``needs_approval``): the session asks the app, and the
tool starts from the app's ``session.approve_tool_call``, not from the model listener. The tap wraps
that method so the guarded tool still finds its call there (``_watch_approvals``): these tests fail
without it (the approved body would run unguarded, with nothing in the log)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

pytest.importorskip("agents.realtime.testing")

from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner, RealtimeSession
from agents.realtime.model_inputs import RealtimeModelSendToolOutput
from agents.realtime.testing import ScriptedRealtimeModel

import calltape
from calltape.adapters.openai_agents import NOT_RUN, attach, restore
from tests.adapters.openai_agents_support import (
    ask_tool,
    call_in_open_response,
    data_of,
    logged,
    raw,
    sent,
    tool_output_echo,
    until,
)

pytestmark = [
    pytest.mark.openai_agents,
    pytest.mark.skipif(
        not all(hasattr(RealtimeSession, m) for m in ("approve_tool_call", "reject_tool_call")),
        reason="this openai-agents has no realtime tool approvals",
    ),
]


def approval_agent(runs: list[str], *, store: Any = None, session_id: str = "") -> RealtimeAgent[Any]:
    """An agent whose one tool, ``book``, needs the app's approval before each call."""

    @function_tool(needs_approval=True)
    async def book(when: str) -> str:
        """Books a table (only once the app approved the call)."""
        if store is not None:  # a guarded body runs only once its start is committed
            types = [e.type for e in await store.read(session_id)]
            runs.append(f"started durable: {'tool.started' in types}")
        runs.append(when)
        return f"booked for {when}"

    return RealtimeAgent(name="concierge", instructions="You book tables.", tools=[book])


class Approvals:
    """The app's side: drains the session's events and keeps the approval requests (by call id)."""

    def __init__(self, session: RealtimeSession) -> None:
        self.asked: list[str] = []
        self._task = asyncio.get_running_loop().create_task(self._drain(session))

    async def _drain(self, session: RealtimeSession) -> None:
        async for event in session:
            if event.type == "tool_approval_required":
                self.asked.append(event.call_id)

    async def close(self) -> None:
        """Stops draining (before the session closes)."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def _ask(model: ScriptedRealtimeModel, response: str = "r1", call_id: str = "c1") -> None:
    await ask_tool(model, response, call_id, "book", '{"when": "19:00"}', "Let me check.", 500)


async def test_an_approved_call_runs_guarded_once(store_url: str, session_id: str) -> None:
    runs: list[str] = []
    model = ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(approval_agent(runs, store=ct.store, session_id=session_id), model=model).run()
        await attach(session, ct, session_id)
        async with session:
            app = Approvals(session)
            await _ask(model)
            await until(lambda: app.asked == ["c1"])
            await asyncio.sleep(0.05)
            assert runs == [] and not sent(model, RealtimeModelSendToolOutput)  # waits for the app
            assert not data_of(await logged(ct, session_id), "tool.started")

            await session.approve_tool_call("c1")
            await until(lambda: sent(model, RealtimeModelSendToolOutput))
            await model.emit(*tool_output_echo(sent(model, RealtimeModelSendToolOutput)[0], "f_c1"))

            await session.approve_tool_call("c1")  # approved again: nothing pending
            await _ask(model, "r2", "c1")  # the model repeats the call id
            await asyncio.sleep(0.1)
            assert app.asked == ["c1"]
            await app.close()
        events = await logged(ct, session_id)
        native = (await ct.context(session_id)).native()
    assert runs == ["started durable: True", "19:00"]  # ran once, guarded
    (output,) = sent(model, RealtimeModelSendToolOutput)
    assert output.tool_call.call_id == "c1" and output.output == "booked for 19:00"
    assert [d["call"] for d in data_of(events, "tool.started")] == ["c1"]
    assert data_of(events, "tool.result") == [{"call": "c1", "output": "booked for 19:00"}]
    assert not data_of(events, "tool.cancelled")
    outputs = [i for i in native["items"] if i["type"] == "function_call_output"]
    assert [(o["call_id"], o["output"]) for o in outputs] == [("c1", "booked for 19:00")]


async def test_a_rejected_call_never_starts(store_url: str, session_id: str) -> None:
    runs: list[str] = []
    model = ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(approval_agent(runs), model=model).run()
        await attach(session, ct, session_id)
        async with session:
            app = Approvals(session)
            await _ask(model)
            await until(lambda: app.asked == ["c1"])
            await session.reject_tool_call("c1")
            await until(lambda: sent(model, RealtimeModelSendToolOutput))
            await model.emit(*tool_output_echo(sent(model, RealtimeModelSendToolOutput)[0], "f_c1"))
            await session.approve_tool_call("c1")  # too late: nothing pending
            await asyncio.sleep(0.05)
            await app.close()
        events = await logged(ct, session_id)
    assert runs == []
    (rejection,) = sent(model, RealtimeModelSendToolOutput)  # what the model is told instead
    assert not data_of(events, "tool.started")
    assert data_of(events, "tool.result") == [{"call": "c1", "output": rejection.output}]


async def test_an_approved_call_of_a_cancelled_response_is_not_run(store_url: str, session_id: str) -> None:
    """The call's response was cancelled (a barge-in) while the app was deciding: approving it then
    answers at once that it was not run (the response is over: no wait for it)."""
    runs: list[str] = []
    model = ScriptedRealtimeModel(strict=False)

    args = '{"when": "19:00"}'
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(approval_agent(runs), model=model).run()
        await attach(session, ct, session_id)
        async with session:
            app = Approvals(session)
            await model.emit(*call_in_open_response("r1", "c1", "book", args, "f1"))
            await until(lambda: app.asked == ["c1"])
            await model.emit(raw(type="response.done", response={"id": "r1", "status": "cancelled"}))
            await session.approve_tool_call("c1")
            await until(lambda: sent(model, RealtimeModelSendToolOutput), timeout=2)
            await app.close()
        events = await logged(ct, session_id)
    assert runs == []
    assert sent(model, RealtimeModelSendToolOutput)[0].output == NOT_RUN
    assert not data_of(events, "tool.started")


async def test_an_approved_call_the_log_answered_is_not_run_again(store_url: str, session_id: str) -> None:
    """A dropped call restored into a new session: the model repeats a call id the log already
    answered, the new session asks again, the app approves, and the guarded tool answers from the log."""
    runs: list[str] = []
    first = ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        session = await RealtimeRunner(approval_agent(runs), model=first).run()
        tap = await attach(session, ct, session_id)
        async with session:
            app = Approvals(session)
            await _ask(first)
            await until(lambda: app.asked == ["c1"])
            await session.approve_tool_call("c1")
            await until(lambda: sent(first, RealtimeModelSendToolOutput))
            await app.close()
            assert tap.live is not None
            await tap.live.drop("network")
        await ct.recorder.flush()

    second = ScriptedRealtimeModel(strict=False)
    async with calltape.connect(store_url) as ct:
        async with restore(RealtimeRunner(approval_agent(runs), model=second), ct, session_id) as restored:
            app = Approvals(restored)
            await _ask(second, "r2", "c1")
            await until(lambda: app.asked == ["c1"])
            await restored.approve_tool_call("c1")
            await until(lambda: sent(second, RealtimeModelSendToolOutput))
            await app.close()
        events = await logged(ct, session_id)
    assert runs == ["19:00"]  # once, in the first session
    assert sent(second, RealtimeModelSendToolOutput)[0].output == "booked for 19:00"
    assert [d["call"] for d in data_of(events, "tool.started")] == ["c1"]
    assert [d["call"] for d in data_of(events, "tool.result")] == ["c1"]
