"""The README and the documentation (docs/**/*.md) run as written: every ```python block is a complete
program, run in its own subprocess and temporary directory; blocks that read $CALLTAPE_DATABASE_URL run
on PostgreSQL too. A line ``--8<-- "path"`` in a block is the file at that path (MkDocs' snippets).

A block that cannot run here (a LiveKit worker needs a LiveKit server) says so on the line right above
its fence, ``<!-- not run: why, and what runs it instead -->``; there are at most NOT_RUN_AT_MOST.
Links point inside the repository, and the quick start stays two commands."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from calltape.eventstore import upgrade

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\n$")
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.MULTILINE)
NOT_RUN_AT_MOST = 3


def blocks(language: str, page: Path = README) -> list[tuple[str, int, str, str, str | None]]:
    """(page, line, heading, code, why it is not run) of every fenced block in ``language``."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        if match.group(1) != language:
            continue
        line = text.count("\n", 0, match.start()) + 1
        headings = re.findall(r"^#+ (.+)$", text[: match.start()], re.MULTILINE)
        code = SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text(), match.group(2))
        not_run = NOT_RUN.search(text[max(0, match.start() - 300) : match.start()])
        name = str(page.relative_to(ROOT))
        found.append((name, line, headings[-1] if headings else "", code, not_run.group(1) if not_run else None))
    return found


EVERY_PYTHON = [block for page in PAGES for block in blocks("python", page)]
PYTHON = [(page, line, heading, code) for page, line, heading, code, why in EVERY_PYTHON if why is None]
NOT_RUN_BLOCKS = [(page, line, why) for page, line, _, _, why in EVERY_PYTHON if why is not None]
IDS = [f"{page}:{line}" for page, line, _, _ in PYTHON]


def run_block(code: str, tmp_path: Path, database_url: str | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "block.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLTAPE_")}
    env["CALLTAPE_HOME"] = str(tmp_path / "home")  # the embedded default lands in the temp dir
    if database_url is not None:
        env["CALLTAPE_DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )


def test_the_readme_and_the_docs_have_python_blocks() -> None:
    assert [b for b in PYTHON if b[0] == "README.md"], "the README runs no python block"
    assert len(PYTHON) >= 20


def test_blocks_not_run_are_rare_and_say_why() -> None:
    assert len(NOT_RUN_BLOCKS) <= NOT_RUN_AT_MOST, NOT_RUN_BLOCKS
    for page, line, why in NOT_RUN_BLOCKS:
        assert len(why.split()) >= 4, f"{page}:{line} is not run without saying why"


@pytest.mark.parametrize(("page", "line", "heading", "code"), PYTHON, ids=IDS)
def test_every_python_block_runs_as_written(page: str, line: int, heading: str, code: str, tmp_path: Path) -> None:
    done = run_block(code, tmp_path)
    assert done.returncode == 0, f"{page}:{line} ({heading}) failed:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, f"{page}:{line} ({heading}):\n{done.stderr}"


ON_POSTGRES = [b for b in PYTHON if "CALLTAPE_DATABASE_URL" in b[3]]


async def _fresh_database(admin_url: str) -> str:
    import asyncpg

    name = f"calltape_readme_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(make_url(admin_url).set(drivername="postgresql").render_as_string(False))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    await upgrade(url)
    return url


@pytest.mark.parametrize(
    ("page", "line", "heading", "code"), ON_POSTGRES, ids=[f"{page}:{line}" for page, line, _, _ in ON_POSTGRES]
)
def test_blocks_that_take_a_database_url_run_on_postgres(
    page: str, line: int, heading: str, code: str, tmp_path: Path, pg_admin_url: str
) -> None:
    url = asyncio.run(_fresh_database(pg_admin_url))
    done = run_block(code, tmp_path, url)
    assert done.returncode == 0, f"{page}:{line} ({heading}) on PostgreSQL:\n{done.stdout}\n{done.stderr}"


def test_postgres_is_shown_somewhere() -> None:
    assert ON_POSTGRES, "no README block runs on $CALLTAPE_DATABASE_URL"


def test_links_stay_inside_the_repository() -> None:
    text = README.read_text()
    assert not re.search(r"\bSPEC\b|SPEC\.md", text)
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if target.startswith(("http://", "https://")):
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which is not in the repository"
    assert (ROOT / "docs" / "reference.md").exists()


def test_the_quick_start_is_two_commands() -> None:
    text = README.read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    (bash,) = [code for lang, code in FENCE.findall(quick) if lang == "bash"]
    commands = [line for line in bash.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(commands) == 2, commands
    assert "calltape demo" in commands[0] and "pytest" in commands[1]


def test_install_lines_work_from_a_checkout() -> None:
    # `pip install 'calltape[x]'` needs the package on an index; from a checkout it is '.[x]'.
    for lang, code in FENCE.findall(README.read_text()):
        if lang in ("bash", "sh", ""):
            for line in code.splitlines():
                line = line.split("#", 1)[0]  # a comment may say what changes once published
                if re.search(r"pip install\b", line):
                    assert not re.search(r"pip install [\"']?calltape\b", line), line


def test_the_readme_stays_short() -> None:
    assert README.read_text().count("\n") <= 300, "the README is at most 300 lines: move detail to docs/"


def test_the_readme_links_into_the_docs() -> None:
    text = README.read_text()
    linked = {target for target in re.findall(r"\]\((docs/[^)#]+)", text)}
    for page in ("getting-started.md", "guides/livekit.md", "guides/pipecat.md", "guides/barge-in.md", "cli.md"):
        assert f"docs/{page}" in linked, f"the README does not link docs/{page}"


def test_the_readme_says_how_calltape_gets_on_path_and_how_long_the_suite_takes() -> None:
    quick = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "source .venv/bin/activate" in quick and ".venv/bin/calltape" in quick
    assert re.search(r"(about \d+|\d+ to \d+) minutes with `-n 2`", quick)


def test_ci_runs_the_readmes_test_command() -> None:
    quick = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    (bash,) = [code for lang, code in FENCE.findall(quick) if lang == "bash"]
    readme_command = re.search(r"(\.venv/bin/python -m pytest[^\n&]*)", bash)
    assert readme_command is not None
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_command.group(1).strip() in [line.strip() for line in ci], "CI runs another test command"


# One recipe per framework: what the README shows is what the guide and the examples do.
RECIPES = {
    "livekit": (["await calltape.connect()", "await start(session, "], ["examples/livekit_worker.py"]),
    "pipecat": (["await attach(ct, worker, "], ["examples/pipecat_quickstart.py"]),
}


@pytest.mark.parametrize("framework", sorted(RECIPES))
def test_the_readme_the_guide_and_the_examples_agree(framework: str) -> None:
    calls, examples = RECIPES[framework]
    guide = (ROOT / "docs" / "guides" / f"{framework}.md").read_text()
    guide_code = "".join(code for page, _, _, code, _ in blocks("python", ROOT / "docs" / "guides" / f"{framework}.md"))
    for call in calls:
        assert call in README.read_text(), f"the README's {framework} recipe lacks {call}"
        assert call in guide_code, f"docs/guides/{framework}.md's programs lack {call}"
        for example in examples:
            assert call in (ROOT / example).read_text(), f"{example} lacks {call}"
    assert "CallSession.start(" not in guide.split("## Resume", 1)[0], "the guide's attach uses another recipe"
    for example in (ROOT / "examples").glob(f"{framework}_*.py"):
        assert "CallSession.start(" not in example.read_text(), f"{example.name} uses another recipe"
