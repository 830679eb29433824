"""The plugin loads from a plain ``pip install``: the built wheel declares the ``pytest11`` entry
point, and a test file that only uses ``calltape_store`` passes in a fresh pytest process."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TINY_TEST = """
import pytest

from calltape import make_event


@pytest.mark.asyncio
async def test_uses_the_store(calltape_store):
    assert await calltape_store.sessions() == []
    await calltape_store.append([make_event("call-1", "session.started", {"agent": "a"})])
    assert [s.session for s in await calltape_store.sessions()] == ["call-1"]


@pytest.mark.asyncio
async def test_each_test_gets_an_empty_store(calltape_store):
    assert await calltape_store.sessions() == []


def test_the_plugin_came_from_the_entry_point(request):
    assert request.config.pluginmanager.get_plugin("calltape") is not None
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr
    (path,) = out.glob("calltape-*.whl")
    return path


def test_the_wheel_declares_the_pytest11_entry_point(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = archive.read(name).decode()
        assert "calltape/testing/plugin.py" in archive.namelist()
    assert "[pytest11]" in text
    assert "calltape = calltape.testing.plugin" in text


def test_a_test_file_using_the_fixture_passes_after_pip_install(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_tiny.py").write_text(TINY_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALLTAPE_", "PYTEST_"))}
    # The base interpreter with the wheel first and this environment's packages after it: directories
    # on PYTHONPATH get no .pth processing, so the editable install of the checkout stays out of sight.
    site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    env["PYTHONPATH"] = os.pathsep.join([str(target), site])
    python = getattr(sys, "_base_executable", sys.executable)
    env["CALLTAPE_HOME"] = str(tmp_path / "home")  # would hold the embedded database: must stay absent
    run = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_tiny.py"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout
    left = [p.name for p in project.rglob("*") if p.suffix in (".db", ".sqlite", ".jsonl") or "calltape" in p.name]
    assert left == []  # nothing left behind
    assert not (tmp_path / "home").exists()
    # the plugin module that ran is the installed one
    where = subprocess.run(
        [python, "-c", "import calltape.testing.plugin as p; print(p.__file__)"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
    )
    assert where.stdout.strip().startswith(str(target)), where
