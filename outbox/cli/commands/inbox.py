"""``outbox inbox``: the inboxes (:mod:`outbox.inbox`), what each keeps, and their prune."""

from __future__ import annotations

import click

from outbox._core.durations import duration
from outbox.cli._context import Context
from outbox.cli._errors import command, ready
from outbox.cli._main import main
from outbox.cli._output import print_json, print_table
from outbox.ops import inboxes
from outbox.ops.inboxes import InboxStatus


@main.group("inbox")
def inbox_group() -> None:
    """The inboxes: the message ids each keeps so that a message delivered again has no
    second effect."""


@inbox_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@command
def inbox_list(ctx: Context, as_json: bool) -> None:
    """Each inbox: its horizon, the ids it keeps, the oldest, the next to expire, and those
    past their horizon a prune has not deleted yet (counts stop at 100,000)."""
    app = ready(ctx.bare_app())
    found = inboxes.inboxes(app)
    if as_json:
        print_json(found)
        return
    print_table(
        ("inbox", "horizon", "ids", "oldest", "newest", "next expiry", "past horizon"),
        [
            (
                i.name,
                horizon_text(i),
                count_text(i.ids, i.capped_at),
                duration(i.oldest_age),
                duration(i.newest_age),
                expiry_text(i.next_expiry_in),
                count_text(i.expired, i.capped_at),
            )
            for i in found
        ],
    )
    click.echo(f"{len(found)} inbox{'es' * (len(found) != 1)}")


@inbox_group.command("prune")
@command
def inbox_prune(ctx: Context) -> None:
    """Delete every inbox's ids past their horizon now, a thousand a transaction (the fleet's
    retention pass and `outbox prune` do it too)."""
    app = ready(ctx.bare_app())
    deleted = inboxes.prune(app)
    click.echo(f"pruned {deleted} inbox id{'s' * (deleted != 1)}")


def count_text(count: int, cap: int | None) -> str:
    """A count; ``at least`` when it reached the cap it was counted to."""
    return f"at least {count}" if cap is not None and count >= cap else str(count)


def horizon_text(status: InboxStatus) -> str:
    """The inbox's horizon, or why it is not known."""
    return duration(status.horizon) if status.declared else "not declared"


def expiry_text(seconds: float | None) -> str:
    """When the next id expires: ``in 59 min``, ``3 min ago`` (waiting for a prune)."""
    if seconds is None:
        return "—"
    return f"in {duration(seconds)}" if seconds >= 0 else f"{duration(-seconds)} ago"


def inbox_line(status: InboxStatus) -> str:
    """One inbox in a line of ``outbox status``."""
    ids = count_text(status.ids, status.capped_at)
    kept = f"kept {duration(status.horizon)}" if status.declared else "not declared here"
    oldest = "" if status.oldest_age is None else f", the oldest {duration(status.oldest_age)}"
    expired = (
        f"; {count_text(status.expired, status.capped_at)} past their horizon, not pruned yet"
        if status.expired
        else ""
    )
    return f"inbox {status.name}: {ids} id{'s' * (status.ids != 1)} ({kept}){oldest}{expired}"
