"""`--tenant`, `$CALLTAPE_TENANT` and `db upgrade --grant ROLE`, run as users run them (SPEC section 6)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import asyncpg
from conftest import Cli, assert_error, at, jsonl
from sqlalchemy.engine import make_url


def call(session: str, tenant: str | None, words: str) -> list[dict[str, object]]:
    data: dict[str, object] = {"agent": "triage"}
    if tenant is not None:
        data["tenant"] = tenant
    return [
        {"id": f"{session}-1", "session": session, "type": "session.started", "at": at(0), "data": data},
        {"id": f"{session}-2", "session": session, "type": "user.text", "at": at(10), "data": {"text": words}},
    ]


def seed(cli: Cli, tag: str) -> None:
    events = call(f"a-{tag}", "acme", "acme words") + call(f"g-{tag}", "globex", "globex words")
    events += call(f"n-{tag}", None, "nobody's words")
    result = cli("--all-tenants", "import", "-", input=jsonl(events))  # the operator's, across tenants
    assert result.code == 0, result


def check_tenant_from_env(cli: Cli, tag: str) -> None:
    """``$CALLTAPE_TENANT`` is the ``--tenant`` option by another road: a read and a write through it are
    held to acme (every command through the option: :func:`check_isolation`)."""
    cli.env["CALLTAPE_TENANT"] = "acme"
    try:
        listed = cli("sessions", "--json", "--limit", "0")
        assert listed.code == 0, listed
        assert {row["session"] for row in listed.json()} & {f"a-{tag}", f"g-{tag}", f"n-{tag}"} == {f"a-{tag}"}
        assert_error(cli("show", f"g-{tag}"), "there is no session")
        intruder = jsonl(call(f"g-{tag}", None, "intruder by env")[1:])
        intruder = intruder.replace(f"g-{tag}-2".encode(), f"g-{tag}-8".encode())
        assert_error(cli("import", "-", input=intruder), "belongs to another tenant")
    finally:
        cli.env.pop("CALLTAPE_TENANT", None)


def check_isolation(cli: Cli, operator: Cli, tag: str) -> None:
    """Every read and write command run for tenant acme sees and touches acme's sessions only."""
    pre = ("--tenant", "acme")
    listed = cli(*pre, "sessions", "--json", "--limit", "0")
    assert listed.code == 0, listed
    assert {row["session"] for row in listed.json()} & {f"a-{tag}", f"g-{tag}", f"n-{tag}"} == {f"a-{tag}"}
    exported = cli(*pre, "export", "--all")
    assert exported.code == 0, exported
    sessions = {line["session"] for line in exported.lines()}
    assert f"a-{tag}" in sessions and not sessions & {f"g-{tag}", f"n-{tag}"}
    assert "globex words" not in exported.out and "nobody's words" not in exported.out
    for command in (("show", f"g-{tag}"), ("context", f"g-{tag}"), ("export", f"n-{tag}")):
        assert_error(cli(*pre, *command), "there is no session")
    intruder = jsonl(call(f"g-{tag}", None, "intruder")[1:])
    intruder = intruder.replace(f"g-{tag}-2".encode(), f"g-{tag}-9".encode())
    assert_error(cli(*pre, "import", "-", input=intruder), "belongs to another tenant")
    assert_error(cli(*pre, "delete", "--yes", f"g-{tag}"), "there is no session")
    new = jsonl(call(f"a2-{tag}", None, "new acme call"))
    assert cli(*pre, "import", "-", input=new).code == 0
    everything = operator("--all-tenants", "export", "--all").out
    assert "intruder" not in everything and "globex words" in everything and "nobody's words" in everything
    shown = operator("--all-tenants", "sessions", "--json", "--limit", "0").json()
    assert {r["session"]: r["tenant"] for r in shown if r["session"] == f"a2-{tag}"} == {f"a2-{tag}": "acme"}


def check_untenanted(cli: Cli, tag: str) -> None:
    """Without a tenant: only the sessions without one, for reads and for the operator's erasures."""
    listed = {r["session"] for r in cli("sessions", "--json", "--limit", "0").json()}
    assert f"n-{tag}" in listed and not listed & {f"a-{tag}", f"g-{tag}"}
    exported = cli("export", "--all")
    assert "nobody's words" in exported.out and "acme words" not in exported.out
    assert_error(cli("show", f"a-{tag}"), "there is no session")
    assert_error(cli("delete", "--yes", f"g-{tag}"), "there is no session")
    assert_error(cli("import", "-", input=jsonl(call(f"x-{tag}", "acme", "new"))), "belongs to another tenant")
    assert_error(cli("--tenant", "acme", "--all-tenants", "sessions"), "exclude each other")


def test_tenant_on_sqlite_filters_in_calltape(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home", f"sqlite:///{tmp_path}/calls.db")
    tag = uuid.uuid4().hex[:6]
    seed(cli, tag)
    check_isolation(cli, cli, tag)
    check_tenant_from_env(cli, tag)
    check_untenanted(cli, tag)
    deleted = cli("--all-tenants", "delete", "--yes", f"g-{tag}", "--json")  # the operator erases any
    assert deleted.code == 0 and deleted.json() == [{"session": f"g-{tag}", "events": 2}], deleted
    help_text = cli("--help", db=False).out
    assert "--tenant" in help_text and "SQLite" in help_text
    assert_error(cli("db", "upgrade", "--grant", "someone"), "SQLite file has no roles")


async def _admin(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def test_tenant_on_postgres_with_a_granted_role(pg_url: str, tmp_path: Path) -> None:
    role = f"calltape_tenants_cli_{uuid.uuid4().hex[:6]}"
    asyncio.run(_admin(pg_url, f'CREATE ROLE "{role}" LOGIN'))
    try:
        operator = Cli(tmp_path / "home", pg_url)
        granted = operator("db", "upgrade", "--grant", role, "--json")
        assert granted.code == 0, granted
        assert granted.json()["granted"] == role
        assert_error(operator("db", "upgrade", "--grant", "postgres"), "bypasses row-level security")
        tag = uuid.uuid4().hex[:6]
        seed(operator, tag)
        # The operator's superuser cannot be held to a tenant: refused, not trusted.
        assert_error(operator("--tenant", "acme", "sessions"), "bypasses row-level security", "--grant")
        app = Cli(tmp_path / "home", make_url(pg_url).set(username=role).render_as_string(hide_password=False))
        check_isolation(app, operator, tag)
        check_tenant_from_env(app, tag)
        # Without a tenant, the application role and the superuser alike see only the sessions that have
        # none (the database filters for the one, calltape for the other); every tenant is the operator's.
        check_untenanted(app, tag)
        check_untenanted(operator, tag)
        assert_error(app("--all-tenants", "sessions"), "cannot see every tenant")
    finally:
        asyncio.run(_admin(pg_url, f'DROP OWNED BY "{role}"', f'DROP ROLE "{role}"'))
