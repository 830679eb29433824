"""``calltape serve`` shows any call's timeline picture: in-process (httpx over ASGI), closed by default."""

from __future__ import annotations

import base64
import uuid

import httpx

from calltape.events import make_event, now_ms
from calltape.eventstore import EventStore
from calltape.picture import CSP, timeline_html
from calltape.server.app import create_app

TOKEN = "viewer-secret-1"


async def _call(store: EventStore, session: str) -> None:
    rows = [
        ("session.started", {"agent": "concierge"}),
        ("user.transcript", {"text": "<b>a table</b> for two", "final": True}),
        ("agent.reply.started", {"reply": "r1"}),
        ("agent.text", {"reply": "r1", "text": "Booking it."}),
        ("agent.reply.done", {"reply": "r1"}),
        ("session.ended", {}),
    ]
    # Now, not a fixed date: the index lists the latest calls, and the shared PostgreSQL test database
    # holds every other test's calls too.
    start = now_ms()
    await store.append([make_event(session, t, d, at_ms=start + 100 * n) for n, (t, d) in enumerate(rows)])


async def _get(
    store: EventStore, path: str, headers: dict[str, str] | None = None, **options: object
) -> httpx.Response:
    app = create_app(store, **options)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.get(path, headers=headers or {})


def _basic(password: str, user: str = "anyone") -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def test_timelines_are_closed_without_a_viewer_token(store: EventStore) -> None:
    session = f"view-{uuid.uuid4().hex[:10]}"
    await _call(store, session)
    path = f"/sessions/{session}/timeline"
    closed = await _get(store, path, vapi_secret="s", retell_api_key="k")  # webhook secrets do not open it
    assert closed.status_code == 403 and "CALLTAPE_VIEWER_TOKEN" in closed.json()["error"]
    assert (await _get(store, "/sessions", vapi_secret="s")).status_code == 403
    for headers in ({}, {"Authorization": f"Bearer {TOKEN}x"}, _basic("wrong"), {"Authorization": "Basic !!"}):
        refused = await _get(store, path, headers, viewer_token=TOKEN)
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic"), headers
        assert "a table" not in refused.text


async def test_a_timeline_is_the_page_show_html_writes(store: EventStore) -> None:
    session = f"view-{uuid.uuid4().hex[:10]}"
    await _call(store, session)
    path = f"/sessions/{session}/timeline"
    expected = timeline_html(await store.read(session), await store.session_info(session))
    for headers in ({"Authorization": f"Bearer {TOKEN}"}, _basic(TOKEN)):
        page = await _get(store, path, headers, viewer_token=TOKEN)
        assert page.status_code == 200 and page.text == expected
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["content-security-policy"] == f"{CSP}; frame-ancestors 'none'"
        assert page.headers["cache-control"] == "no-store" and page.headers["x-content-type-options"] == "nosniff"
    assert "\\u003cb\\u003ea table\\u003c/b\\u003e" in expected and "<b>a table" not in expected
    local = await _get(store, path, allow_unsigned=True)  # local development: open
    assert local.status_code == 200 and local.text == expected
    prefix = await _get(store, f"{path}?to=2", allow_unsigned=True)
    assert prefix.text == timeline_html(await store.read(session, to_seq=2), await store.session_info(session))
    assert "Booking it." not in prefix.text
    assert (await _get(store, f"{path}?to=zero", allow_unsigned=True)).status_code == 400
    missing = await _get(store, "/sessions/no-such-call/timeline", allow_unsigned=True)
    assert missing.status_code == 404 and missing.json() == {"error": "no session by that id"}


async def test_the_index_links_every_call_escaped(store: EventStore) -> None:
    plain = f"view-{uuid.uuid4().hex[:10]}"
    odd = f"view <i>&{uuid.uuid4().hex[:6]}/x?y"
    await _call(store, plain)
    await _call(store, odd)
    index = await _get(store, "/sessions", {"Authorization": f"Bearer {TOKEN}"}, viewer_token=TOKEN)
    assert index.status_code == 200
    assert f'<a href="/sessions/{plain}/timeline">{plain}</a>' in index.text
    assert "<i>" not in index.text and "view &lt;i&gt;&amp;" in index.text
    link = index.text.split("view%20%3Ci%3E%26")[1].split('"')[0]
    odd_path = "/sessions/view%20%3Ci%3E%26" + link
    page = await _get(store, odd_path, allow_unsigned=True)
    assert page.status_code == 200 and "view &lt;i&gt;&amp;" in page.text
