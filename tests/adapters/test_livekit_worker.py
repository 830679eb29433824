"""The LiveKit worker recipe (examples/livekit_worker.py, shown in docs/guides/livekit.md) runs its
entrypoint as a worker would, offline: the call goes on after the entrypoint returns (so the connect
object must outlive ``session.start``) and is recorded to its end when the job shuts down."""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import AgentSession
from livekit.agents.types import NOT_GIVEN

from calltape.eventstore import open_store
from tests.adapters.livekit_support import ScriptedLLM, Step

pytestmark = pytest.mark.livekit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "livekit_worker.py"


class Job:
    """The part of LiveKit's ``JobContext`` the entrypoint uses: no room (offline: LiveKit's own
    "not given", so the session has no room I/O), shutdown callbacks."""

    room = NOT_GIVEN

    def __init__(self) -> None:
        self.on_shutdown: list[Callable[[], Awaitable[None]]] = []

    def add_shutdown_callback(self, callback: Callable[[], Awaitable[None]]) -> None:
        self.on_shutdown.append(callback)

    async def shutdown(self) -> None:
        for callback in self.on_shutdown:
            await callback()


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("livekit_worker", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_call_outlives_the_entrypoint_and_ends_with_the_job(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALLTAPE_DATABASE_URL", store_url)
    worker = load_example()
    sessions: list[AgentSession[Any]] = []

    def offline_session() -> AgentSession[Any]:  # the example's STT/LLM/TTS need the network
        sessions.append(AgentSession(llm=ScriptedLLM([Step("Parking is free.")])))
        return sessions[0]

    monkeypatch.setattr(worker, "new_session", offline_session)
    job = Job()
    known = await open_store(store_url)
    try:
        before = {s.session for s in await known.sessions()}
    finally:
        await known.close()
    await worker.entrypoint(job)
    # The entrypoint has returned; the caller goes on talking, and calltape goes on recording.
    await sessions[0].generate_reply(user_input="Is there parking?")
    await job.shutdown()

    store = await open_store(store_url)
    try:
        # the store may hold other tests' calls (PostgreSQL): this test's is the one not there before
        (info,) = [s for s in await store.sessions() if s.session not in before]
        events = await store.read(info.session)
    finally:
        await store.close()
    kinds = [e.type for e in events]
    assert kinds[0] == "session.started" and events[0].data["framework"] == "livekit"
    said = [e.data["text"] for e in events if e.type in ("agent.text", "user.transcript", "user.text")]
    assert "Hello, you are through to the booking line." in "".join(said)
    assert "Is there parking?" in said and "Parking is free." in "".join(said)
    assert kinds[-1] == "session.ended", kinds[-3:]
