"""``outbox workers``: the fleet's workers, and asking one of them, wherever it runs, to drain
or stop."""

from __future__ import annotations

import click

from outbox.cli._context import Context
from outbox.cli._errors import command, ready
from outbox.cli._main import main
from outbox.cli._output import print_json, print_table
from outbox.ops import fleet
from outbox.schema import WorkerRequest


@main.group("workers")
def workers_group() -> None:
    """The fleet's workers; ask one to drain or stop (it acts at its next heartbeat)."""


@workers_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@command
def workers_list(ctx: Context, as_json: bool) -> None:
    """Each worker with a row: id, host, pid, groups held, whether alive, what it was asked."""
    app = ready(ctx.app())
    found = fleet.workers(app)
    if as_json:
        print_json(found)
        return
    print_table(
        ("id", "host", "pid", "groups held", "alive", "asked"),
        [
            (
                w.id,
                w.hostname,
                str(w.pid),
                str(w.groups_held),
                "alive" if w.alive else "gone",
                f"{w.request} by {w.requested_by}" if w.request else "",
            )
            for w in found
        ],
    )
    click.echo(f"{len(found)} worker{'s' * (len(found) != 1)}")


def _ask(ctx: Context, worker_id: str, request: WorkerRequest) -> None:
    click.echo(fleet.ask(ready(ctx.app()), worker_id, request).text())


@workers_group.command("drain")
@click.argument("worker_id")
@command
def workers_drain(ctx: Context, worker_id: str) -> None:
    """Ask WORKER_ID to finish the groups it holds, however long they take, take no more and
    exit (0)."""
    _ask(ctx, worker_id, WorkerRequest.DRAIN)


@workers_group.command("stop")
@click.argument("worker_id")
@command
def workers_stop(ctx: Context, worker_id: str) -> None:
    """Ask WORKER_ID to stop as SIGTERM stops it: what it holds finishes within its shutdown
    grace period."""
    _ask(ctx, worker_id, WorkerRequest.STOP)
