"""``outbox replay``, ``outbox prune`` and ``outbox refused``: the archive and held groups."""

from __future__ import annotations

import uuid

import click

from outbox import archive, schema
from outbox.app import MAX_BATCH_SIZE
from outbox.cli._context import Context
from outbox.cli._errors import command, ready
from outbox.cli._main import main
from outbox.cli._options import MAX_PRUNE_AGE_SECONDS, Duration
from outbox.cli._output import error_text, print_table


@main.command()
@click.option("--handler", default=None, help="Only events of this handler.")
@click.option(
    "--status",
    "status_",
    type=click.Choice(list(schema.ArchiveStatus)),
    default=None,
    help="Only events archived with this status.",
)
@click.option("--group", "group_id", type=click.UUID, default=None, help="Only this group.")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed, change nothing.")
@command
def replay(
    ctx: Context,
    handler: str | None,
    status_: str | None,
    group_id: uuid.UUID | None,
    dry_run: bool,
) -> None:
    """Put archived events back into their buffers to be handled again."""
    app = ready(ctx.app(), () if handler is None else (handler,))
    result = archive.replay(
        app, handler=handler, status=status_, group_id=group_id, dry_run=dry_run
    )
    verb = "would replay" if dry_run else "replayed"
    detail = ", ".join(f"{h}: {n}" for h, n in sorted(result.by_handler.items()))
    click.echo(f"{verb} {result.events} events" + (f" ({detail})" if detail else ""))


@main.group("refused")
def refused_group() -> None:
    """Groups whose outcome the database refused to record: held until released."""


@refused_group.command("list")
@click.option("--handler", default=None, help="Only groups of this handler.")
@command
def refused_list(ctx: Context, handler: str | None) -> None:
    """Each held group: handler, group id, attempts, and the database's error."""
    from outbox import refused

    app = ready(ctx.app())
    held = refused.groups(app, handler)
    print_table(
        ("handler", "group", "attempts", "error"),
        [(g.handler, str(g.group_id), str(g.attempts), error_text(g.error)) for g in held],
    )
    click.echo(f"{len(held)} refused group{'s' * (len(held) != 1)}")


@refused_group.command("release")
@click.option("--handler", default=None, help="Only groups of this handler.")
@click.option("--group", "group_id", type=click.UUID, default=None, help="Only this group.")
@command
def refused_release(ctx: Context, handler: str | None, group_id: uuid.UUID | None) -> None:
    """Give held groups back to the workers, to be handled again (fix the cause first)."""
    from outbox import refused

    app = ready(ctx.app())
    count = refused.release(app, handler, group_id)
    click.echo(f"released {count} refused group{'s' * (count != 1)}")


@main.command()
@click.option(
    "--older-than",
    required=True,
    type=Duration(MAX_PRUNE_AGE_SECONDS),
    metavar="DURATION",
    help="Delete archive rows archived longer ago than this (90s, 15m, 12h, 30d, 2w).",
)
# A chunk is deleted in one transaction: at most as many rows as the largest group a handler
# may take in one (a larger number only overflows the database's integers).
@click.option(
    "--chunk",
    default=archive.PRUNE_CHUNK,
    show_default=True,
    type=click.IntRange(1, MAX_BATCH_SIZE),
    help="Rows deleted per transaction.",
)
@command
def prune(ctx: Context, older_than: float, chunk: int) -> None:
    """Delete old archive rows in bounded batches, and the rate limits of keys gone quiet."""
    from outbox import flow

    app = ready(ctx.bare_app())
    pruned = archive.prune(app, older_than=older_than, chunk=chunk)
    forgotten = flow.forget_idle_limits(app)
    click.echo(f"pruned {pruned} archive rows, {forgotten} idle rate limits")
