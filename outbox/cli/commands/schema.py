"""``outbox migrate`` and ``outbox schema sql``: outbox's own tables."""

from __future__ import annotations

import os

import click

from outbox import _db, schema
from outbox.app import DATABASE_URL_ENV
from outbox.cli._context import Context, parse_url
from outbox.cli._errors import command
from outbox.cli._main import main


@main.command()
@command
def migrate(ctx: Context) -> None:
    """Create or upgrade outbox's own tables (idempotent)."""
    from outbox.migrate import upgrade

    app = ctx.bare_app()
    _db.check_connection(app.engine)
    before, after = upgrade(app.engine)
    where = _db.describe(app.engine.url)
    if before == after:
        click.echo(f"outbox tables are up to date (revision {after}) in {where}")
    else:
        click.echo(f"outbox tables migrated from {before or 'nothing'} to {after} in {where}")


@main.group("schema")
def schema_group() -> None:
    """Inspect outbox's own schema."""


@schema_group.command("sql")
@click.option(
    "--dialect",
    type=click.Choice(["postgresql", "sqlite", "mysql"]),
    default=None,
    help="Dialect of the DDL; default: that of the database URL, else postgresql.",
)
@command
def schema_sql(ctx: Context, dialect: str | None) -> None:
    """Print the DDL of outbox's tables, for teams that manage schema by hand."""
    from sqlalchemy.schema import CreateIndex, CreateTable

    from outbox._db import dialects

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
    target = dialects.dialect_named(dialect)
    if target is None:
        raise click.UsageError(
            f"outbox has no schema for {dialect!r}; use --dialect postgresql, sqlite or mysql"
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
