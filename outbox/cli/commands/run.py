"""``outbox run --once``: rescue, distribute and run what is due once, for cron or a
Kubernetes CronJob; any number may run at once.

Exit codes: 0 the run did its work (groups that failed and will be retried, a tick another
caller had taken and a budget spent with work left are all part of a normal run); 1 groups were
dead-lettered or held as refused in this run (an operator's to look at), or a buffer table is
missing; 2 usage error; 3 database unreachable.
"""

from __future__ import annotations

import click

from outbox.cli._context import Context
from outbox.cli._errors import EXIT_FAILURE, command, fail, ready
from outbox.cli._main import main
from outbox.cli._options import LEASE, Seconds
from outbox.cli._output import json_text
from outbox.cli._signals import stop_flag
from outbox.once import (
    DEFAULT_BUDGET_SECONDS,
    MAX_BUDGET_SECONDS,
    MAX_EVERY_SECONDS,
    MIN_EVERY_SECONDS,
    run_once,
)

BUDGET = Seconds(0.0, MAX_BUDGET_SECONDS, exclude_minimum=True)
EVERY = Seconds(MIN_EVERY_SECONDS, MAX_EVERY_SECONDS)


@main.command()
@click.option(
    "--once",
    is_flag=True,
    required=True,
    help="Rescue, distribute and run what is due, then exit (the only mode: `outbox work` "
    "runs until stopped).",
)
@click.option(
    "--every",
    type=EVERY,
    default=None,
    metavar="SECONDS",
    help="The schedule's interval (a cron line each minute: 60): distribute only when this "
    "run takes the interval's tick, so that of runs on the same tick one distributes "
    f"({EVERY.allowed}). Default: distribute at every run.",
)
@click.option(
    "--budget",
    type=BUDGET,
    default=DEFAULT_BUDGET_SECONDS,
    show_default=True,
    metavar="SECONDS",
    help=f"Start no job after this long; the job in flight finishes ({BUDGET.allowed}).",
)
@click.option(
    "--max-groups",
    type=click.IntRange(1),
    default=None,
    metavar="N",
    help="Start no job after N groups (default: no bound).",
)
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@click.option(
    "--lease",
    type=LEASE,
    default=None,
    metavar="SECONDS",
    help=f"Job lease length: how long a killed run's groups wait ({LEASE.allowed}).",
)
@click.option("--json", "as_json", is_flag=True, help="The result as one line of JSON.")
@command
def run(
    ctx: Context,
    once: bool,
    every: float | None,
    budget: float,
    max_groups: int | None,
    handlers: tuple[str, ...],
    lease: float | None,
    as_json: bool,
) -> None:
    """Run outbox's work once and exit: from cron, safe to overlap (exit 1 when groups were
    dead-lettered or held as refused). SIGTERM/SIGINT: start no more jobs, finish the one in
    flight and exit as usual; twice: at once."""
    app = ctx.app()
    if lease is not None:
        app.with_settings(lease_seconds=lease)
    ready(app, handlers)
    with stop_flag() as stop:
        result = run_once(
            app,
            every=every,
            budget_seconds=budget,
            max_groups=max_groups,
            handlers=handlers,
            stop=stop,
        )
    click.echo(json_text(result) if as_json else result.summary())
    if result.needs_operator:
        work = result.work
        fail(
            f"{work.groups_dead} groups dead-lettered and {work.groups_refused} held as refused "
            "in this run (outbox dead, outbox refused list)",
            EXIT_FAILURE,
        )
