"""A v0.1 database (the schema at the first migration revision) with calls in it upgrades in place to the
current schema on both backends, and every call stays readable, continues, resumes and can be erased."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa
from eventstore_support import at_revision
from sqlalchemy.ext.asyncio import create_async_engine

from calltape.events import make_event
from calltape.eventstore import open_store, resolve_url, upgrade
from calltape.eventstore.tenancy import ALL_TENANTS
from calltape.migrations import head_revision
from calltape.projections import build_context
from calltape.runtime import resume

T0 = 1_735_810_000_000
V01_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("session.started", {"agent": "triage", "tenant": "acme"}),
    ("user.transcript", {"text": "Book a table for two", "final": True}),
    ("agent.reply.started", {"reply": "r1"}),
    ("agent.text", {"reply": "r1", "text": "Booking it now."}),
    ("session.dropped", {"reason": "agent crashed"}),
]


async def _a_v01_database_with_a_call(url: str, session: str) -> None:
    """Migrates only to revision 0001 and writes a call there with plain SQL, as v0.1 stored it."""
    await at_revision(url, "0001")
    engine = create_async_engine(resolve_url(url))
    try:
        async with engine.begin() as conn:
            data = "CAST(:data AS jsonb)" if conn.dialect.name == "postgresql" else ":data"
            for seq, (kind, body) in enumerate(V01_EVENTS, start=1):
                await conn.execute(
                    sa.text(
                        "INSERT INTO ct_events (session, seq, id, type, at_ms, agent, epoch, data) "
                        f"VALUES (:session, :seq, :id, :type, :at_ms, 'triage', 1, {data})"
                    ),
                    {
                        "session": session,
                        "seq": seq,
                        "id": f"v01-{seq}",
                        "type": kind,
                        "at_ms": T0 + seq * 1000,
                        "data": orjson.dumps(body).decode(),
                    },
                )
            await conn.execute(
                sa.text(
                    "INSERT INTO ct_sessions (session, agent, tenant, modality, framework, status, last_seq, epoch, "
                    "first_at_ms, last_at_ms, started) VALUES (:session, 'triage', 'acme', 'voice', NULL, 'dropped', "
                    ":n, 1, :first, :last, :started)"
                ),
                {
                    "session": session,
                    "n": len(V01_EVENTS),
                    "first": T0 + 1000,
                    "last": T0 + len(V01_EVENTS) * 1000,
                    "started": True,
                },
            )
    finally:
        await engine.dispose()


async def _upgrades_with_the_call_kept(url: str, session: str) -> None:
    await _a_v01_database_with_a_call(url, session)
    assert await upgrade(url) == ("0001", head_revision())
    async with await open_store(url) as untenanted:  # the call is tenant acme's: not in the no-tenant group
        assert await untenanted.session_info(session) is None
    store = await open_store(url, tenant=ALL_TENANTS)
    try:
        events = await store.read(session)
        assert [(e.seq, e.id, e.type, e.data) for e in events] == [
            (seq, f"v01-{seq}", kind, body) for seq, (kind, body) in enumerate(V01_EVENTS, start=1)
        ]
        info = await store.session_info(session)
        assert info is not None and (info.status, info.last_seq, info.epoch, info.tenant) == ("dropped", 5, 1, "acme")
        fold = await build_context(store, session)
        assert fold.dropped and fold.seq == 5
        plan = await resume(store, session, "rescue")  # the kept call resumes on the new schema
        assert plan.epoch == 2 and plan.checkpoint_seq <= 5
        (more,) = await store.append([make_event(session, "user.text", {"text": "still here"}, epoch=2)])
        assert more.seq == (await store.session_info(session)).last_seq  # type: ignore[union-attr]
        assert await store.erase(session) == more.seq  # and the new schema's erasure covers it
    finally:
        await store.close()


async def test_a_v01_sqlite_database_keeps_its_calls(tmp_path: Path) -> None:
    await _upgrades_with_the_call_kept(f"sqlite:///{tmp_path}/v01.db", "v01-call")


async def test_a_v01_postgres_database_keeps_its_calls(empty_pg: str) -> None:
    await _upgrades_with_the_call_kept(empty_pg, "v01-call")
