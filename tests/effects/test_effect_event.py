"""The ``tool.effect`` event (SPEC section 8) on every path: validation, store, import and export, the
fold (no context change), redaction of its output, erasure, the timeline picture and ``calltape show``."""

from __future__ import annotations

from pathlib import Path

import orjson
from cli.conftest import Cli
from effect_calls import CARD, charged_call

from calltape.checks import to_events
from calltape.events import make_event, parse_event
from calltape.eventstore import open_store
from calltape.eventstore.recorder import Recorder
from calltape.picture.lanes import build_picture
from calltape.projections import fold_events
from calltape.redaction import Redactor


def jsonl(events: list[dict]) -> bytes:  # type: ignore[type-arg]
    return b"".join(orjson.dumps(e) + b"\n" for e in events)


def test_effects_change_no_context() -> None:
    events = to_events(charged_call())
    without = [e for e in events if e.type != "tool.effect"]
    with_effects, plain = fold_events(events).native(), fold_events(without).native()
    assert with_effects["items"] == plain["items"]
    assert with_effects["clean"] and with_effects["last_clean_seq"] == with_effects["seq"] == len(events)
    # the call's output is the tool.result's, as for any tool
    outputs = [i for i in with_effects["items"] if i["type"] == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["c1"] and "ch_1" in str(outputs[0]["output"])


def test_redaction_rewrites_the_output_only() -> None:
    event = make_event(
        "s",
        "tool.effect",
        {"call": "c1", "name": "charge", "key": f"card {CARD}", "phase": "done", "output": {"card": CARD, "n": [CARD]}},
    )
    out = Redactor().event(event)
    assert out.data["output"] == {"card": "[card]", "n": ["[card]"]}
    # the key names the action: at most once depends on it, so it is never rewritten
    assert out.data["key"] == f"card {CARD}" and out.data["name"] == "charge" and out.data["call"] == "c1"


async def test_stored_redacted_and_erased(store_url: str, session_id: str) -> None:
    store = await open_store(store_url, redactor=Redactor())
    try:
        async with Recorder(store) as rec:
            for event in to_events(charged_call(session_id)):
                rec.emit(event)
        log = await store.read(session_id)
        effects = [e for e in log if e.type == "tool.effect"]
        assert [e.data["phase"] for e in effects] == ["started", "done"]
        assert effects[0].data["heard"] is True and "heard" not in effects[1].data
        assert effects[1].data["output"]["card"] == "[card]"
        assert await store.erase(session_id) == len(log)
        assert await store.read(session_id) == []
    finally:
        await store.close()


def test_import_export_and_show(cli: Cli, tmp_path: Path, session_id: str) -> None:
    events = charged_call(session_id)
    path = tmp_path / "call.jsonl"
    path.write_bytes(jsonl(events))
    imported = cli("import", str(path), "--json")
    assert imported.code == 0 and imported.json()["imported"] == len(events), imported
    exported, shown, html = cli.many(
        ["export", session_id], ["show", session_id], ["show", session_id, "--html", str(tmp_path / "call.html")]
    )
    lines = exported.lines()
    assert [(e["id"], e["type"], e["data"]) for e in lines] == [
        (e["id"], e["type"], parse_event(e).data) for e in events
    ], exported
    assert shown.code == 0, shown
    assert "★ effect charge 'order-7' → started [c1] · heard first" in shown.out, shown
    assert "★ effect charge 'order-7' → done [c1]" in shown.out, shown
    page = (tmp_path / "call.html").read_text()
    # the page draws its items from the embedded records (only what is in view): an effect run, done
    assert html.code == 0 and 'data-lane="effect"' in page and '"k":"effect"' in page and '"st":"done"' in page


def test_the_picture_draws_each_run_of_an_effect() -> None:
    events = to_events(charged_call())
    picture = build_picture(events)
    (span,) = [i for i in picture.items if i.lane == "effect"]
    assert span.status == "done" and not span.open
    assert span.seqs == [10, 11] and span.end_ms is not None and span.end_ms - span.start_ms == 190
    assert "heard first" in span.title
    # a started effect still running at the last event is an open span; a verdict with nothing open a marker
    cut = [e for e in events if e.seq is not None and e.seq <= 10]
    (running,) = [i for i in build_picture(cut).items if i.lane == "effect"]
    assert running.open and running.status == "started"
    extra = make_event("s", "tool.effect", {"call": "c1", "name": "charge", "key": "order-7", "phase": "failed"})
    marks = [i for i in build_picture([*events, extra.with_seq(len(events) + 1)]).items if i.lane == "effect"]
    assert [(m.status, m.end_ms is None) for m in marks] == [("done", False), ("failed", True)]
