"""``calltape resume`` against a call whose old agent is still writing, and a second resume."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from calltape.errors import FencedWrite
from calltape.events import make_event
from calltape.eventstore import open_store
from tests.cli.conftest import Cli, assert_error, barge_in_call, jsonl


def _writer(url: str, session: str, stop: threading.Event, outcome: dict[str, object]) -> None:
    """The old agent, still alive: appends user text at epoch 1, about 50 events a second (a busy
    voice call), until it is fenced."""

    async def write() -> None:
        store = await open_store(url)
        try:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    await store.append([make_event(session, "user.text", {"text": f"still here {n}"}, epoch=1)])
                except FencedWrite:
                    outcome["fenced_after"] = n
                    return
                await asyncio.sleep(0.02)
        finally:
            await store.close()

    asyncio.run(write())


def test_resume_wins_against_a_writer_still_appending(
    cli: Cli, store_url: str, tmp_path: Path, session_id: str
) -> None:
    for round_ in range(3):
        s = f"{session_id}-{round_}"
        events = barge_in_call(s)[:-1]  # no drop: the old agent is alive and writing
        path = tmp_path / f"{s}.jsonl"
        path.write_bytes(jsonl(events))
        assert cli("import", str(path)).code == 0
        stop, outcome = threading.Event(), {}
        writer = threading.Thread(target=_writer, args=(store_url, s, stop, outcome))
        writer.start()
        try:
            result = cli("resume", s, "--agent", "rescuer")
        finally:
            writer.join(60)
            stop.set()
        assert result.code == 0, result
        plan = result.json()
        assert plan["epoch"] == 2 and plan["agent"] == "rescuer", plan
        assert "fenced_after" in outcome, "the old writer was never fenced"
        # the log agrees: the plan's resume is there, nothing of epoch 1 after it
        exported = cli("export", s).lines()
        resumed = [e for e in exported if e["type"] == "session.resumed"]
        assert len(resumed) == 1 and resumed[0]["seq"] == plan["resumed_at_seq"]
        assert all(e.get("epoch") != 1 for e in exported if e["seq"] > plan["resumed_at_seq"])


def test_a_live_resumed_call_is_not_taken_over_by_default(cli: Cli, tmp_path: Path, session_id: str) -> None:
    s = session_id
    path = tmp_path / "call.jsonl"
    path.write_bytes(jsonl(barge_in_call(s)))  # ends with session.dropped
    assert cli("import", str(path)).code == 0
    # two operators resume the dropped call at once: exactly one wins, the other is refused
    first, second = cli.many(["resume", s, "--agent", "a"], ["resume", s, "--agent", "b"])
    winners = [r for r in (first, second) if r.code == 0]
    losers = [r for r in (first, second) if r.code != 0]
    assert len(winners) == 1 and len(losers) == 1, (first, second)
    winner = winners[0].json()["agent"]
    assert_error(losers[0], f"was already resumed by agent '{winner}' (epoch 2)", "--take-over")
    taken = cli("resume", s, "--agent", "c", "--take-over")
    assert taken.code == 0 and taken.json()["epoch"] == 3, taken
    # once the resumed agent drops too, a plain resume is allowed again
    drop = tmp_path / "drop.jsonl"
    drop.write_bytes(jsonl([{"session": s, "type": "session.dropped", "epoch": 3, "data": {}}]))
    assert cli("import", str(drop)).code == 0
    again = cli("resume", s, "--agent", "d")
    assert again.code == 0 and again.json()["epoch"] == 4, again
