"""``outbox notify``: PostgreSQL notify triggers on buffer tables."""

from __future__ import annotations

import click

from outbox.cli._context import Context
from outbox.cli._errors import check_buffers, command
from outbox.cli._main import main
from outbox.ops import database


@main.group("notify")
def notify_group() -> None:
    """PostgreSQL notify triggers on buffer tables: instant wake-ups for idle workers."""


@notify_group.command("install")
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@command
def notify_install(ctx: Context, handlers: tuple[str, ...]) -> None:
    """Create (or replace) the notify trigger of each buffer; idempotent."""
    from outbox.ops import notify

    app = ctx.app()
    database.check_connection(app.engine)
    check_buffers(app, handlers)
    for table in notify.install(app, handlers):
        click.echo(f"notify trigger installed on {table}")


@notify_group.command("remove")
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@command
def notify_remove(ctx: Context, handlers: tuple[str, ...]) -> None:
    """Drop the notify trigger of each buffer (workers fall back to polling)."""
    from outbox.ops import notify

    app = ctx.app()
    database.check_connection(app.engine)
    check_buffers(app, handlers)
    for table in notify.remove(app, handlers):
        click.echo(f"notify trigger removed from {table}")


@notify_group.command("sql")
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@command
def notify_sql(ctx: Context, handlers: tuple[str, ...]) -> None:
    """Print the trigger DDL, for an application's own migrations."""
    from outbox.ops import notify

    for statement in notify.ddl(ctx.app(), handlers):
        click.echo(statement + ";")
