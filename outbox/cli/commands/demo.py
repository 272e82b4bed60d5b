"""``outbox demo``: the whole pipeline on a throwaway database."""

from __future__ import annotations

import click
from click.core import ParameterSource

from outbox.cli._context import Context, load_driver, parse_url
from outbox.cli._errors import command
from outbox.cli._logging import configure_logging
from outbox.cli._main import main
from outbox.cli._signals import interrupt_flag


@main.command()
@click.option("--events", default=5000, show_default=True, type=int, help="Events to write.")
@click.option(
    "--database-url",
    "demo_url",
    default=None,
    metavar="URL",
    help="Run on this database instead of a fresh SQLite file.",
)
@click.pass_context
@command
def demo(ctx: Context, click_ctx: click.Context, events: int, demo_url: str | None) -> None:
    """Write events through simulated transactions and drain them, on SQLite by default."""
    from outbox.cli._demo import run_demo

    group = click_ctx.parent
    if group is not None and group.get_parameter_source("log_level") is ParameterSource.DEFAULT:
        # The demo talks through its own summary; per-batch log lines would drown it.
        configure_logging("error", group.params["log_format"])
    if events < 1:
        raise click.BadParameter("must be >= 1", param_hint="--events")
    if demo_url is not None:
        load_driver(parse_url(demo_url, "--database-url"), "--database-url")
    with interrupt_flag() as interrupted:
        run_demo(events=events, database_url=demo_url, interrupted=interrupted)
