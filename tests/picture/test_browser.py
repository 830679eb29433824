"""The timeline picture in a real browser: headless Chromium (Debian's ``chromium``, installed by
.ci/run) loads the page from a file, and the tests assert on the DOM it built.

Skipped only off CI when Chromium or Playwright is missing; with ``CI=true`` that is a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from cli.conftest import Cli
from picture_support import HOSTILE, events, wire_events
from server.receiver_support import free_port, wait_healthy

from calltape.picture import LANES, timeline_html

CHROMIUM = os.environ.get("CALLTAPE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must run the browser tests (.ci/run installs chromium)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    if not Path(CHROMIUM).exists():
        _missing(f"no Chromium at {CHROMIUM}")
    with sync_playwright() as p:
        # the system Chromium: Playwright downloads nothing; no sandbox, as CI runs as root
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


class Loaded:
    def __init__(self, page: Any, requests: list[str], errors: list[str], url: str) -> None:
        self.page, self.requests, self.errors, self.url = page, requests, errors, url


@pytest.fixture
def loaded(browser: Any, tmp_path: Path) -> Iterator[Loaded]:
    path = tmp_path / "call.html"
    path.write_text(timeline_html(events()))
    context = browser.new_context(viewport={"width": 1600, "height": 900})
    page = context.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    yield Loaded(page, requests, errors, path.as_uri())
    context.close()


def test_lanes_are_drawn_and_nothing_is_fetched(loaded: Loaded) -> None:
    page = loaded.page
    captions = page.locator(".ct-caption").all_inner_texts()
    assert captions == [caption for _, caption in LANES]
    for lane, _ in LANES:
        assert page.locator(f'[data-lane="{lane}"] .ct-item').count() > 0, lane
    assert page.locator('[data-lane="tool"] .ct-s-unknown').inner_text() == "pairing → unknown · 800ms"
    assert page.locator(".ct-band").count() == 1
    assert loaded.requests == [loaded.url]  # the page itself, nothing else
    assert loaded.errors == []  # no CSP refusal, no script error


def test_an_unheard_reply_looks_different(loaded: Loaded) -> None:
    page = loaded.page

    def style(selector: str) -> dict[str, str]:
        return page.locator(selector).first.evaluate(
            """el => { const s = getComputedStyle(el);
                return {image: s.backgroundImage, color: s.backgroundColor, border: s.borderTopStyle,
                        font: s.fontStyle, line: s.textDecorationLine}; }"""
        )

    heard, unheard = style(".ct-s-heard .ct-h"), style(".ct-s-unheard .ct-u")
    assert heard["image"] == "none" and heard["border"] == "solid" and heard["color"] != "rgba(0, 0, 0, 0)"
    assert "repeating-linear-gradient" in unheard["image"] and unheard["border"] == "dashed"
    assert page.locator(".ct-s-unheard .ct-h").count() == 0  # nothing of r2 was heard
    # r1: heard part solid, the rest hatched, the unheard words set apart
    r1 = page.locator(".ct-s-interrupted").first
    assert r1.locator(".ct-h").count() == 1 and r1.locator(".ct-u").count() == 1
    assert r1.locator(".ct-ht").inner_text() == "Sure, booking a table"
    assert r1.locator(".ct-ut").inner_text() == " for two at eight."
    assert style(".ct-ut")["font"] == "italic" and style(".ct-ht")["font"] == "normal"


def test_clicking_an_item_shows_its_events(loaded: Loaded) -> None:
    page = loaded.page
    details = page.locator("#ct-details")
    assert "Hover over or click" in details.inner_text()
    page.locator('[data-lane="tool"] .ct-s-completed').click()
    assert details.locator("h2").inner_text().startswith('book_table({"people":2}) [c1] → completed in 2.0s')
    assert [p.get_attribute("data-seq") for p in details.locator("pre").all()] == ["8", "10", "17"]
    assert '"reference": "BK-1"' in details.locator('pre[data-seq="17"]').inner_text()
    # hovering another item shows it; leaving it goes back to the one clicked
    page.locator('[data-lane="call"] .ct-dropped').hover()
    assert details.locator("h2").inner_text() == "call dropped (network)"
    page.mouse.move(5, 5)
    assert details.locator("h2").inner_text().startswith("book_table")
    # the keyboard works too
    page.locator('[data-lane="interruption"] .ct-ignored').focus()
    page.keyboard.press("Enter")
    assert "with no effect" in details.locator("h2").inner_text()


def test_hostile_text_stays_text(loaded: Loaded) -> None:
    page = loaded.page
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("img").count() == 0 and page.locator("script").count() == 2
    label = page.locator('[data-lane="transcript"] .ct-final').nth(1)
    assert label.inner_text().startswith("book it </script><script>window.__pwned")
    label.click()
    assert page.locator("#ct-details h2").inner_text() == f"user (final transcript): {HOSTILE}"
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_no_two_items_of_a_lane_overlap(loaded: Loaded) -> None:
    boxes = loaded.page.evaluate(
        """() => [...document.querySelectorAll('.ct-item:not(.ct-interim)')].map(el => {
            const lane = el.closest('.ct-lane').dataset.lane;
            const r = el.getBoundingClientRect(), l = el.querySelector('.ct-label');
            const right = Math.max(r.right, l ? l.getBoundingClientRect().right : r.right);
            return {lane, left: r.left, right, top: r.top, bottom: r.bottom, i: el.dataset.i};
        })"""
    )
    clashes = [
        (a["i"], b["i"])
        for a in boxes
        for b in boxes
        if a["i"] < b["i"]
        and a["lane"] == b["lane"]
        and a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and b["top"] < a["bottom"]
    ]
    assert clashes == []


def test_calltape_serve_shows_a_timeline_to_a_browser_that_has_the_token(browser: Any, tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    token = uuid.uuid4().hex
    session = f"served-{uuid.uuid4().hex[:8]}"
    cli = Cli(tmp_path / "home", f"sqlite:///{tmp_path}/calls.db")
    cli.env["CALLTAPE_VIEWER_TOKEN"] = token
    calls = tmp_path / "calls.jsonl"
    calls.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in wire_events(session=session)))
    assert cli("import", str(calls)).code == 0
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = cli.popen("serve", "--port", str(port), "--log-level", "warning")
    try:
        wait_healthy(base, server)
        assert httpx.get(f"{base}/sessions/{session}/timeline").status_code == 401
        context = browser.new_context(
            viewport={"width": 1600, "height": 900}, http_credentials={"username": "me", "password": token}
        )
        page = context.new_page()
        requests: list[str] = []
        errors: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(f"{base}/sessions")
        page.get_by_role("link", name=session).click()
        page.wait_for_url(f"{base}/sessions/{session}/timeline")
        assert page.locator(".ct-lane").count() == len(LANES)
        page.locator('[data-lane="tool"] .ct-s-unknown').click()  # the script ran under the served CSP
        assert page.locator("#ct-details h2").inner_text().startswith('pairing({"dish":"fish"}) [c4] → unknown')
        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert all(url.startswith(f"{base}/sessions") for url in requests), requests
        assert errors == []
        context.close()
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
