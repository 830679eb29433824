"""Tenants kept apart (SPEC section 6). On PostgreSQL the database does it: these tests connect as a real
non-superuser role prepared by ``upgrade(grant=…)`` and run raw SQL on the same connection calltape uses,
so a query without any tenant filter still sees one tenant only. SQLite filters in calltape."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from eventstore_support import asyncpg_dsn, at_revision, raw_pg, started, text, texts
from sqlalchemy import text as sa_text
from sqlalchemy.engine import make_url

from calltape.errors import CalltapeError, SessionErased, SessionNotFound, TenantRefused
from calltape.eventstore import open_store, upgrade
from calltape.eventstore.bulk import ImportRefused, bulk_import
from calltape.eventstore.citus import tenant_scope
from calltape.eventstore.connect import create_engine, resolve_url
from calltape.eventstore.postgres import _NotifyWaiter
from calltape.eventstore.store import EventStore
from calltape.eventstore.tenancy import ALL_TENANTS
from calltape.migrations import HEAD

CITUS = bool(os.environ.get("CALLTAPE_TEST_CITUS_URL"))


def one_sentence(message: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message


async def _admin(url: str, *statements: str) -> None:
    conn = await raw_pg(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def app_role(pg_url: str) -> Iterator[str]:
    """A real application role (LOGIN, no superuser, no BYPASSRLS) prepared by ``db upgrade --grant``;
    dropped afterwards. Yields its database URL."""
    role = f"calltape_tenants_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(pg_url, f'CREATE ROLE "{role}" LOGIN'))
    try:
        asyncio.run(upgrade(pg_url, grant=role))
        yield make_url(pg_url).set(username=role, password=None).render_as_string(hide_password=False)
    finally:
        asyncio.run(_admin(pg_url, f'DROP OWNED BY "{role}"', f'DROP ROLE "{role}"'))


async def as_tenant(url: str, tenant: str | None) -> asyncpg.Connection:
    """A raw connection started the way calltape starts its own (the tenant setting, nothing else)."""
    return await asyncpg.connect(asyncpg_dsn(url), server_settings={"calltape.tenant": tenant or ""})


@contextlib.asynccontextmanager
async def held(conn: asyncpg.Connection, tenant: str) -> AsyncIterator[None]:
    """A transaction of raw SQL run as calltape runs its own: on Citus its first statement hands the
    tenant to the workers (``SET LOCAL``, see calltape/eventstore/citus.py); on one node the
    connection-start setting is enough."""
    async with conn.transaction():
        if CITUS:
            await conn.execute(tenant_scope(tenant))
        yield


@pytest.fixture
def ids() -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    return {"a": f"a-{tag}", "b": f"b-{tag}", "none": f"n-{tag}", "ta": f"acme-{tag}", "tb": f"globex-{tag}"}


async def seed(url: str, ids: dict[str, str]) -> None:
    """As the operator (every tenant; a superuser on PostgreSQL): one session per tenant and one without."""
    async with await open_store(url, tenant=ALL_TENANTS) as store:
        await store.append([started(ids["a"], tenant=ids["ta"]), text(ids["a"], "for acme")])
        await store.append([started(ids["b"], tenant=ids["tb"]), text(ids["b"], "for globex")])
        await store.append([started(ids["none"]), text(ids["none"], "for nobody")])
        for key in ("a", "b", "none"):
            await store.save_snapshot(ids[key], 2, 1, b"state")
            await store.save_snapshot_segments(ids[key], 1, [(-3, b"segment")])
        # The feed hands out what is below the horizon, which any open transaction on the server holds
        # back (on a shared Citus coordinator, other databases' too): wait until the seed is below it, so
        # the tests' heads start after it.
        for _ in range(200):
            if len(await store.feed(session=ids["none"])) == 2:
                break
            await asyncio.sleep(0.05)


# -- the database enforces it: raw SQL as a non-superuser role ----------------------------------------


async def test_raw_sql_as_a_tenant_sees_only_its_rows(pg_url, app_role, ids):
    await seed(pg_url, ids)
    conn = await as_tenant(app_role, ids["ta"])
    try:
        mine = {ids["a"]}
        async with held(conn, ids["ta"]):
            for table in ("ct_events", "ct_sessions", "ct_snapshots"):
                rows = await conn.fetch(f"SELECT DISTINCT session FROM {table}")
                assert {r[0] for r in rows} == mine, table
            assert await conn.fetchval("SELECT count(*) FROM ct_events WHERE session = $1", ids["b"]) == 0
        # Writes: another tenant's rows, or rows under another tenant's session id, are refused.
        refused = [
            (
                "INSERT INTO ct_sessions (session, tenant, status, last_seq, epoch) VALUES ($1, $2, 'active', 0, 1)",
                (f"{ids['b']}-new", ids["tb"]),
            ),
            (
                "INSERT INTO ct_events (session, seq, id, type, at_ms, data) "
                "VALUES ($1, 99, 'x', 'user.text', 0, '{}')",
                (ids["b"],),
            ),
            (
                "INSERT INTO ct_snapshots (session, version, seq, state, created_at_ms) VALUES ($1, 9, 9, 'x', 0)",
                (ids["b"],),
            ),
            ("UPDATE ct_sessions SET tenant = $1 WHERE session = $2", (ids["tb"], ids["a"])),
        ]
        for sql, args in refused:
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
                async with held(conn, ids["ta"]):
                    await conn.execute(sql, *args)
        # Updates and deletes without a WHERE clause touch this tenant's rows only.
        with pytest.raises(ZeroDivisionError):
            async with held(conn, ids["ta"]):
                assert await conn.execute("UPDATE ct_events SET agent = 'x'") == "UPDATE 2"
                assert await conn.execute("DELETE FROM ct_events") == "DELETE 2"
                raise ZeroDivisionError  # rolled back
    finally:
        await conn.close()
    async with await open_store(pg_url, tenant=ALL_TENANTS) as operator:
        assert [e.data.get("text") for e in await operator.read(ids["b"])] == [None, "for globex"]


async def test_raw_sql_without_a_tenant_sees_only_sessions_without_one(pg_url, app_role, ids):
    await seed(pg_url, ids)
    conn = await as_tenant(app_role, None)
    try:
        for table in ("ct_events", "ct_sessions", "ct_snapshots"):
            found = {r[0] for r in await conn.fetch(f"SELECT DISTINCT session FROM {table}")}
            assert ids["none"] in found and not found & {ids["a"], ids["b"]}, table
    finally:
        await conn.close()


async def test_the_calltape_connection_itself_holds_the_tenant(pg_url, app_role, ids):
    """Raw SQL on the very connection the store uses (the pool's, the one COPY goes through)."""
    await seed(pg_url, ids)
    async with await open_store(app_role, tenant=ids["ta"]) as store:
        async with store.engine.connect() as sa_conn:  # type: ignore[attr-defined]
            raw = (await sa_conn.get_raw_connection()).driver_connection
            assert await raw.fetchval("SELECT current_setting('calltape.tenant')") == ids["ta"]
            async with held(raw, ids["ta"]):
                assert {r[0] for r in await raw.fetch("SELECT DISTINCT session FROM ct_events")} == {ids["a"]}


async def test_a_tenant_store_refuses_a_role_that_bypasses_row_level_security(pg_url, ids):
    with pytest.raises(CalltapeError) as info:
        await open_store(pg_url, tenant=ids["ta"])
    one_sentence(str(info.value))
    assert "bypasses row-level security" in str(info.value) and "--grant" in str(info.value)


async def test_grant_refuses_a_superuser_and_an_unknown_role(pg_url):
    with pytest.raises(CalltapeError, match="bypasses row-level security"):
        await upgrade(pg_url, grant="postgres")
    with pytest.raises(CalltapeError, match="there is no PostgreSQL role"):
        await upgrade(pg_url, grant=f"calltape_tenants_missing_{uuid.uuid4().hex[:6]}")


async def test_the_app_role_has_no_ownership_and_no_bypass(pg_url, app_role):
    role = make_url(app_role).username
    conn = await raw_pg(pg_url)
    try:
        row = await conn.fetchrow("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = $1", role)
        assert tuple(row) == (False, False)
        owned = await conn.fetchval("SELECT count(*) FROM pg_tables WHERE tableowner = $1", role)
        assert owned == 0
        forced = await conn.fetch(
            "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class WHERE relname = ANY($1)",
            ["ct_sessions", "ct_events", "ct_snapshots", "ct_tombstones"],
        )
        assert {r[0]: (r[1], r[2]) for r in forced} == {
            "ct_sessions": (True, True),
            "ct_events": (True, True),
            "ct_snapshots": (True, True),
            "ct_tombstones": (True, False),
        }
    finally:
        await conn.close()
    app = await as_tenant(app_role, "anyone")
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await app.execute("ALTER TABLE ct_events DISABLE ROW LEVEL SECURITY")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await app.execute("DROP POLICY ct_tenant ON ct_events")
    finally:
        await app.close()


# -- through calltape's API, on both backends -------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def urls(request: pytest.FixtureRequest, tmp_path) -> tuple[str, str]:
    """(the operator's URL, the application's URL): one SQLite file, or PostgreSQL as superuser / app role."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/calltape.db"
        return url, url
    return request.getfixturevalue("pg_url"), request.getfixturevalue("app_role")


@pytest.fixture
async def tenant_a(urls, ids) -> AsyncIterator[EventStore]:
    await seed(urls[0], ids)
    store = await open_store(urls[1], tenant=ids["ta"])
    try:
        yield store
    finally:
        await store.close()


async def test_reads_see_only_the_tenant(tenant_a, ids):
    store = tenant_a
    assert [i.session for i in await store.sessions()] == [ids["a"]]
    assert await store.sessions(tenant=ids["tb"]) == []
    assert (await store.session_info(ids["a"])).tenant == ids["ta"]
    assert await store.session_info(ids["b"]) is None and await store.session_info(ids["none"]) is None
    assert await store.read(ids["b"]) == [] and await store.seq_at_time(ids["b"], 10**15) == 0
    assert await store.load_snapshot(ids["b"], 1) is None
    assert await store.load_snapshot(ids["a"], 1) == (2, b"state")
    assert await store.load_snapshot_segments(ids["b"], 1) == []
    assert await store.load_snapshot_segments(ids["a"], 1) == [(-3, b"segment")]
    feed = await store.feed(limit=100_000)
    assert {e.session for _, e in feed} == {ids["a"]}
    assert await store.feed(session=ids["b"]) == []


async def test_writes_of_another_tenants_session_are_refused(tenant_a, ids, urls):
    store = tenant_a
    for victim in ("b", "none"):
        with pytest.raises(TenantRefused) as info:
            await store.append([text(ids[victim], "intruder")])
        one_sentence(str(info.value))
        assert "belongs to another tenant" in str(info.value)
    with pytest.raises(TenantRefused):
        await store.append([started(f"{ids['a']}-2", tenant=ids["tb"])])
    with pytest.raises(SessionNotFound):
        await store.erase(ids["b"])
    # a snapshot of another tenant's session is not written; of its own, over its stored segment, it is
    assert not await store.save_snapshot_over(ids["b"], 1, [(-4, b"x"), (5, b"header")], set())
    assert await store.save_snapshot_over(ids["a"], 1, [(-4, b"new"), (5, b"header")], {-3})
    assert not await store.save_snapshot_over(ids["a"], 1, [(6, b"header")], {-3, -99})  # a segment it lost
    assert await store.load_snapshot(ids["a"], 1) == (5, b"header")
    async with await open_store(urls[0], tenant=ALL_TENANTS) as operator:
        assert await operator.load_snapshot(ids["b"], 1) == (2, b"state")
        assert await operator.load_snapshot_segments(ids["b"], 1) == [(-3, b"segment")]
        assert [e.data.get("text") for e in await operator.read(ids["b"])] == [None, "for globex"]
        assert [e.data.get("text") for e in await operator.read(ids["none"])] == [None, "for nobody"]
        assert await operator.session_info(f"{ids['a']}-2") is None


_STRAYS = """
SELECT count(*) FROM {table} r JOIN ct_sessions s ON s.session = r.session
WHERE r.session IN ({sessions}) AND ((r.tenant IS NULL) <> (s.tenant IS NULL) OR r.tenant <> s.tenant)
"""


async def test_every_row_carries_its_sessions_tenant(urls, ids):
    """Migration 0005: events and snapshots carry their session's tenant, written on every path (the
    operator's COPY and known-rows statement, the application role's INSERT, snapshots, bulk import)."""
    operator_url, url = urls
    await seed(operator_url, ids)
    fresh = {"acme": f"{ids['a']}-imp", "globex": f"{ids['b']}-imp", "new": f"{ids['b']}-new"}
    async with await open_store(url, tenant=ids["ta"]) as store:
        await store.append(texts(ids["a"], 3, "x"))
        await store.append(texts(ids["a"], 3, "y"))  # the known-rows statement
        await store.append(texts(ids["a"], 250, "z"))  # COPY where the role may
        await store.save_snapshot(ids["a"], 9, 1, b"state")
        assert await store.save_snapshot_over(ids["a"], 1, [(-8, b"segment"), (10, b"header")], {-3})
        async with bulk_import(store) as imp:
            await imp.add([started(fresh["acme"]), *texts(fresh["acme"], 250)])
    async with await open_store(operator_url, tenant=ALL_TENANTS) as operator:
        # A session the operator starts for a tenant: its row is created without one and takes the tenant
        # in the same transaction (on Citus the foreign key is checked at commit, after that).
        await operator.append([started(fresh["new"], tenant=ids["tb"]), text(fresh["new"])])
        await operator.append(texts(fresh["new"], 250))
        async with bulk_import(operator) as imp:
            await imp.add([started(fresh["globex"], tenant=ids["tb"]), *texts(fresh["globex"], 250)])
        assert (await operator.session_info(fresh["globex"])).tenant == ids["tb"]
    sessions = [ids["a"], ids["b"], ids["none"], *fresh.values()]
    listed = ", ".join(f"'{s}'" for s in sessions)
    engine = create_engine(resolve_url(operator_url))
    try:
        async with engine.connect() as conn:
            for table in ("ct_events", "ct_snapshots"):
                query = sa_text(_STRAYS.format(table=table, sessions=listed))
                assert (await conn.execute(query)).scalar() == 0, table
            tenants = sa_text(f"SELECT DISTINCT session, tenant FROM ct_events WHERE session IN ({listed})")
            assert dict((await conn.execute(tenants)).all()) == {
                ids["a"]: ids["ta"],
                ids["b"]: ids["tb"],
                ids["none"]: None,
                fresh["acme"]: ids["ta"],
                fresh["globex"]: ids["tb"],
                fresh["new"]: ids["tb"],
            }
    finally:
        await engine.dispose()


async def test_a_new_session_takes_the_stores_tenant(tenant_a, ids, urls):
    store = tenant_a
    new = f"{ids['a']}-new"
    [first, _] = await store.append([started(new), text(new, "hello")])
    assert first.data["tenant"] == ids["ta"]  # so an export carries it
    assert (await store.session_info(new)).tenant == ids["ta"]
    async with await open_store(urls[0], tenant=ALL_TENANTS) as operator:
        assert (await operator.session_info(new)).tenant == ids["ta"]


async def test_import_of_another_tenants_session_is_refused_and_writes_nothing(tenant_a, ids, urls):
    mine = f"{ids['a']}-imp"
    with pytest.raises((TenantRefused, ImportRefused)) as info:
        async with bulk_import(tenant_a) as imp:
            await imp.add([started(mine), text(mine, "fine")])
            await imp.add([text(ids["b"], "intruder")])
    assert "belongs to another tenant" in str(info.value)
    async with await open_store(urls[0], tenant=ALL_TENANTS) as operator:
        assert await operator.session_info(mine) is None
        assert len(await operator.read(ids["b"])) == 2
    async with bulk_import(tenant_a) as imp:
        assert await imp.add([started(mine), text(mine, "fine")]) == 2
    assert (await tenant_a.session_info(mine)).tenant == ids["ta"]


async def test_erasure_and_tombstones_stay_with_the_tenant(tenant_a, ids, urls):
    assert await tenant_a.erase(ids["a"]) == 2
    assert (await tenant_a.tombstone(ids["a"])).events == 2
    assert await tenant_a.erase(ids["a"]) == 0
    with pytest.raises(SessionErased):
        await tenant_a.append([started(ids["a"])])
    async with await open_store(urls[1], tenant=ids["tb"]) as tenant_b:
        assert await tenant_b.tombstone(ids["a"]) is None
        # The erased id stays erased for every tenant: nobody can bring it back.
        with pytest.raises(SessionErased):
            await tenant_b.append([started(ids["a"])])
    async with await open_store(urls[0], tenant=ALL_TENANTS) as operator:
        assert await operator.session_info(ids["a"]) is None
        assert await operator.load_snapshot(ids["a"], 1) is None
        assert len(await operator.read(ids["b"])) == 2


async def sessions_followed(store: EventStore, operator_url: str, ids: dict[str, str], last: str) -> list[str]:
    """The sessions a subscription of ``store`` hands out while the operator writes to each of the three
    sessions, ``ids[last]``'s (the text "last") at the end."""
    start = await store.head()
    got: list[str] = []

    async def follow() -> None:
        async for _, event in store.subscribe(start, poll_interval=0.05):
            got.append(event.session)
            if event.data.get("text") == "last":
                return

    task = asyncio.create_task(follow())
    async with await open_store(operator_url, tenant=ALL_TENANTS) as operator:
        for key in [*sorted({"a", "b", "none"} - {last}), last]:
            await operator.append([text(ids[key], "last" if key == last else "someone else's")])
    await asyncio.wait_for(task, 20)
    return got


async def test_a_subscription_hands_out_only_the_tenants_events(tenant_a, ids, urls):
    assert await sessions_followed(tenant_a, urls[0], ids, "a") == [ids["a"]]


async def test_listen_wakes_a_tenant_only_for_its_own_commits(pg_url, app_role, ids):
    await seed(pg_url, ids)
    waiter = _NotifyWaiter(app_role, ids["ta"])
    try:
        await waiter.wait(0.01)  # connects (and wakes once for anything missed)
        await waiter.wait(0.01)
        async with await open_store(pg_url, tenant=ALL_TENANTS) as operator:
            await operator.append([text(ids["b"], "globex")])
            await asyncio.sleep(0.3)
            assert not waiter._woken.is_set()
            await operator.append([text(ids["a"], "acme")])
            await asyncio.wait_for(waiter._woken.wait(), 10)
        assert waiter._conn is not None
        assert await waiter._conn.fetchval("SELECT current_setting('calltape.tenant')") == ids["ta"]
    finally:
        await waiter.close()


async def test_a_0002_database_upgrades_in_place_and_keeps_its_tenants(empty_pg, ids):
    """A database written before row-level security: its sessions keep their tenants after the upgrade."""
    await at_revision(empty_pg, "0002")
    await _admin(
        empty_pg,
        "INSERT INTO ct_sessions (session, tenant, status, last_seq, epoch, started) VALUES "
        f"('{ids['a']}', '{ids['ta']}', 'active', 1, 1, true), ('{ids['b']}', NULL, 'active', 1, 1, true)",
        "INSERT INTO ct_events (session, seq, id, type, at_ms, data) VALUES "
        f"('{ids['a']}', 1, 'e1', 'user.text', 0, '{{\"text\": \"a\"}}'), "
        f"('{ids['b']}', 1, 'e1', 'user.text', 0, '{{\"text\": \"b\"}}')",
        f"INSERT INTO ct_tombstones (session, erased_at_ms, events) VALUES ('{ids['none']}', 0, 3)",
    )
    role = f"calltape_tenants_{uuid.uuid4().hex[:8]}"
    await _admin(empty_pg, f'CREATE ROLE "{role}" LOGIN')
    try:
        assert await upgrade(empty_pg, grant=role) == ("0002", HEAD)
        app = make_url(empty_pg).set(username=role).render_as_string(hide_password=False)
        conn = await as_tenant(app, ids["ta"])
        try:
            assert [tuple(r) for r in await conn.fetch("SELECT session, seq FROM ct_events")] == [(ids["a"], 1)]
        finally:
            await conn.close()
        async with await open_store(app, tenant=ids["ta"]) as store:
            assert [i.session for i in await store.sessions()] == [ids["a"]]
            await store.append([text(ids["a"], "after the upgrade")])
            assert [e.seq for e in await store.read(ids["a"])] == [1, 2]
            # A tombstone from before the upgrade still refuses its id, for every tenant.
            with pytest.raises(SessionErased):
                await store.append([started(ids["none"])])
    finally:
        await _admin(empty_pg, f'DROP OWNED BY "{role}"', f'DROP ROLE "{role}"')


# -- sessions without a tenant are a group of their own; every tenant only on request ---------------


@pytest.fixture(params=["sqlite", "postgres-app-role", "postgres-superuser"])
def untenanted_urls(request: pytest.FixtureRequest, tmp_path) -> tuple[str, str]:
    """(the operator's URL, a URL to open without a tenant): on PostgreSQL both the application role (the
    database filters) and a superuser (row-level security does not hold it: calltape filters)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/calltape.db"
        return url, url
    pg_url = request.getfixturevalue("pg_url")
    return pg_url, pg_url if request.param == "postgres-superuser" else request.getfixturevalue("app_role")


async def test_a_store_without_a_tenant_sees_only_sessions_without_one(untenanted_urls, ids):
    operator_url, url = untenanted_urls
    await seed(operator_url, ids)
    mine, theirs = ids["none"], (ids["a"], ids["b"])
    async with await open_store(url) as store:
        listed = {i.session for i in await store.sessions()}
        assert mine in listed and not listed & set(theirs)
        assert await store.sessions(tenant=ids["ta"]) == []
        assert (await store.session_info(mine)).tenant is None
        assert await store.load_snapshot(mine, 1) == (2, b"state")
        for session in theirs:
            assert await store.session_info(session) is None and await store.read(session) == []
            assert await store.seq_at_time(session, 10**15) == 0 and await store.load_snapshot(session, 1) is None
            assert await store.feed(session=session) == []
            with pytest.raises(SessionNotFound):
                await store.erase(session)
            with pytest.raises(TenantRefused) as info:
                await store.append([text(session, "intruder")])
            one_sentence(str(info.value))
        fed = {e.session for _, e in await store.feed(limit=100_000)}
        assert mine in fed and not fed & set(theirs)
        with pytest.raises(TenantRefused):  # it starts only sessions without a tenant
            await store.append([started(f"{mine}-2", tenant=ids["ta"])])
        await store.append([text(mine, "still mine")])
    async with await open_store(operator_url, tenant=ALL_TENANTS) as operator:
        assert [e.data.get("text") for e in await operator.read(ids["a"])] == [None, "for acme"]
        assert await operator.session_info(f"{mine}-2") is None


async def test_a_subscription_without_a_tenant_hands_out_only_sessions_without_one(untenanted_urls, ids):
    operator_url, url = untenanted_urls
    await seed(operator_url, ids)
    async with await open_store(url) as store:
        assert await sessions_followed(store, operator_url, ids, "none") == [ids["none"]]


async def test_every_tenant_is_an_explicit_choice_of_the_operator(untenanted_urls, ids):
    operator_url, url = untenanted_urls
    await seed(operator_url, ids)
    everyone = {ids["a"], ids["b"], ids["none"]}
    if url != operator_url:  # the application role: row-level security holds it to one tenant at a time
        with pytest.raises(CalltapeError) as info:
            await open_store(url, tenant=ALL_TENANTS)
        one_sentence(str(info.value))
        assert "cannot see every tenant" in str(info.value)
        return
    async with await open_store(url, tenant=ALL_TENANTS) as operator:
        assert everyone <= {i.session for i in await operator.sessions()}
        assert everyone <= {e.session for _, e in await operator.feed(limit=100_000)}
        assert (await operator.session_info(ids["a"])).tenant == ids["ta"]
        # Across tenants: erase one tenant's session, start another's.
        assert await operator.erase(ids["b"]) == 2
        await operator.append([started(f"{ids['a']}-op", tenant=ids["ta"])])
        assert (await operator.session_info(f"{ids['a']}-op")).tenant == ids["ta"]
        assert await operator.session_info(ids["b"]) is None and (await operator.tombstone(ids["b"])).events == 2
