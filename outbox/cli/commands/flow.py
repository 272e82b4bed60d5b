"""``outbox pause`` / ``resume`` (a handler's work across the fleet) and ``outbox held`` (the
ordering keys dead groups hold back)."""

from __future__ import annotations

import datetime as dt
import uuid

import click

from outbox._core.checks import MAX_WAIT_SECONDS
from outbox._core.durations import duration
from outbox.app import Outbox
from outbox.cli._context import Context
from outbox.cli._errors import command, ready
from outbox.cli._main import main
from outbox.cli._options import Duration
from outbox.cli._output import error_text, print_json, print_table
from outbox.ops import fleet


class _Moment(click.ParamType[dt.datetime]):
    """An ISO 8601 time (``2026-11-26T18:00:00+01:00``); UTC when it names no offset."""

    name = "time"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> dt.datetime:
        if isinstance(value, dt.datetime):
            return value
        try:
            moment = dt.datetime.fromisoformat(str(value))
        except ValueError:
            self.fail(f"{value!r} is not an ISO 8601 time (2026-11-26T18:00:00Z)", param, ctx)
        return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


@main.command()
@click.argument("handler")
@click.option(
    "--for",
    "for_",
    type=Duration(MAX_WAIT_SECONDS),
    default=None,
    metavar="DURATION",
    help="End the pause by itself after this long (90s, 15m, 12h, 2d).",
)
@click.option(
    "--until",
    type=_Moment(),
    default=None,
    help="End the pause by itself at this ISO 8601 time (UTC unless it has an offset).",
)
@click.option("--reason", default=None, help="Why, for status and check.")
@command
def pause(
    ctx: Context,
    handler: str,
    for_: float | None,
    until: dt.datetime | None,
    reason: str | None,
) -> None:
    """Pause HANDLER on every worker: its events wait, nothing is lost (until resumed, or
    --for / --until)."""
    from outbox.ops import flow

    if for_ is not None and until is not None:
        raise click.UsageError("give --for or --until, not both")
    app = ready(ctx.app())
    flow.pause(app, handler, until=for_ if until is None else until, reason=reason)
    state = flow.paused(app).get(handler)
    if state is None:
        click.echo(f"{handler}: the pause asked for has ended already")
    elif state.seconds_left is None:
        click.echo(f"paused {handler} until resumed (outbox resume {handler})")
    else:
        click.echo(f"paused {handler} for {duration(state.seconds_left)}")
    _warn_of_workers_that_ignore(app, fleet.PAUSES)


@main.command()
@click.argument("handler")
@command
def resume(ctx: Context, handler: str) -> None:
    """End HANDLER's pause now, whoever paused it, and close its circuit breaker."""
    from outbox.ops import flow

    app = ready(ctx.app())
    was_paused = flow.resume(app, handler)
    click.echo(f"resumed {handler}" if was_paused else f"{handler} was not paused")
    _warn_of_workers_that_ignore(app, fleet.PAUSES)


def _warn_of_workers_that_ignore(app: Outbox, lever: str) -> None:
    """A line on stderr for each group of live workers too old to honour ``lever``: the
    command did its part, and those workers go on as if it had not."""
    for line in fleet.lever_warnings(app, lever):
        click.echo(f"warning: {line}", err=True)


@main.group("held")
def held_group() -> None:
    """Ordering keys that dead groups hold back: their later events wait until released."""


@held_group.command("list")
@click.option("--handler", default=None, help="Only keys of this handler.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@command
def held_list(ctx: Context, handler: str | None, as_json: bool) -> None:
    """Each held key: handler, key, the dead group holding it, and its error."""
    from outbox.ops import holds

    app = ready(ctx.app())
    keys = holds.held_keys(app, handler)
    if as_json:
        print_json(keys)
        return
    print_table(
        ("handler", "key", "group", "error"),
        [(k.handler, k.key, str(k.group_id), error_text(k.error)) for k in keys],
    )
    click.echo(f"{len(keys)} held key{'s' * (len(keys) != 1)}")


@held_group.command("release")
@click.option("--handler", default=None, help="Only keys of this handler.")
@click.option("--key", default=None, help="Only this key (as text).")
@click.option("--group", "group_id", type=click.UUID, default=None, help="Only this group's keys.")
@command
def held_release(
    ctx: Context, handler: str | None, key: str | None, group_id: uuid.UUID | None
) -> None:
    """Let held keys' later events go without their dead events (replay them instead to have
    them handled first)."""
    from outbox.ops import holds

    app = ready(ctx.app())
    count = holds.release_keys(app, handler, key, group_id)
    click.echo(f"released {count} held key{'s' * (count != 1)}")
