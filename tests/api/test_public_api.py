"""The names `import calltape` offers: pinned, listed by dir(), and each one loads."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest

import calltape
from calltape.events import EVENT_TYPES, EventType
from calltape.projections import FORMATS, ContextFormat, render

EXPECTED = {
    "AlreadyResumed",
    "CallSession",
    "Calltape",
    "CalltapeError",
    "ConcurrencyConflict",
    "ContextFold",
    "ContextFormat",
    "DurableAppendTimeout",
    "EffectNotRun",
    "EffectUnknown",
    "Event",
    "EventStore",
    "EventType",
    "FeedPosition",
    "FencedWrite",
    "Interrupted",
    "InvalidEvent",
    "InvalidInstant",
    "Recorder",
    "RecorderClosed",
    "RecorderFull",
    "RecorderSpilled",
    "Reconciled",
    "ResumePlan",
    "Resumed",
    "SchemaOutdated",
    "SessionErased",
    "SessionInfo",
    "SessionNotFound",
    "StoreUnavailable",
    "TenantRefused",
    "ToolOutcome",
    "ToolSpec",
    "UnknownFormat",
    "build_context",
    "connect",
    "effect",
    "handoff",
    "make_event",
    "open_store",
    "parse_event",
    "recoveries",
    "render",
    "resume",
    "upgrade",
    "__version__",
}


def test_the_exported_names_are_pinned() -> None:
    # Adding or removing a public name is a decision: update this list with it.
    assert set(calltape.__all__) == EXPECTED
    assert len(calltape.__all__) == len(EXPECTED)  # no duplicates


def test_dir_lists_the_api_and_nothing_private() -> None:
    # A fresh interpreter: nothing loaded yet, so dir() must come from __dir__, not from globals.
    out = subprocess.run(
        [sys.executable, "-c", "import calltape; print('\\n'.join(dir(calltape)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert set(out) == EXPECTED
    assert not [name for name in out if name.startswith("_") and name != "__version__"]


def test_every_exported_name_loads() -> None:
    for name in calltape.__all__:
        assert getattr(calltape, name) is not None, name


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        calltape.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("calltape.no_such_name resolved")


def test_importing_calltape_loads_no_database_code() -> None:
    # The CLI imports calltape on every call: the lazy exports must stay lazy.
    out = subprocess.run(
        [sys.executable, "-c", "import sys, calltape; print(sorted(m for m in sys.modules if 'sqlalchemy' in m))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == "[]"


def test_the_literal_types_match_what_the_code_accepts() -> None:
    assert set(typing.get_args(EventType)) == EVENT_TYPES
    assert set(typing.get_args(ContextFormat)) == set(FORMATS)
    native = {"session": "s", "items": [], "pending": {"user_text": None, "tools": []}}
    for name in typing.get_args(ContextFormat):
        render(native, name)  # every literal is a format render takes


def test_the_call_hook_is_exported_by_the_runtime() -> None:
    # The live call's hook (listeners, an interceptor) is public: harnesses build on it, not on patches.
    import calltape.runtime as runtime
    from calltape.runtime.session import CallInterceptor, EventListener, Verdict

    hook = {"CallInterceptor", "EventListener", "Verdict"}
    assert hook <= set(runtime.__all__)
    assert (runtime.CallInterceptor, runtime.EventListener, runtime.Verdict) == (
        CallInterceptor,
        EventListener,
        Verdict,
    )
    assert {v.value for v in Verdict} == {"record", "hold", "discard"}
    for method in ("add_listener", "remove_listener", "intercept", "release", "reattach"):
        assert callable(getattr(calltape.CallSession, method)), method


def test_the_old_session_tape_name_warns_and_still_works() -> None:
    """``SessionTape`` left the public API (a live call's writer is ``CallSession``): the old name
    keeps working for a while, with a DeprecationWarning at the user's line, from both places it
    was imported from."""
    import calltape.eventstore.recorder as recorder_module

    with pytest.warns(DeprecationWarning, match="calltape.SessionTape is deprecated") as caught:
        tape_class = calltape.SessionTape
    assert caught[0].filename == __file__
    assert tape_class is recorder_module._SessionTape
    with pytest.warns(DeprecationWarning, match="CallSession"):
        from calltape.eventstore.recorder import SessionTape
    assert SessionTape is tape_class
    assert "SessionTape" not in calltape.__all__ and "SessionTape" not in dir(calltape)
    with pytest.raises(AttributeError):
        _ = recorder_module.NoSuchName


def test_no_page_or_example_imports_a_private_module() -> None:
    """Modules whose name starts with ``_`` (``calltape._backoff``, ``calltape.eventstore._sqlite_thread``,
    ``calltape.adapters.pipecat._percall``) are calltape's own: what users read never imports them."""
    import re
    from pathlib import Path

    root = Path(calltape.__file__).resolve().parents[1]
    private = re.compile(r"\b(?:from|import)\s+calltape(?:\.\w+)*\._\w+")
    pages = [root / "README.md", *(root / "docs").rglob("*.md"), *(root / "examples").rglob("*.py")]
    found = [str(p.relative_to(root)) for p in pages if private.search(p.read_text(encoding="utf-8"))]
    assert found == []
    assert private.search("from calltape.eventstore._sqlite_thread import ThreadDb")  # the pattern can match
    assert sorted(p.name for p in (root / "calltape").rglob("_[a-z]*.py")) == [
        "_backoff.py",
        "_percall.py",
        "_sqlite_thread.py",
    ]
