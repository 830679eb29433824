"""The command line follows the conventions (issue 31): every command's help reads as words, shows an
example that parses and its exit status; an option name means one thing; the summaries the root lists
without importing a command are that command's own; and start-up imports only what a command needs,
measured as CPU time against a bare interpreter."""

from __future__ import annotations

import re
import resource
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import typer

import calltape
from calltape.cli import app as cli_app

ROOT = Path(__file__).resolve().parents[2]
PATHS = [[], *[[name] for name in cli_app.COMMANDS]]
PATHS += [[name, sub] for name, entry in cli_app.COMMANDS.items() for sub in entry.subcommands]
PYTHON_TYPE = re.compile(r"<(?:bool|str|int|float|path|list|file|text|choice|uuid|datetime)[^>]*>|\[x[<>=]")


def help_of(path: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exited:
        cli_app.main([*path, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def entry_of(path: list[str]) -> cli_app.Command | None:
    if not path:
        return None
    entry = cli_app.COMMANDS[path[0]]
    return entry.subcommands[path[1]] if len(path) > 1 else entry


@pytest.mark.parametrize("path", PATHS, ids=[" ".join(p) or "calltape" for p in PATHS])
def test_every_help_reads_as_words_with_an_example_and_the_exit_status(
    path: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = help_of(path, capsys, monkeypatch)
    usage = text.splitlines()[0]
    assert usage.startswith("Usage: calltape"), usage
    assert PYTHON_TYPE.search(text) is None, f"a Python type as a placeholder: {PYTHON_TYPE.search(text)}"
    assert "[[" not in usage and "]...]" not in usage and "{" not in usage, usage
    assert "..." not in re.sub(r"\b[A-Z]+\.\.\.|\[ARGS\]\.\.\.", "", usage), usage
    words = " ".join(text.split())
    assert "Example: calltape " in words
    assert "Exit status: " in words and "2 error" in words
    assert "--install-completion" not in text or not path, "completion belongs to the root alone"


def test_exit_codes_say_which_commands_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = help_of([], capsys, monkeypatch)
    assert "1 diff found differences, check found violations" in " ".join(root.split())
    assert "1 violations found" in help_of(["check"], capsys, monkeypatch)
    assert "1 they differ" in help_of(["diff"], capsys, monkeypatch)
    assert "two-minute" not in help_of(["demo"], capsys, monkeypatch)


def real(path: list[str]) -> typer.core.TyperCommand | typer.core.TyperGroup:
    command = cli_app.load(path[0])
    return command.commands[path[1]] if len(path) > 1 else command


@pytest.mark.parametrize("path", PATHS[1:], ids=[" ".join(p) for p in PATHS[1:]])
def test_every_example_parses_and_the_summary_is_the_commands_own(path: list[str]) -> None:
    entry = entry_of(path)
    assert entry is not None
    command = real(path)
    own = " ".join((command.help or "").split("\n\n")[0].split())
    assert own == entry.summary, f"COMMANDS[{path}] lists {entry.summary!r}, the command says {own!r}"
    argv = cli_app.hoist_global_options(shlex.split(entry.example)[1:])
    root = typer.main.get_command(cli_app.app)
    while argv and argv[0].startswith("-"):  # global options: the root parses them
        argv = argv[2:] if argv[0] in cli_app.GLOBAL_OPTIONS else argv[1:]
    assert argv[: len(path)] == path, entry.example
    parent = root.make_context("calltape", [], resilient_parsing=True)
    command.make_context(path[-1], argv[len(path) :], parent=parent)  # raises on an unknown option or value


def test_an_option_name_means_one_thing() -> None:
    root = typer.main.get_command(cli_app.app)
    global_names = {name for param in root.params for name in param.opts if name.startswith("--")}
    assert {"--db", "--tenant", "--all-tenants"} <= global_names
    for path in PATHS[1:]:
        command = real(path)
        names = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
        assert not names & global_names, f"calltape {' '.join(path)} redefines {sorted(names & global_names)}"
    assert set(cli_app.GLOBAL_OPTIONS) | set(cli_app.GLOBAL_FLAGS) == {"--db", "--tenant", "--all-tenants"}


def test_the_version_is_the_packages() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{calltape.__version__}"' in pyproject  # one version: the distribution's
    assert cli_app.installed_version() == calltape.__version__


# ---------------------------------------------------------------------------------------------
# Start-up: `calltape --version` and `calltape --help` import typer and little else.

HEAVY = ("sqlalchemy", "pydantic", "asyncio", "rich", "calltape.eventstore", "calltape.events", "importlib.metadata")
AT_MOST = 12.0


def cli_code(*args: str) -> str:
    return f"import sys\nfrom calltape.cli.app import main\nsys.argv = ['calltape', *{args!r}]\nmain()"


def cpu_seconds(code: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], capture_output=True, check=False, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def ratios(rounds: int = 7) -> dict[str, float]:
    """Median CPU time of each start-up over a bare interpreter's, the runs interleaved."""
    codes = {"bare": "pass", "--version": cli_code("--version"), "--help": cli_code("--help")}
    times: dict[str, list[float]] = {name: [] for name in codes}
    for _ in range(rounds):
        for name, code in codes.items():
            times[name].append(cpu_seconds(code))
    bare = statistics.median(times["bare"])
    return {name: statistics.median(times[name]) / bare for name in ("--version", "--help")}


@pytest.mark.parametrize("argument", ["--version", "--help"])
def test_start_up_imports_nothing_heavy(argument: str) -> None:
    probe = cli_code(argument).replace("main()", "try:\n    main()\nexcept SystemExit:\n    pass\n")
    probe += "print(sorted({m for m in sys.modules if m.startswith(" + repr(HEAVY) + ")}), file=sys.stderr)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stderr.strip() == "[]", done.stderr


def test_start_up_costs_at_most_12_bare_interpreters() -> None:
    # Measured three times at most: a burst of load on the machine can inflate one measurement, a
    # start-up that imports too much is over the limit every time.
    measured = [ratios()]
    while max(measured[-1].values()) > AT_MOST and len(measured) < 3:
        measured.append(ratios())
    best = {name: min(m[name] for m in measured) for name in measured[0]}
    assert max(best.values()) <= AT_MOST, f"CPU time over a bare interpreter's: {measured}"
