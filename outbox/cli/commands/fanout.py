"""``outbox fanout``: the fan-outs (:meth:`outbox.Outbox.fanout`), what waits in each buffer,
and a consumer added later started from the events the archive keeps."""

from __future__ import annotations

import click

from outbox._core.durations import duration
from outbox.cli._context import Context
from outbox.cli._errors import EXIT_USAGE, check_buffers, command, fail, ready
from outbox.cli._main import main
from outbox.cli._output import print_json, print_table
from outbox.cli._progress import reporting
from outbox.cli.commands.inbox import count_text
from outbox.handler import MAX_BATCH_SIZE
from outbox.ops import fanout
from outbox.ops.fanout import BACKFILL_CHUNK, FanoutStatus
from outbox.ops.progress import COUNT_CAP


@main.group("fanout")
def fanout_group() -> None:
    """The fan-outs: a buffer the application writes, copied into a buffer per consumer."""


@fanout_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@command
def fanout_list(ctx: Context, as_json: bool) -> None:
    """Each fan-out: its source and its consumers, with the handler draining each, the events
    waiting in each buffer (counted up to 100,000) and the oldest; whether it archives, which
    a consumer added later starts from (`outbox fanout backfill`)."""
    app = ready(ctx.app())
    found = fanout.fanouts(app)
    if as_json:
        print_json(found)
        return
    rows: list[tuple[str, ...]] = []
    for f in found:
        rows.append((f.name, "source", f.source, "-", count_text(f.events, f.capped_at),
                     duration(f.oldest_age)))  # fmt: skip
        rows += [
            (f.name, "consumer", c.table, c.handler or "none here",
             count_text(c.events, f.capped_at), duration(c.oldest_age))
            for c in f.consumers
        ]  # fmt: skip
    print_table(("fan-out", "role", "buffer", "handler", "events", "oldest"), rows)
    for f in found:
        click.echo(f"{f.name}: {archive_text(f)}")
    click.echo(f"{len(found)} fan-out{'s' * (len(found) != 1)}")


@fanout_group.command("backfill")
@click.argument("consumer")
@click.option(
    "--dry-run", is_flag=True, help="Count what it would copy and what the buffer holds already."
)
@click.option("--yes", is_flag=True, help="Copy them; without it, say what it would start from.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of text.")
@click.option(
    "--chunk",
    default=BACKFILL_CHUNK,
    show_default=True,
    type=click.IntRange(1, MAX_BATCH_SIZE),
    help="Archived events read per transaction.",
)
@command
def fanout_backfill(
    ctx: Context, consumer: str, dry_run: bool, yes: bool, as_json: bool, chunk: int
) -> None:
    """Start CONSUMER (its handler's name, or its buffer table's), added to a fan-out later,
    from everything the fan-out's archive keeps: copy each archived event its buffer does not
    hold, under its own id. Pause its handler before the fan-out copies into it (`outbox
    pause`) and resume it once this is done: its buffer is how the backfill tells what it got
    already. Once per consumer; recorded (`outbox history`)."""
    app = ready(ctx.app())
    plan = fanout.backfill_plan(app, consumer)
    check_buffers(app, (plan.fanout,))
    if not dry_run and not yes:
        kept = f"more than {COUNT_CAP:,}" if plan.archived is None else f"{plan.archived:,}"
        goes_on = "" if plan.resumes is None else f", going on from operation {plan.resumes}"
        fail(
            f"a backfill would copy into {plan.consumer} the {kept} events the archive of "
            f"{plan.fanout} keeps, less those its buffer holds{goes_on}: give --yes to copy "
            "them (--dry-run counts them)",
            EXIT_USAGE,
        )
    with reporting("fanout backfill", dry_run=dry_run) as progress:
        result = fanout.backfill(app, consumer, dry_run=dry_run, chunk=chunk, progress=progress)
    if as_json:
        print_json(result)
        return
    verb = "would copy" if dry_run else "copied"
    record = "" if result.operation_id is None else f" (operation {result.operation_id})"
    click.echo(
        f"{verb} {result.copied} event{'s' * (result.copied != 1)} into {result.consumer} "
        f"from the archive of {result.fanout}; {result.held} held already{record}"
    )
    if result.handler is not None and not dry_run:
        click.echo(f"resume {result.handler} to hand them over: outbox resume {result.handler}")


def archive_text(status: FanoutStatus) -> str:
    """Whether a fan-out archives, and what a consumer added later starts from."""
    if status.archives:
        return "archives its events: a consumer added later starts from those kept"
    return "does not archive: a consumer added later starts from its addition"


def fanout_line(status: FanoutStatus) -> str:
    """One fan-out in a line of ``outbox status``: its consumers (those drained by a handler
    have their backlog in the handlers' table; the others' is said here)."""
    consumers = ", ".join(
        f"{c.table} ({c.handler})"
        if c.handler is not None
        else f"{c.table} (no handler here: {count_text(c.events, status.capped_at)} waiting"
        + ("" if c.oldest_age is None else f", the oldest {duration(c.oldest_age)}")
        + ")"
        for c in status.consumers
    )
    return f"fanout {status.name}: {status.source} into {consumers}; {archive_text(status)}"
