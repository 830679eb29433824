"""The picture's content and page, without a browser: what each lane holds agrees with the fold, and
every string of the page is escaped (the browser test, test_browser.py, checks what Chromium makes of it)."""

from __future__ import annotations

import base64
import hashlib
import itertools
import re
from html.parser import HTMLParser

import orjson
import pytest
from picture_support import HOSTILE, events, wire_events

from calltape.events import parse_event
from calltape.picture import CSP, LANES, build_picture, render_html, timeline_html
from calltape.projections import ContextFold


def by_lane(lane: str) -> list:
    return [i for i in build_picture(events()).items if i.lane == lane]


def test_replies_show_heard_and_unheard_text_as_the_context_does() -> None:
    replies = by_lane("reply")
    assert [(r.status, r.heard, r.unheard) for r in replies] == [
        ("interrupted", "Sure, booking a table", " for two at eight."),
        ("unheard", "", "Let me check the menu."),
        ("heard", "Hello from the sommelier.", ""),
    ]
    fold = ContextFold()
    fold.apply_many(events())
    assistant = [i["content"] for i in fold.native()["items"] if i.get("role") == "assistant"]
    assert assistant == [r.heard for r in replies if r.heard]
    # r1 ends where its playout was cut; the late token is counted, not drawn as text
    assert (replies[0].start_ms, replies[0].end_ms) == (1200, 2100)
    assert "1 late token(s)" in replies[0].title
    assert (replies[2].start_ms, replies[2].end_ms) == (4200, 4900)


def test_tools_are_spans_with_their_outcome() -> None:
    tools = {i.seqs[0]: i for i in by_lane("tool")}
    assert [(t.status, t.start_ms, t.end_ms, t.open) for t in tools.values()] == [
        ("completed", 1300, 3400, False),
        ("cancelled", 3560, 3600, False),  # never started: settled by the barge-in on its reply
        ("excluded", 3650, 3650, False),  # asked for after the barge-in: not in the context
        ("unknown", 4300, 5200, False),  # settled by the drop
    ]
    first = next(iter(tools.values()))
    assert "after the barge-in" in first.title and first.label == "book_table → completed · 2.0s"
    assert [e for e in first.seqs] == [8, 10, 17]


def test_user_lanes_interruptions_and_the_call_lane() -> None:
    assert [(i.kind, i.start_ms, i.end_ms) for i in by_lane("vad")] == [
        ("speech", 100, 1000),
        ("interim", 400, None),
        ("speech", 2000, 2700),
    ]
    assert [(i.kind, i.label) for i in by_lane("transcript")] == [
        ("final", "a table for two please"),
        ("final", HOSTILE),
        ("typed", "thanks"),
    ]
    assert [(i.kind, i.start_ms) for i in by_lane("interruption")] == [
        ("interruption", 2100),
        ("interruption", 3600),
        ("ignored", 3700),  # nothing left to interrupt: drawn apart
    ]
    assert [i.kind for i in by_lane("call")] == ["started", "handoff", "dropped", "resumed", "ended"]
    assert build_picture(events()).dropped == [(5000, 5300)]


def test_an_open_call_runs_to_the_end() -> None:
    cut = events()[:12]  # r1 playing, book_table running, the user speaking
    picture = build_picture(cut)
    tool = next(i for i in picture.items if i.lane == "tool")
    reply = next(i for i in picture.items if i.lane == "reply")
    speech = [i for i in picture.items if i.kind == "speech"]
    assert (tool.status, tool.open, tool.end_ms) == ("in_progress", True, picture.duration_ms)
    assert reply.open and "waiting for playout" in reply.title
    assert speech[-1].open and speech[-1].end_ms == picture.duration_ms


def test_the_items_refer_to_the_events_embedded() -> None:
    picture = build_picture(events())
    referred = {seq for item in picture.items for seq in item.seqs}
    assert set(picture.events) == referred
    assert picture.events[15]["data"]["text"] == HOSTILE


class Page(HTMLParser):
    """What a browser would build: elements, attributes and text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        (self.scripts if self._in_script else self.text).append(data)


def parse(page: str) -> Page:
    parser = Page()
    parser.feed(page)
    return parser


def test_user_data_is_escaped_everywhere() -> None:
    page = timeline_html(events())
    parsed = parse(page)
    tags = [tag for tag, _ in parsed.tags]
    assert tags.count("script") == 2 and "img" not in tags
    assert not any(name.startswith("on") for _, attrs in parsed.tags for name in attrs)
    data = orjson.loads(parsed.scripts[0])
    assert data["events"]["15"]["data"]["text"] == HOSTILE
    assert any(item["t"] == f"user (final transcript): {HOSTILE}" for item in data["items"])  # the script's text
    assert "<" not in parsed.scripts[0]


def test_nothing_loads_and_only_the_page_script_runs() -> None:
    page = timeline_html(events())
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
    script = parse(page).scripts[1]
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in CSP and "default-src 'none'" in CSP
    assert f'content="{CSP}"' in page


def test_every_lane_and_every_item_is_in_the_page() -> None:
    page = timeline_html(events())
    for lane, caption in LANES:
        assert f'data-lane="{lane}"' in page and f">{caption}<" in page
    data = orjson.loads(parse(page).scripts[0])
    assert len(data["items"]) == len(build_picture(events()).items)
    assert [lane for lane, _, _ in data["lanes"]] == [lane for lane, _ in LANES]
    # the script draws them (windowed): the page itself holds no item element
    assert 'class="ct-item' not in page.split('id="ct-data"')[0]


def test_the_rows_of_a_lane_never_overlap_in_time() -> None:
    data = orjson.loads(parse(timeline_html(events())).scripts[0])
    rows: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for item in data["items"]:
        rows.setdefault((item["l"], item["r"]), []).append(
            (item["s"], item["e"] if item["e"] is not None else item["s"])
        )
    for spans in rows.values():
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end < start


def test_the_calls_findings_and_latency_figures() -> None:
    picture = build_picture(events())
    assert [(f["seq"], f["rule"]) for f in picture.findings] == [(13, "talk-over"), (14, "late-tokens")]
    findings = by_lane("finding")
    assert [(i.label, i.seqs, i.start_ms) for i in findings] == [("talk-over", [13], 2100), ("late-tokens", [14], 2150)]
    assert findings[0].title.startswith("talk-over: the agent kept talking")
    assert picture.latency["user_stopped_to_agent_speech"]["p50"] == 500
    page = timeline_html(events())
    header = page.split('id="ct-overview"')[0]
    assert "2 finding(s): late-tokens, talk-over" in header
    assert "latency: response <b>p50 500ms · p95 1.8s</b> (2)" in header
    assert "book_table <b>p50 2.0s</b> (1)" in header


@pytest.mark.parametrize("cut", [0, 1])
def test_an_empty_or_one_event_session_renders(cut: int) -> None:
    picture = build_picture(events()[:cut])
    page = render_html(picture)
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")


def test_a_playout_cut_by_speech_ended_is_an_interruption() -> None:
    script = [
        (0, "session.started", {"agent": "a"}),
        (100, "agent.reply.started", {"reply": "r1"}),
        (200, "agent.text", {"reply": "r1", "text": "One two three four."}),
        (250, "agent.reply.done", {"reply": "r1"}),
        (300, "agent.speech.started", {"reply": "r1"}),
        (900, "agent.speech.ended", {"reply": "r1", "interrupted": True, "heard": "One two"}),
        (950, "agent.speech.ended", {"reply": "r1", "interrupted": True}),  # again: nothing new to cut
        (1000, "interruption", {"reply": "r1"}),  # too late: ignored
    ]
    picture = build_picture([parse_event(w).with_seq(n) for n, w in enumerate(wire_events(script), 1)])
    reply = next(i for i in picture.items if i.lane == "reply")
    assert (reply.status, reply.heard, reply.unheard, reply.end_ms) == ("interrupted", "One two", " three four.", 900)
    marks = [(i.kind, i.start_ms) for i in picture.items if i.lane == "interruption"]
    assert marks == [("cut", 900), ("ignored", 1000)]


def test_a_redaction_months_later_does_not_stretch_the_axis() -> None:
    """``session.redacted`` is stamped when the operator ran ``calltape redact``: drawn at the call's end."""
    call = events()
    later = call[-1].at_ms + 200 * 86_400_000
    marker = parse_event(
        {"id": "late", "session": call[0].session, "type": "session.redacted", "data": {"kinds": ["card"], "spans": 1}}
    )
    marker.at_ms = later
    picture = build_picture([*call, marker.with_seq(len(call) + 1)])
    assert picture.duration_ms == build_picture(call).duration_ms
    (redacted,) = [i for i in picture.items if i.kind == "redacted"]
    assert redacted.start_ms == call[-1].at_ms - call[0].at_ms
