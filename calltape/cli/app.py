"""The ``calltape`` command (SPEC section 5): one typer app, one way to open the store, one error style.

Exit status: 0 success; 1 only from ``diff`` (the contexts differ) and ``check`` (violations found);
2 any error (one sentence on stderr, never a traceback; ``CALLTAPE_DEBUG=1`` shows it); 130 interrupted.

Start-up imports only what the command needs: the root knows every command by name, summary and
example (:data:`COMMANDS`) and imports a command's module when that command runs (or its help or
completion is asked for), so ``calltape --version`` and ``calltape --help`` never load the store.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from calltape.cli.common import CliState, err
from calltape.errors import CalltapeError, CliError

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

HELP = """\
Event-sourced session store for real-time voice agents.

Every transcript chunk, barge-in, reply and tool call of a call is an event in an append-only log.
These commands import and export that log, rebuild the chat context at any instant, compare calls,
replay them, follow them live, and resume a dropped call on a new agent.

The database is --db URL, else $CALLTAPE_DATABASE_URL, else the embedded SQLite file.
Start with: calltape demo. Shell completion: calltape --install-completion (bash, zsh, fish,
PowerShell), then open a new shell: it completes commands, options and their choices.
"""

EPILOG = (
    "Example: calltape --db sqlite:///calls.db sessions --since 24h\n\n"
    "Global options (--db, --tenant, --all-tenants) may also follow the command. "
    "Exit status: 0 ok · 1 diff found differences, check found violations · 2 error (one sentence on "
    "stderr; CALLTAPE_DEBUG=1 shows the traceback) · 130 interrupted."
)

EXIT_OK = "Exit status: 0 ok · 2 error (one sentence on stderr) · 130 interrupted."
_CONTEXT = {"help_option_names": ["-h", "--help"]}
_LOG = "Log"
_INSPECT = "Inspect"
_LIVE = "Live calls"


@dataclass(frozen=True, slots=True)
class Command:
    """A command the root lists without importing it: where it lives, its panel, its one-line summary
    (the first sentence of its docstring; a test keeps them equal) and an example."""

    module: str
    attribute: str
    panel: str
    summary: str
    example: str
    exits: str = EXIT_OK
    subcommands: Mapping[str, Command] = field(default_factory=dict)

    def epilog(self) -> str:
        """The footer of the command's help: its example and its exit status."""
        return f"Example: {self.example}\n\n{self.exits}"


COMMANDS: dict[str, Command] = {
    "import": Command(
        "calltape.cli.log",
        "import_events",
        _LOG,
        "Append events from JSONL files (plain or gzip) to the log, all or nothing.",
        "calltape import calls.jsonl.gz --json",
    ),
    "export": Command(
        "calltape.cli.log",
        "export_events",
        _LOG,
        "Write sessions' events as JSON Lines on standard output, one session after another.",
        "calltape export --all --since 7d > last-week.jsonl",
    ),
    "replay": Command(
        "calltape.cli.log",
        "replay",
        _LOG,
        "Copy a session's log (or its prefix up to N) into a new session id.",
        "calltape replay call-42 --into call-42-v2 --to 17",
    ),
    "redact": Command(
        "calltape.cli.redact",
        "redact",
        _LOG,
        "Replace card numbers, emails, phone numbers and SSNs in stored sessions with a label, in place.",
        "calltape redact call-42 --kinds card,email",
    ),
    "delete": Command(
        "calltape.cli.erase",
        "delete",
        _LOG,
        "Erase sessions for good: events, snapshots and summary, in one transaction each.",
        "calltape delete call-42 --yes",
    ),
    "prune": Command(
        "calltape.cli.erase",
        "prune",
        _LOG,
        "Erase every session whose last event is older than a duration (retention), one at a time.",
        "calltape prune --older-than 30d --dry-run",
    ),
    "db": Command(
        "calltape.cli.log",
        "",
        _LOG,
        "Manage the database schema.",
        "calltape --db postgresql://owner@db/calls db upgrade",
        subcommands={
            "upgrade": Command(
                "calltape.cli.log",
                "db_upgrade",
                _LOG,
                "Apply the schema migrations to the database (the embedded SQLite file upgrades itself).",
                "calltape --db postgresql://owner@db/calls db upgrade --grant voice_app",
            ),
            "info": Command(
                "calltape.cli.log",
                "db_info",
                _LOG,
                "Show which database calltape uses and whether its schema is current.",
                "calltape db info --json",
            ),
        },
    ),
    "sessions": Command(
        "calltape.cli.inspect",
        "sessions",
        _INSPECT,
        "List sessions with their summary: agent, tenant, status, events, epoch, times.",
        "calltape sessions --agent triage --since 24h --limit 20",
    ),
    "show": Command(
        "calltape.cli.timeline",
        "show",
        _INSPECT,
        "Show a session as a timeline: user and agent lanes, heard vs generated text, tools, barge-ins.",
        "calltape show call-42 --html call-42.html",
    ),
    "context": Command(
        "calltape.cli.inspect",
        "context",
        _INSPECT,
        "Print the chat context of a session at an instant, as JSON.",
        "calltape context call-42 --at 17 --format openai",
    ),
    "diff": Command(
        "calltape.cli.inspect",
        "diff",
        _INSPECT,
        "Compare two sessions' contexts, or one session's context at two instants.",
        "calltape diff call-42 call-42-v2",
        exits="Exit status: 0 the contexts are the same · 1 they differ · 2 error · 130 interrupted.",
    ),
    "stats": Command(
        "calltape.cli.live",
        "stats",
        _INSPECT,
        "Figures from the log: counts, tool outcomes, effects, recoveries and the voice latencies of a call or many.",
        "calltape stats --agent triage --since 7d --json",
    ),
    "check": Command(
        "calltape.cli.check",
        "check",
        _INSPECT,
        "Check recorded calls for barge-in bugs; one line per violation.",
        "calltape check --all --since 24h",
        exits="Exit status: 0 no violation · 1 violations found · 2 error (one sentence on stderr) · 130 interrupted.",
    ),
    "tail": Command(
        "calltape.cli.live",
        "tail",
        _LIVE,
        "Follow the log and print events as they are appended, until Ctrl-C.",
        "calltape tail call-42 --json",
        exits="Exit status: 130 on Ctrl-C (the way to stop it) · 2 error (one sentence on stderr).",
    ),
    "resume": Command(
        "calltape.cli.live",
        "resume",
        _LIVE,
        "Resume a call on a new agent: settle what was in flight, fence the old writer, print the plan.",
        "calltape resume call-42 --agent concierge-v2 --dry-run",
    ),
    "serve": Command(
        "calltape.cli.live",
        "serve",
        _LIVE,
        "Receive the hosted platforms' webhooks and record the calls; serve metrics and timelines.",
        "calltape serve --host 0.0.0.0 --port 8787",
    ),
    "demo": Command(
        "calltape.cli.live",
        "demo",
        _LIVE,
        "One bad call's story, offline, in a few seconds: barge-in, crash, resume, fenced zombie.",
        "calltape demo",
    ),
}


class ConventionalOption(TyperOption):
    """An option as its help shows it: a flag has no placeholder, a value its word (``--db URL``), never
    a Python type (``<str>``, ``<int range>``); bounds are said in the option's own help."""

    def display_type_rich(self, ctx: Any) -> str | None:
        """No placeholder for a flag; the metavar for a value."""
        if self.is_flag:
            return None
        return self.metavar if self.metavar is not None else super().display_type_rich(ctx)

    def _get_number_range_help_str(self) -> str | None:
        return None


class ConventionalArgument(TyperArgument):
    """An argument as its word (``SESSION``), ``SESSION...`` for several, ``[SESSION]`` when optional."""

    def display_type_rich(self, ctx: Any) -> str | None:
        """The argument's word already names it: no type beside it."""
        return None

    def _usage_display_name(self) -> str:
        word = self.metavar or (self.name or "").upper()
        if self.nargs != 1:
            word += "..."
        return word if self.required else f"[{word}]"


def conventional(command: Any) -> Any:
    """Gives every parameter of ``command`` (and of its subcommands) the conventional help display."""
    for param in command.params:
        if isinstance(param, TyperOption):
            param.__class__ = ConventionalOption
        elif isinstance(param, TyperArgument):
            param.__class__ = ConventionalArgument
    for sub in getattr(command, "commands", {}).values():
        conventional(sub)
    return command


def _typer(**settings: Any) -> typer.Typer:
    return typer.Typer(
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
        context_settings=_CONTEXT,
        add_completion=False,  # the root's --install-completion covers every command
        **settings,
    )


def load(name: str) -> Any:
    """The command ``name``, imported and built (its module is imported now, not at start-up)."""
    entry = COMMANDS[name]
    module = importlib.import_module(entry.module)
    if entry.subcommands:
        group = _typer(cls=WholeSummaries, help=entry.summary, epilog=entry.epilog(), no_args_is_help=True)
        for sub, spec in entry.subcommands.items():
            group.command(sub, epilog=spec.epilog())(getattr(module, spec.attribute))
        command = typer.main.get_command(group)
    else:
        single = _typer()
        single.command(name, epilog=entry.epilog(), rich_help_panel=entry.panel)(getattr(module, entry.attribute))
        command = typer.main.get_command(single)
    command.name = name
    return conventional(command)


class WholeSummaries(TyperGroup):
    """A group whose help lists each command with its whole summary (wrapped, never cut off with "...")."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The commands and their summaries (the first paragraph of each one's help)."""
        rows = [
            (name, (command.help or "").split("\n\n")[0].replace("\n", " ").strip())
            for name, command in self.commands.items()
            if not command.hidden
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


class LazyGroup(WholeSummaries):
    """The root: lists every command from :data:`COMMANDS` and imports one only to run it (or to show
    its own help, or complete its options)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, entry in COMMANDS.items():
            self.commands[name] = TyperCommand(
                name=name, help=entry.summary, rich_help_panel=entry.panel, rich_markup_mode=None
            )
        self._loaded: set[str] = set()

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        """Resolves as click does (with typer's "did you mean"), then swaps in the real command."""
        name, command, rest = super().resolve_command(ctx, args)
        if name in COMMANDS and name not in self._loaded:
            command = self.commands[name] = load(name)
            self._loaded.add(name)
        return name, command, rest


app = typer.Typer(
    name="calltape",
    cls=LazyGroup,
    help=HELP,
    epilog=EPILOG,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings=_CONTEXT,
)


@app.callback()
def _root(
    ctx: typer.Context,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="URL",
            help="Database: postgresql://user@host/db or sqlite:///path. "
            "Default: $CALLTAPE_DATABASE_URL, else the embedded SQLite file.",
            show_default=False,
        ),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant",
            metavar="NAME",
            help="Open the store for one tenant: every command sees and writes only that tenant's sessions "
            "(default $CALLTAPE_TENANT). On PostgreSQL the database enforces it (row-level security; connect as "
            "a role prepared by `db upgrade --grant ROLE`); on SQLite, one file per deployment, calltape filters. "
            "Without a tenant, commands see only the sessions that have none.",
            show_default=False,
        ),
    ] = None,
    all_tenants: Annotated[
        bool,
        typer.Option(
            "--all-tenants",
            help="Open the store for every tenant (the operator's: prune, delete, export across tenants; "
            "same as CALLTAPE_TENANT='*'). On PostgreSQL it needs a superuser or BYPASSRLS role.",
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", help="Print the installed version and exit.", is_eager=True, callback=_show_version
        ),
    ] = False,
) -> None:
    ctx.obj = CliState(db=db)
    if all_tenants:
        from calltape.eventstore.tenancy import ALL_TENANTS

        if tenant is not None:
            raise CliError("--tenant and --all-tenants exclude each other: give one")
        tenant = ALL_TENANTS
    if tenant is not None:
        # Every store this process opens (commands, `serve`, `tail`) reads it there, as from the shell.
        from calltape.eventstore.tenancy import ENV_TENANT

        os.environ[ENV_TENANT] = tenant


def _show_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"calltape {installed_version()}\n")
        raise typer.Exit(0)


def installed_version() -> str:
    """The version of the calltape package running (``calltape.__version__``, the distribution's own;
    importlib.metadata would cost ``--version`` a tenth of its start-up)."""
    from calltape.version import __version__

    return __version__


def _click_exceptions() -> ModuleType:
    """Typer ≥ 0.22 vendors click as ``typer._click``; older versions use click itself."""
    try:
        return importlib.import_module("typer._click.exceptions")
    except ImportError:  # pragma: no cover - older typer
        return importlib.import_module("click.exceptions")


def _fail(message: str) -> int:
    """Prints the one-sentence error. The message is user data (ids, paths, values): never markup."""
    message = message.strip().rstrip(".")
    from rich.text import Text

    line = Text("error:", style="bold red")
    line.append(" " + message)
    err().print(line, highlight=False, soft_wrap=True)
    return EXIT_ERROR


GLOBAL_OPTIONS = ("--db", "--tenant")
"""Options of the root command (with a value) that users may also write after the subcommand."""
GLOBAL_FLAGS = ("--all-tenants",)
"""Flags of the root command that users may also write after the subcommand."""


def hoist_global_options(argv: Sequence[str]) -> list[str]:
    """``calltape sessions --db URL`` means ``calltape --db URL sessions``: move every global option
    (and its value) to the front, leaving everything after ``--`` alone."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    args = list(argv)
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i:])
            break
        name = arg.split("=", 1)[0]
        if arg in GLOBAL_FLAGS:
            front.append(arg)
        elif name in GLOBAL_OPTIONS:
            if "=" in arg:
                front.append(arg)
            elif i + 1 < len(args):
                front.extend(args[i : i + 2])
                i += 1
            else:
                rest.append(arg)  # no value: let the parser say so
        else:
            rest.append(arg)
        i += 1
    return front + rest


def _usage(exc: Any) -> int:
    message = exc.format_message().strip().rstrip(".")
    where = exc.ctx.command_path if exc.ctx is not None else "calltape"
    if message:
        message = message[0].lower() + message[1:]
    return _fail(f"{message} (see '{where} --help')")


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    command = conventional(typer.main.get_command(app))
    debug = bool(os.environ.get("CALLTAPE_DEBUG"))
    cx = _click_exceptions()
    args = hoist_global_options(sys.argv[1:] if argv is None else argv)
    try:
        rv = command.main(args=args, prog_name="calltape", standalone_mode=False)
    except cx.NoArgsIsHelpError as exc:
        if exc.ctx is not None:
            typer.echo(exc.ctx.get_help())
        rv = 0
    except cx.UsageError as exc:
        rv = _usage(exc)
    except cx.ClickException as exc:
        rv = _fail(exc.format_message())
    except (getattr(cx, "Abort", typer.Abort), typer.Abort, KeyboardInterrupt):
        rv = EXIT_INTERRUPTED
    except CalltapeError as exc:
        if debug:
            raise
        rv = _fail(str(exc) or type(exc).__name__)
    except Exception as exc:
        if debug:
            raise
        rv = _fail(
            f"unexpected {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''} "
            "(run again with CALLTAPE_DEBUG=1 for the traceback, and please report it)"
        )
    sys.exit(rv if isinstance(rv, int) else 0)
