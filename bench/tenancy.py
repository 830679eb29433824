"""What tenant isolation costs on PostgreSQL: the application role held by row-level security against the
operator's superuser on the same scratch database, in the same process.

    python -m bench.tenancy [ADMIN_URL]       # about a minute

Appends: 40 sessions, 20 batches each of 50 events, written through ``store.append`` by a store opened for
tenant ``acme`` on a role prepared by ``db upgrade --grant`` (row-level security checks each row, and
PostgreSQL refuses COPY under it, so it appends with INSERT … SELECT unnest) and by the operator's store
(every tenant, superuser: COPY, no policy). The rounds alternate, the figure is the median of 5 rounds per
side, reported as the ratio tenant / operator. Feed: reading the whole log back through ``store.feed`` in
pages of 1000, the same way. Another tenant's rows are in the log too (as many again), so the tenant's
reads also pay for skipping them.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid

import asyncpg
from sqlalchemy.engine import make_url

from bench.db import DEFAULT_ADMIN_URL, plain_dsn, scratch_database
from calltape.events import Event, make_event
from calltape.eventstore import EventStore, open_store, upgrade
from calltape.eventstore.tenancy import ALL_TENANTS

SESSIONS, BATCHES, EVENTS = 40, 20, 50


def _batches(prefix: str, tenant: str | None) -> list[list[Event]]:
    batches: list[list[Event]] = []
    for s in range(SESSIONS):
        session = f"{prefix}-{s}"
        data = {"agent": "triage", **({"tenant": tenant} if tenant else {})}
        first = [make_event(session, "session.started", data)]
        for b in range(BATCHES):
            events = [
                make_event(session, "user.transcript", {"text": f"words {i}", "final": False}) for i in range(EVENTS)
            ]
            batches.append(first + events if b == 0 else events)
    return batches


async def _append_seconds(store: EventStore, batches: list[list[Event]]) -> float:
    t0 = time.perf_counter()
    for batch in batches:
        await store.append(batch)
    return time.perf_counter() - t0


async def _feed_seconds(store: EventStore) -> tuple[float, int]:
    t0 = time.perf_counter()
    position, count = None, 0
    while True:
        page = await store.feed(position, limit=1000)
        if not page:
            return time.perf_counter() - t0, count
        count += len(page)
        position = page[-1][0]


async def measure(admin_url: str, rounds: int = 5) -> dict[str, float]:
    """Seconds per event appended and read, for the tenant and for the operator, and their ratios."""
    async with scratch_database(admin_url) as scratch:
        role = f"calltape_tenants_bench_{uuid.uuid4().hex[:6]}"
        admin = await asyncpg.connect(plain_dsn(scratch.url))
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        try:
            await upgrade(scratch.url, grant=role)
            app_url = make_url(scratch.url).set(username=role).render_as_string(hide_password=False)
            tenant = await open_store(app_url, tenant="acme")
            operator = await open_store(scratch.url, tenant=ALL_TENANTS)  # writes and reads every tenant
            try:
                appends: dict[str, list[float]] = {"tenant": [], "operator": []}
                reads: dict[str, list[float]] = {"tenant": [], "operator": []}
                for r in range(rounds):
                    n = SESSIONS * BATCHES * EVENTS
                    appends["tenant"].append(await _append_seconds(tenant, _batches(f"t{r}", None)) / n)
                    appends["operator"].append(await _append_seconds(operator, _batches(f"o{r}", "globex")) / n)
                    for name, store in (("tenant", tenant), ("operator", operator)):
                        seconds, count = await _feed_seconds(store)
                        reads[name].append(seconds / count)
                report = {
                    "append_us_tenant": statistics.median(appends["tenant"]) * 1e6,
                    "append_us_operator": statistics.median(appends["operator"]) * 1e6,
                    "feed_us_tenant": statistics.median(reads["tenant"]) * 1e6,
                    "feed_us_operator": statistics.median(reads["operator"]) * 1e6,
                }
                report["append_ratio"] = report["append_us_tenant"] / report["append_us_operator"]
                report["feed_ratio"] = report["feed_us_tenant"] / report["feed_us_operator"]
                return report
            finally:
                await tenant.close()
                await operator.close()
        finally:
            await admin.execute(f'DROP OWNED BY "{role}"')
            await admin.execute(f'DROP ROLE "{role}"')  # roles are cluster-wide: never leave one behind
            await admin.close()


def main(argv: list[str]) -> None:
    """Prints the figures (microseconds per event) and the tenant / operator ratios."""
    report = asyncio.run(measure(argv[0] if argv else DEFAULT_ADMIN_URL))
    for name, value in report.items():
        print(f"{name:22} {value:8.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
