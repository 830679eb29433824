"""``calltape import --format vapi|retell|bland|elevenlabs|ultravox`` as users run it: the console script
in a subprocess, on SQLite and PostgreSQL, with payloads shaped on the platforms' documented post-call
payloads (:mod:`tests.adapters.postcall_payloads`); then ``check``, ``show --html``, ``stats`` and
``context`` on the imported calls."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Cli, assert_error

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.adapters import postcall_payloads as p

BUILDERS: dict[str, Callable[[str], dict[str, Any]]] = {
    "vapi": p.vapi_report,
    "retell": p.retell_webhook,
    "bland": p.bland_post_call,
    "elevenlabs": p.elevenlabs_webhook,
    "ultravox": p.ultravox_saved,
}


def saved(tmp_path: Path, platform: str, call_id: str) -> Path:
    path = tmp_path / f"{platform}-{call_id}.json"
    path.write_text(json.dumps(BUILDERS[platform](call_id)))
    return path


def test_every_platform_imports_once_and_again_adds_nothing(cli: Cli, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    files = {platform: saved(tmp_path, platform, f"{platform}-{tag}") for platform in BUILDERS}
    first = cli.many(*[["import", "--format", platform, str(f), "--json"] for platform, f in files.items()])
    for result in first:
        assert result.code == 0, result
        counts = result.json()
        assert counts["sessions"] == 1 and counts["imported"] > 0 and counts["skipped"] == 0, result
    again = cli.many(*[["import", "--format", platform, str(f), "--json"] for platform, f in files.items()])
    for before, result in zip(first, again, strict=True):
        assert result.code == 0, result
        assert result.json()["imported"] == 0 and result.json()["skipped"] == before.json()["imported"], result
    # each call is a session of its own (looked up by id: on PostgreSQL the list holds other tests' too)
    for platform in BUILDERS:
        exported = cli("export", f"{platform}-{tag}")
        assert exported.code == 0 and exported.out.strip(), exported


def test_check_show_html_stats_and_context_on_imported_calls(cli: Cli, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    el, vapi = f"el-{tag}", f"vapi-{tag}"
    imported = cli.many(
        ["import", "--format", "elevenlabs", str(saved(tmp_path, "elevenlabs", el))],
        ["import", "--format", "vapi", str(saved(tmp_path, "vapi", vapi))],
    )
    assert all(r.code == 0 and "Imported" in r.out for r in imported), imported
    page = tmp_path / "el.html"
    checked, clean, shown, stats, context = cli.many(
        ["check", el, "--json"],
        ["check", vapi],
        ["show", el, "--html", str(page)],
        ["stats", el, "--json"],
        ["context", el, "--format", "openai"],
    )
    # the tool call ElevenLabs left without a result, in a call that ended
    assert checked.code == 1, checked
    assert [(v["rule"], v["session"]) for v in checked.json()] == [("orphan-call", el)], checked
    assert "el-tool-2" in checked.json()[0]["message"]
    assert clean.code == 0, clean  # the barge-in is settled: its playout ended when the user cut in
    assert shown.code == 0 and page.exists(), shown
    html = page.read_text()
    assert p.EL_HEARD in html and "interrupt" in html.lower()
    figures = stats.json()
    assert figures["interruptions"] == 1 and figures["tools"]["outcomes"] == {"completed": 1, "in_progress": 1}
    assert figures["latency_ms"]["user_stopped_to_agent_speech"]["count"] == 0  # no VAD edge was invented
    messages = context.json()
    assert {"role": "assistant", "content": p.EL_HEARD} in messages  # what was heard, not what was generated
    assert not any(m.get("content") == p.EL_GENERATED for m in messages)


def test_a_payload_of_another_shape_writes_nothing(cli: Cli, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    good = saved(tmp_path, "vapi", f"vapi-{tag}")
    other = saved(tmp_path, "elevenlabs", f"el-{tag}")
    not_json = tmp_path / "notes.txt"
    not_json.write_text("call went fine\n")
    wrong, mixed, garbage, unknown = cli.many(
        ["import", "--format", "ultravox", str(other)],
        ["import", "--format", "vapi", str(good), str(other)],
        ["import", "--format", "bland", str(not_json)],
        ["import", "--format", "zoom", str(good)],
    )
    assert_error(wrong, str(other), "is not an Ultravox post-call payload", "nothing was imported")
    assert_error(mixed, str(other), "is not a Vapi post-call payload")
    assert_error(garbage, str(not_json), "not a JSON document")
    assert_error(unknown, "unknown --format 'zoom'")
    listed = cli("sessions", "--json")
    assert listed.code in (0, 2), listed
    if listed.code == 0:
        sessions = {s["session"] for s in listed.json()}
        assert not sessions & {f"vapi-{tag}", f"el-{tag}"}, "a refused import wrote a session"


def test_a_call_recorded_live_is_left_alone(cli: Cli, tmp_path: Path) -> None:
    sid = f"el-live-{uuid.uuid4().hex[:8]}"
    live = tmp_path / "live.jsonl"
    live.write_text(
        json.dumps({"id": "l1", "session": sid, "type": "session.started", "data": {"agent": "bistro"}}) + "\n"
    )
    assert cli("import", str(live)).code == 0
    result = cli("import", "--format", "elevenlabs", str(saved(tmp_path, "elevenlabs", sid)), "--json")
    assert result.code == 0, result
    assert result.json()["recorded_live"] == [sid] and result.json()["imported"] == 0
    assert "recorded that call live" in result.err
    assert len(cli("export", sid).lines()) == 1


def test_a_dropped_ultravox_call_is_resumed_with_its_initial_messages(cli: Cli, tmp_path: Path) -> None:
    sid = f"uv-{uuid.uuid4().hex[:8]}"
    assert cli("import", "--format", "ultravox", str(saved(tmp_path, "ultravox", sid))).code == 0
    dropped = cli("check", sid, "--json")
    assert dropped.code == 1 and [v["rule"] for v in dropped.json()] == ["unsettled-drop"], dropped
    plan = cli("resume", sid, "--agent", "bistro-2", "--format", "ultravox")
    assert plan.code == 0, plan
    seeded = plan.json()["context"]
    assert seeded[-1] == {
        "role": "MESSAGE_ROLE_TOOL_RESULT",
        "text": '{"status":"unknown"}',
        "invocationId": "uv-inv-2",
        "toolName": "send_reminder",
    }
    context, after = cli.many(["context", sid, "--format", "ultravox"], ["check", sid, "--json"])
    assert context.json() == seeded  # what the new Ultravox call is seeded with is calltape's context
    rules = {v["rule"] for v in after.json()}
    assert not rules & {"unsettled-drop", "orphan-call"}, after
