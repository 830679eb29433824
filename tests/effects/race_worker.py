"""One agent process of the two-process race (test_effect_race.py): attaches to the session, waits for
"go" on stdin, then asks for the same effects under its own call ids and prints what it got."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import orjson

import calltape
from calltape.eventstore import open_store
from calltape.eventstore.recorder import Recorder
from calltape.runtime import CallSession


def charge_tool(order: str, me: str, ledger: Path) -> Any:
    """The guarded tool's body: charges ``order`` through an effect (a body without parameters)."""

    async def charge() -> dict[str, str]:
        with ledger.open("a") as book:  # the real system: one line per charge
            book.write(f"{order} {me}\n")
        await asyncio.sleep(0.2)
        return {"order": order, "charged_by": me}

    async def body() -> Any:
        return await calltape.effect("charge", order, charge)

    return body


async def main(url: str, session: str, ledger: Path, rounds: int) -> None:
    store = await open_store(url)
    recorder = await Recorder(store).start()
    call = await CallSession.attach(recorder, session)
    me = f"p{os.getpid()}"
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    outputs: list[Any] = []
    for n in range(rounds):
        order = f"order-{n}"
        body = charge_tool(order, me, ledger)
        cid = f"{me}-c{n}"
        call.emit("tool.call", {"call": cid, "name": "charge_card", "arguments": {"order": order}})
        outcome = await call.run_tool(cid, "charge_card", {"order": order}, body)
        outputs.append({"status": outcome.status, "output": outcome.output})
    await recorder.close()
    await store.close()
    print(orjson.dumps(outputs).decode(), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])))
