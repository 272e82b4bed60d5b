"""The ``outbox`` command group: the options every command shares."""

from __future__ import annotations

import importlib

import click
from click.core import ParameterSource

from outbox._core.version import VERSION
from outbox.app import DATABASE_URL_ENV
from outbox.cli._context import APP_ENV, Context
from outbox.cli._logging import configure_logging
from outbox.schema import GENERATION

_COMMANDS = "outbox.cli.commands"
# The module of ``outbox.cli.commands`` that registers each command, imported when the command
# is asked for: ``outbox work`` then imports neither the archive's, the groups' nor the
# console's code (some 50 ms of a worker's start-up). A test holds it equal to what the modules
# register.
COMMAND_MODULES = {
    "archive": "archive",
    "check": "status",
    "dashboard": "dashboard",
    "dead": "groups",
    "demo": "demo",
    "discard": "groups",
    "distribute": "work",
    "fanout": "fanout",
    "find": "groups",
    "flags": "flags",
    "groups": "groups",
    "held": "flow",
    "history": "groups",
    "inbox": "inbox",
    "migrate": "schema",
    "migrate-buffers": "clock",
    "notify": "notify",
    "pause": "flow",
    "prune": "archive",
    "refused": "archive",
    "reindex": "status",
    "replay": "archive",
    "resume": "flow",
    "retry": "groups",
    "run": "run",
    "schema": "schema",
    "show": "groups",
    "status": "status",
    "work": "work",
    "workers": "workers",
}


def register_all() -> None:
    """Import every module of ``outbox.cli.commands``: all the commands registered."""
    for module in sorted(set(COMMAND_MODULES.values())):
        importlib.import_module(f"{_COMMANDS}.{module}")


class CommandGroup(click.Group):
    """The ``outbox`` group: a command's module is imported when the command is asked for;
    every module for the list of commands (the help, completion) and for a name that is none
    of them, so that click's suggestions see them all."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            module = COMMAND_MODULES.get(cmd_name)
            if module is None:
                register_all()
            else:
                importlib.import_module(f"{_COMMANDS}.{module}")
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        register_all()
        return super().list_commands(ctx)


@click.group(cls=CommandGroup)
@click.option(
    "--app",
    "app_spec",
    envvar=APP_ENV,
    metavar="MODULE:ATTR",
    help=f"The Outbox application object (or {APP_ENV}).",
)
@click.option(
    "--database-url",
    envvar=DATABASE_URL_ENV,
    metavar="URL",
    help=f"Database URL, overriding the application's (or {DATABASE_URL_ENV}).",
)
@click.option(
    "--database",
    "database_name",
    envvar="OUTBOX_DATABASE",
    metavar="NAME",
    help="Of an application serving several databases, the one to work on (or OUTBOX_DATABASE).",
)
@click.option(
    "--log-level",
    envvar="OUTBOX_LOG_LEVEL",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
)
@click.option(
    "--log-format",
    envvar="OUTBOX_LOG_FORMAT",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "console", "json"]),
    help="auto: readable on a terminal, JSON lines otherwise.",
)
@click.version_option(
    VERSION, message=f"%(prog)s, version %(version)s (schema generation {GENERATION})"
)
@click.pass_context
def main(
    click_ctx: click.Context,
    app_spec: str | None,
    database_url: str | None,
    database_name: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """outbox: buffer tables drained in bulk by batch handlers."""
    configure_logging(log_level, log_format)

    def source(name: str, option: str, envvar: str) -> str:
        from_env = click_ctx.get_parameter_source(name) is ParameterSource.ENVIRONMENT
        return envvar if from_env else option

    click_ctx.obj = Context(
        app_spec,
        database_url,
        app_source=source("app_spec", "--app", APP_ENV),
        url_source=source("database_url", "--database-url", DATABASE_URL_ENV),
        database_name=database_name,
    )
