"""``outbox flags``: the flag handlers (:meth:`outbox.Outbox.flagged`), the rows flagged on each
business table, and how many of them wait to be taken into the handler's buffer."""

from __future__ import annotations

import click

from outbox.cli._context import Context
from outbox.cli._errors import command, ready
from outbox.cli._main import main
from outbox.cli._output import print_json, print_table
from outbox.cli.commands.inbox import count_text
from outbox.ops import flags
from outbox.ops.flags import FlagStatus


@main.group("flags")
def flags_group() -> None:
    """The flag handlers: rows of a business table flagged by the application, handled in
    groups through a buffer of their keys."""


@flags_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@command
def flags_list(ctx: Context, as_json: bool) -> None:
    """Each flag handler: its business table, flag and version, its buffer, the rows flagged,
    those not taken into the buffer yet (the next distribution takes them), the keys in the
    buffer and those held by dead rows (counts stop at 100,000)."""
    app = ready(ctx.app())
    found = flags.flag_tables(app)
    if as_json:
        print_json(found)
        return
    print_table(
        ("handler", "flag", "version", "buffer", "flagged", "not taken", "in buffer", "held"),
        [
            (f.handler, f"{f.table}.{f.flag}", f.version, f.buffer,
             *(_count(n, f.capped_at) for n in (f.flagged, f.waiting, f.keys, f.held)))
            for f in found
        ],
    )  # fmt: skip
    for f in found:
        if f.error is not None:
            click.echo(f"{f.handler}: its tables could not be read: {f.error}")
    click.echo(f"{len(found)} flag handler{'s' * (len(found) != 1)}")


def _count(count: int | None, cap: int | None) -> str:
    return "?" if count is None else count_text(count, cap)


def flags_line(status: FlagStatus) -> str:
    """One flag handler in a line of ``outbox status``: its flag, and the rows flagged on
    either side of its buffer (its backlog, groups and dead letters are in the handlers'
    table)."""
    source = f"flags {status.handler}: {status.table}.{status.flag} (version {status.version})"
    if status.error is not None:
        return f"{source}: its tables could not be read: {status.error}"
    # Read, as no error was met.
    assert status.flagged is not None
    assert status.waiting is not None
    cap = status.capped_at
    held = (
        f"; {count_text(status.held, cap)} held by dead rows (outbox held list)"
        if status.held
        else ""
    )
    return (
        f"{source}: {count_text(status.flagged, cap)} flagged, "
        f"{count_text(status.waiting, cap)} not taken into {status.buffer} yet{held}"
    )
