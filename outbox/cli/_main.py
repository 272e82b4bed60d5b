"""The ``outbox`` command group: the options every command shares."""

from __future__ import annotations

import click
from click.core import ParameterSource

from outbox._core.version import VERSION
from outbox.app import DATABASE_URL_ENV
from outbox.cli._context import APP_ENV, Context
from outbox.cli._logging import configure_logging
from outbox.schema import GENERATION


@click.group()
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
    )
