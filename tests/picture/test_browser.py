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
from picture_support import HOSTILE, events, long_call, wire_events
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
        if lane != "effect":  # this call has none
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


OVERLAPS = """() => [...document.querySelectorAll('.ct-item')].map((el, n) => {
    const lane = el.closest('.ct-lane').dataset.lane;
    const r = el.getBoundingClientRect(), l = el.querySelector('.ct-label:not([hidden])');
    const lr = l ? l.getBoundingClientRect() : r;
    return {lane, left: r.left, right: r.right, top: r.top, bottom: r.bottom, i: n,
            inside: lr.left >= r.left - 0.5 && lr.right <= r.right + 0.5,
            clipped: l ? getComputedStyle(l).textOverflow === 'ellipsis' && getComputedStyle(l).overflow === 'hidden'
                       : true};
})"""


def assert_apart(page: Any) -> None:
    """No two items of a lane cover each other, and every label stays inside its own bar (clipped)."""
    boxes = page.evaluate(OVERLAPS)
    assert all(b["inside"] and b["clipped"] for b in boxes), [b for b in boxes if not b["inside"]][:3]
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


def test_no_two_items_of_a_lane_overlap(loaded: Loaded) -> None:
    assert_apart(loaded.page)
    for _ in range(3):  # and zoomed in, where labels have room
        loaded.page.keyboard.press("+")
        assert_apart(loaded.page)


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


# ---------------------------------------------------------------------------------------------
# A one-hour call of 50,000 events: fitted, bounded, navigable


ELEMENTS = "document.getElementsByTagName('*').length"
BOUND = 5000
"""Elements the page may hold at any zoom: a few thousand, whatever the call's length."""


@pytest.fixture(scope="module")
def hour_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    call = long_call(50_000)
    assert len(call) >= 49_000 and call[-1].at_ms - call[0].at_ms >= 3_600_000
    path = tmp_path_factory.mktemp("hour") / "hour.html"
    path.write_text(timeline_html(call))
    return path


@pytest.fixture
def hour(browser: Any, hour_page: Path) -> Iterator[Loaded]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(hour_page.as_uri())
    yield Loaded(page, requests, errors, hour_page.as_uri())
    assert errors == []
    context.close()


def view(page: Any) -> tuple[float, float]:
    t0, t1 = page.evaluate("calltape.view()")
    return t0, t1


def test_an_hour_long_call_opens_fitted_with_a_bounded_page(hour: Loaded) -> None:
    page = hour.page
    duration = page.evaluate("calltape.duration")
    t0, t1 = view(page)
    assert t0 <= 0 and t1 >= duration and t1 - t0 < duration * 1.02  # the whole call, no more
    # nothing to scroll sideways: the chart is the window's width
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    assert page.evaluate("document.getElementById('ct-chart').scrollWidth") <= 1400
    ticks = page.locator(".ct-tick span").all_inner_texts()
    assert ticks[0] == "0s" and ticks[-1] in ("55:00", "1:00:00")
    assert page.locator("#ct-ov").count() == 1 and page.locator("#ct-window").count() == 1  # the overview
    assert page.evaluate(ELEMENTS) < BOUND
    assert hour.requests == [hour.url]
    # the header: findings counted, latency figures
    meta = page.locator(".ct-meta").inner_text()
    assert "finding(s): talk-over" in meta and "lasted 1h00m" in meta
    assert page.locator(".ct-latency").inner_text().startswith("latency: response p50")


def test_zoom_and_pan_by_wheel_drag_and_keys_stay_bounded(hour: Loaded) -> None:
    page = hour.page
    box = page.locator(".ct-track").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 5)
    before = view(page)
    for _ in range(6):
        page.mouse.wheel(0, -400)  # zoom in around the pointer
    zoomed = view(page)
    assert zoomed[1] - zoomed[0] < (before[1] - before[0]) / 20
    middle = (before[0] + before[1]) / 2
    assert zoomed[0] < middle < zoomed[1]
    assert page.evaluate(ELEMENTS) < BOUND
    replies = page.locator(".ct-reply").count()  # close enough to see replies one by one
    assert replies > 10 and page.locator(".ct-cluster").count() < replies / 5
    # drag to the left: later in the call
    page.mouse.move(box["x"] + 800, box["y"] + 5)
    page.mouse.down()
    page.mouse.move(box["x"] + 300, box["y"] + 5, steps=5)
    page.mouse.up()
    dragged = view(page)
    assert dragged[0] > zoomed[0]
    page.keyboard.press("ArrowRight")
    assert view(page)[0] > dragged[0]
    page.keyboard.press("-")
    assert view(page)[1] - view(page)[0] > dragged[1] - dragged[0]
    for _ in range(8):
        page.keyboard.press("+")
        assert page.evaluate(ELEMENTS) < BOUND
    assert_apart(page)
    page.keyboard.press("0")
    assert view(page)[0] <= 0 and view(page)[1] >= page.evaluate("calltape.duration")


def test_keys_step_through_barge_ins_drops_tool_calls_and_findings(hour: Loaded) -> None:
    page = hour.page
    details = page.locator("#ct-details h2")

    def selected() -> tuple[str, float]:
        el = page.locator(".ct-selected")
        assert el.count() == 1
        t0, _ = view(page)
        box, track = el.bounding_box(), page.locator(".ct-track").first.bounding_box()
        assert track["x"] <= box["x"] <= track["x"] + track["width"]  # drawn in view
        return el.get_attribute("class") or "", t0

    page.keyboard.press("b")
    first_class, first_view = selected()
    assert "ct-interruption" in first_class and details.inner_text().startswith("barge-in (user_speech)")
    first = details.inner_text()
    page.keyboard.press("b")
    assert details.inner_text() != first and "ct-interruption" in selected()[0]
    page.keyboard.press("Shift+B")
    assert details.inner_text() == first
    for _ in range(6):  # on through the call: the view follows
        page.keyboard.press("b")
        assert "ct-interruption" in selected()[0]
    assert view(page)[0] > first_view
    for _ in range(6):
        page.keyboard.press("Shift+B")
    assert details.inner_text() == first
    # the barge-in is drawn across the lanes
    assert page.locator(".ct-bargein").count() > 0
    page.keyboard.press("f")
    cls, _ = selected()
    assert "ct-finding" in cls and page.locator(".ct-selected .ct-label").inner_text() == "talk-over"
    assert details.inner_text().startswith("talk-over: the agent kept talking 900 ms")
    page.keyboard.press("d")
    assert "ct-dropped" in selected()[0] and details.inner_text() == "call dropped (network)"
    assert page.locator(".ct-band").count() == 1
    page.keyboard.press("t")
    assert "ct-tool" in selected()[0] and details.inner_text().startswith("lookup(")
    assert page.evaluate(ELEMENTS) < BOUND
    # the buttons do the same
    page.get_by_role("button", name="finding ▶").click()
    assert "ct-finding" in selected()[0]


def test_findings_are_drawn_with_their_rule_id(loaded: Loaded) -> None:
    page = loaded.page
    for _ in range(3):
        page.keyboard.press("+")
    page.keyboard.press("f")
    assert page.locator(".ct-selected .ct-label").inner_text() == "talk-over"
    page.keyboard.press("f")
    assert page.locator(".ct-selected .ct-label").inner_text() == "late-tokens"
    assert page.locator('[data-lane="finding"] .ct-finding').count() == 2
