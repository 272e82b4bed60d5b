"""``outbox migrate`` and ``outbox schema sql``: outbox's own tables."""

from __future__ import annotations

import os

import click

from outbox import schema
from outbox.app import DATABASE_URL_ENV
from outbox.cli._context import Context, parse_url
from outbox.cli._errors import command, named_database
from outbox.cli._main import main
from outbox.cli._progress import reporting
from outbox.ops import database


@main.command()
@click.option(
    "--to",
    "to",
    default="head",
    show_default=True,
    metavar="REVISION",
    help="The revision to migrate to, up or down: head, a revision (0003), or base (no tables).",
)
@click.option(
    "--yes",
    is_flag=True,
    help="Downgrade even when the downgrade drops rows (pauses, held keys, jobs ...).",
)
@click.option(
    "--lock-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="How long a statement waits for a lock (workers queue behind it meanwhile) before "
    "its revision is rolled back and tried again; a few tries, then it gives up. Default: 5.",
)
@command
def migrate(ctx: Context, to: str, yes: bool, lock_timeout: float | None) -> None:
    """Create, upgrade or downgrade outbox's own tables (idempotent; one run at a time)."""
    # Imported here: alembic is only needed by this command.
    from outbox.ops.migrate import DEFAULT_LOCK_TIMEOUT_SECONDS
    from outbox.ops.migrate import migrate as run_migrations

    # Each database of an application serving several, in turn (unless --database names one).
    for app in ctx.each_database() if ctx.app_spec else [ctx.bare_app()]:
        with named_database(app):
            database.check_connection(app.engine)
            with reporting("migrate") as progress:
                before, after = run_migrations(
                    app.engine,
                    to,
                    lock_timeout=DEFAULT_LOCK_TIMEOUT_SECONDS
                    if lock_timeout is None
                    else lock_timeout,
                    accept_losses=yes,
                    on_retry=lambda line: click.echo(line, err=True),
                    progress=progress,
                )
        where = database.describe(app.engine.url)
        name = "" if app.database_name is None else f"database {app.database_name}: "
        if before == after:
            click.echo(
                f"{name}outbox tables are up to date (revision {after or 'none'}) in {where}"
            )
        else:
            click.echo(
                f"{name}outbox tables migrated from {before or 'nothing'} to {after or 'nothing'}"
                f" in {where}"
            )


@main.group("schema")
def schema_group() -> None:
    """Inspect outbox's own schema."""


@schema_group.command("sql")
@click.option(
    "--dialect",
    type=click.Choice(database.SUPPORTED),
    default=None,
    help="Dialect of the DDL; default: that of the database URL, else postgresql.",
)
@command
def schema_sql(ctx: Context, dialect: str | None) -> None:
    """Print the DDL of outbox's tables, for teams that manage schema by hand."""
    from sqlalchemy.schema import CreateIndex, CreateTable

    if dialect is None:
        # Only the URL's kind matters: DDL needs no driver and no connection.
        url = ctx.database_url or os.environ.get(DATABASE_URL_ENV)
        backend = (
            parse_url(url, ctx.url_source if ctx.database_url else DATABASE_URL_ENV)
            if url
            else ctx.url()
            if ctx.app_spec
            else None
        )
        dialect = "postgresql" if backend is None else backend.get_backend_name()
    target = database.dialect_named(dialect)
    if target is None:
        raise click.UsageError(
            f"outbox has no schema for {dialect!r}; use --dialect "
            + ", ".join(sorted(database.SUPPORTED))
        )
    for table in schema.metadata.sorted_tables:
        click.echo(str(CreateTable(table).compile(dialect=target)).strip() + ";\n")
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            click.echo(str(CreateIndex(index).compile(dialect=target)).strip() + ";")
        if table is schema.schema_state:
            # Its one row: the generation these tables are, which workers read at start.
            row = schema.generation_row().compile(
                dialect=target, compile_kwargs={"literal_binds": True}
            )
            click.echo(str(row).strip() + ";")
        click.echo()
