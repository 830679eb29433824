"""The ``calltape`` command (SPEC section 5): one typer app, one way to open the store, one error style.

Exit status: 0 success; 1 only from ``diff`` (the contexts differ); 2 any error (one sentence on
stderr, never a traceback; ``CALLTAPE_DEBUG=1`` shows it); 130 interrupted.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Annotated, Any

import typer
from rich.text import Text

from calltape.cli import erase as erase_cmds
from calltape.cli import inspect as inspect_cmds
from calltape.cli import live as live_cmds
from calltape.cli import log as log_cmds
from calltape.cli import redact as redact_cmds
from calltape.cli import timeline as timeline_cmds
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
Start with **calltape demo**.
"""

EPILOG = (
    "Global options such as --db may also follow the command. "
    "Exit status: 0 ok · 1 diff found differences · 2 error (one sentence on stderr; "
    "CALLTAPE_DEBUG=1 shows the traceback) · 130 interrupted."
)

app = typer.Typer(
    name="calltape",
    help=HELP,
    epilog=EPILOG,
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
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
    """The version of the installed calltape distribution (the package's own when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("calltape")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
        return "unknown (not installed)"


db_app = typer.Typer(
    help="Manage the database schema.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
db_app.command("upgrade")(log_cmds.db_upgrade)
db_app.command("info")(log_cmds.db_info)
app.add_typer(db_app, name="db", rich_help_panel="Log")

_LOG = "Log"
_INSPECT = "Inspect"
_LIVE = "Live calls"

app.command("import", rich_help_panel=_LOG)(log_cmds.import_events)
app.command("export", rich_help_panel=_LOG)(log_cmds.export_events)
app.command("replay", rich_help_panel=_LOG)(log_cmds.replay)
app.command("redact", rich_help_panel=_LOG)(redact_cmds.redact)
app.command("delete", rich_help_panel=_LOG)(erase_cmds.delete)
app.command("prune", rich_help_panel=_LOG)(erase_cmds.prune)

app.command("sessions", rich_help_panel=_INSPECT)(inspect_cmds.sessions)
app.command("show", rich_help_panel=_INSPECT)(timeline_cmds.show)
app.command("context", rich_help_panel=_INSPECT)(inspect_cmds.context)
app.command("diff", rich_help_panel=_INSPECT)(inspect_cmds.diff)
app.command("stats", rich_help_panel=_INSPECT)(live_cmds.stats)
app.command("check", rich_help_panel=_INSPECT)(importlib.import_module("calltape.cli.check").check)

app.command("tail", rich_help_panel=_LIVE)(live_cmds.tail)
app.command("resume", rich_help_panel=_LIVE)(live_cmds.resume)
app.command("serve", rich_help_panel=_LIVE)(live_cmds.serve)
app.command("demo", rich_help_panel=_LIVE)(live_cmds.demo)


def _click_exceptions() -> ModuleType:
    """Typer ≥ 0.22 vendors click as ``typer._click``; older versions use click itself."""
    try:
        return importlib.import_module("typer._click.exceptions")
    except ImportError:  # pragma: no cover - older typer
        return importlib.import_module("click.exceptions")


def _fail(message: str) -> int:
    """Prints the one-sentence error. The message is user data (ids, paths, values): never markup."""
    message = message.strip().rstrip(".")
    line = Text("error:", style="bold red")
    line.append(" " + message)
    err().print(line, highlight=False, soft_wrap=True)
    return EXIT_ERROR


GLOBAL_OPTIONS = ("--db",)
"""Options of the root command that users may also write after the subcommand."""


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
        if name in GLOBAL_OPTIONS:
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
    command = typer.main.get_command(app)
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
