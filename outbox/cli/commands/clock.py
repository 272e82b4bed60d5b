"""``outbox migrate-buffers``: buffer tables made by releases that wrote MariaDB's clock as the
session's local time, made UTC."""

from __future__ import annotations

import click

from outbox.cli._context import Context
from outbox.cli._errors import check_buffers, command
from outbox.cli._main import main
from outbox.cli._progress import reporting
from outbox.ops import buffer_clock, database


@main.command("migrate-buffers")
@click.option("--dry-run", is_flag=True, help="Say what would be done, per buffer; change nothing.")
@command
def migrate_buffers(ctx: Context, dry_run: bool) -> None:
    """MariaDB/MySQL: make each buffer's created_at default UTC, and convert the rows written
    in the session's local time to UTC (after an upgrade from a release that wrote local time;
    safe beside producers and workers; run with the application's --app)."""
    app = ctx.app()
    database.check_connection(app.engine)
    why = app.supports.zone_free_clock
    if why is not None:
        click.echo(f"nothing to do: {why}")
        return
    check_buffers(app, ())
    tables = [handler.table for handler in app.select_handlers(())]
    if not tables:
        click.echo("nothing to do: the application has no handlers, so no buffers")
        return
    with reporting("migrate-buffers", dry_run=dry_run) as progress:
        done = buffer_clock.migrate_buffers(app, tables, dry_run=dry_run, progress=progress)
    for migration in done:
        click.echo(migration.text())
