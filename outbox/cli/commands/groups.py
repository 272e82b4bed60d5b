"""``outbox groups``, ``outbox show``, ``outbox find``, ``outbox dead``, ``outbox retry``,
``outbox discard`` and ``outbox history``: groups as an operator sees them, and what operators
did to them."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from typing import Any

import click

from outbox import schema
from outbox._core.durations import duration
from outbox.cli._context import Context
from outbox.cli._errors import EXIT_USAGE, command, fail, ready
from outbox.cli._main import main
from outbox.cli._options import MAX_PRUNE_AGE_SECONDS, Duration
from outbox.cli._output import error_text, json_text, print_json, print_table
from outbox.cli._progress import reporting
from outbox.ops import group_operations, groups, operators, search
from outbox.ops.selection import Selection, parse_statuses

GROUP_STATUS = click.Choice([s.value for s in schema.GroupStatus], case_sensitive=False)
_DEAD = (schema.GroupStatus.DEAD, schema.GroupStatus.HELD)


_FILTERS = ("handlers", "statuses", "older_than", "error", "key", "payload", "group_ids")


def selection_options(
    *, statuses: tuple[schema.GroupStatus, ...] | None = None
) -> Callable[[Callable[..., Any]], Any]:
    """The filters every group command takes, in one place, so that they read the same; the
    command gets them as one ``selection`` (a :class:`outbox.ops.selection.Selection`, or the error
    that makes it fail, raised where the command's errors are mapped). ``statuses``: those
    the command always takes (no ``--status``)."""

    def decorate(func: Callable[..., Any]) -> Any:
        @functools.wraps(func)
        def with_selection(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name, None) for name in _FILTERS}
            kwargs["selection"] = functools.partial(_selection, given, statuses)
            return func(*args, **kwargs)

        options = [
            click.option(
                "--handler", "handlers", multiple=True, help="Only this handler (repeatable)."
            ),
            *(
                [
                    click.option(
                        "--status",
                        "statuses",
                        type=GROUP_STATUS,
                        multiple=True,
                        help="Only groups of this status (repeatable).",
                    )
                ]
                if statuses is None
                else []
            ),
            click.option(
                "--older-than",
                type=Duration(MAX_PRUNE_AGE_SECONDS),
                default=None,
                metavar="DURATION",
                help="Only groups made (dead: archived) longer ago than this (90s, 15m, 12h, 30d).",
            ),
            click.option(
                "--error", default=None, help="Only groups whose last error holds this text."
            ),
            click.option(
                "--key", default=None, help="Only groups with an event of this ordering key."
            ),
            click.option(
                "--payload",
                default=None,
                help="Only dead groups with an event whose payload holds this text.",
            ),
            click.option(
                "--group",
                "group_ids",
                type=click.UUID,
                multiple=True,
                help="Only this group (repeatable).",
            ),
        ]
        decorated: Any = with_selection
        for option in reversed(options):
            decorated = option(decorated)
        return decorated

    return decorate


def _selection(given: dict[str, Any], statuses: tuple[schema.GroupStatus, ...] | None) -> Selection:
    return Selection(
        handlers=given["handlers"] or (),
        statuses=statuses or parse_statuses(given["statuses"] or ()),
        older_than=given["older_than"],
        error=given["error"],
        key=given["key"],
        payload=given["payload"],
        group_ids=given["group_ids"] or (),
    )


Selected = Callable[[], Selection]
"""A command's filters, made into a selection when called (inside the command's error
mapping)."""


def _print_groups(listing: groups.Listing) -> None:
    print_table(
        ("handler", "group", "status", "events", "attempts", "age", "next run", "worker", "error"),
        [
            (
                g.handler,
                str(g.group_id),
                g.status.value,
                str(g.events),
                str(g.attempts) + (f" (+{g.deferrals} deferred)" if g.deferrals else ""),
                duration(g.age),
                _due_text(g.due_in),
                g.worker or "-",
                error_text(g.error, 80),
            )
            for g in listing.groups
        ],
    )
    counts = ", ".join(f"{n} {s.value}" for s, n in listing.counts.items()) or "none"
    more = f" (at least: counting stops at {groups.COUNT_CAP})" if listing.capped else ""
    click.echo(f"{len(listing.groups)} shown of {listing.total} groups{more}: {counts}")
    if listing.next is not None:
        click.echo(f"more: --after {listing.next}")


def _due_text(due_in: float | None) -> str:
    if due_in is None:
        return "-"
    return "now" if due_in <= 0 else f"in {duration(due_in)}"


def _list(
    ctx: Context,
    selection: Selection,
    limit: int,
    after: str | None,
    as_json: bool,
) -> None:
    app = ready(ctx.app())
    listing = groups.find(app, selection, limit=limit, after=after)
    if as_json:
        print_json(listing)
    else:
        _print_groups(listing)


LIMIT = click.option(
    "--limit",
    default=groups.DEFAULT_LIMIT,
    show_default=True,
    type=click.IntRange(1, groups.MAX_LIMIT),
    help="Groups shown.",
)
AFTER = click.option(
    "--after", default=None, metavar="CURSOR", help="The next page: the cursor a listing printed."
)
JSON = click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")


@main.command("groups")
@selection_options()
@LIMIT
@AFTER
@JSON
@command
def list_groups(
    ctx: Context,
    selection: Selected,
    limit: int,
    after: str | None,
    as_json: bool,
) -> None:
    """Groups and where each stands: in flight, waiting, retrying, deferred, paused,
    refused, held or dead; with their events, attempts, age, next run and last error."""
    _list(ctx, selection(), limit, after, as_json)


def _show(ctx: Context, group_id: uuid.UUID, as_json: bool) -> None:
    app = ready(ctx.app())
    detail = groups.show(app, group_id)
    if as_json:
        print_json(detail)
        return
    g = detail.group
    click.echo(f"group {g.group_id}")
    click.echo(f"  handler   {g.handler}")
    click.echo(f"  status    {g.status.value}")
    click.echo(f"  events    {g.events}")
    click.echo(f"  attempts  {g.attempts}" + (f" (+{g.deferrals} deferred)" if g.deferrals else ""))
    click.echo(f"  age       {duration(g.age)}")
    click.echo(f"  next run  {_due_text(g.due_in)}")
    if detail.lease is not None:
        lease = detail.lease
        expires = (
            "never (held as refused)" if lease.expires_in is None else _due_text(lease.expires_in)
        )
        heartbeat = (
            "no worker row"
            if lease.heartbeat_age is None
            else f"{duration(lease.heartbeat_age)} ago"
        )
        click.echo(
            f"  lease     {lease.worker or '-'}, expires {expires}, last heartbeat {heartbeat}"
        )
    if detail.archived:
        click.echo(
            "  archived  " + ", ".join(f"{n} {s}" for s, n in sorted(detail.archived.items()))
        )
    elif detail.delivered_unarchived:
        click.echo("  archived  no: delivered, and its handler does not archive")
    if g.error and not detail.attempts:
        click.echo("last error:")
        click.echo(_indented(g.error, "  "))
    click.echo(f"attempts that did not succeed: {len(detail.attempts)}")
    for attempt in detail.attempts:
        click.echo(
            f"  #{attempt.attempt} {attempt.outcome.value}, {duration(attempt.age)} ago, "
            f"on {attempt.worker or 'a worker not known'}:"
        )
        if attempt.error:
            click.echo(_indented(attempt.error, "    "))
    more = f", {detail.more_events} more not shown" if detail.more_events else ""
    click.echo(f"events: {len(detail.events)}{more}")
    for event in detail.events:
        state = f" [{event.status}]" if event.status else ""
        click.echo(f"  {event.id}{state} {_values_text(event.values)}")
        if event.error and event.status == schema.ArchiveStatus.DEAD and event.error != g.error:
            click.echo(f"    error: {error_text(event.error)}")


def _indented(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.strip().splitlines())


def _values_text(values: dict[str, Any]) -> str:
    # Escaped: a payload is shown as JSON, so that no control character reaches the terminal.
    return json_text(values)


@main.command("show")
@click.argument("group_id", type=click.UUID, metavar="GROUP")
@JSON
@command
def show_group(ctx: Context, group_id: uuid.UUID, as_json: bool) -> None:
    """One group in full: its events' values, each attempt that did not succeed with its
    error and traceback, who holds it and when it last heartbeated, its next run."""
    _show(ctx, group_id, as_json)


@main.command("find")
@click.argument("text")
@JSON
@command
def find(ctx: Context, text: str, as_json: bool) -> None:
    """Where an event id, a group id, an ordering key or a producer's ingest key is: in its
    buffer, in a group (and where the group stands), in a dead group or in the archive. Each
    look is bounded; what was not looked at is said."""
    app = ready(ctx.app())
    result = search.search(app, text)
    if as_json:
        print_json(result)
        return
    print_table(
        ("taken as", "where", "handler", "group", "event", "status"),
        [
            (
                f.taken.value,
                f.place.value,
                f.handler,
                str(f.group_id or (f"{f.events} events in no group" if f.events else "")),
                "" if f.event_id is None else str(f.event_id),
                f.status or "",
            )
            for f in result.found
        ],
    )
    for note in result.notes:
        click.echo(f"note: {note}")


@main.group("dead")
def dead_group() -> None:
    """Dead groups: dead-lettered, their events in the archive (held: holding their keys)."""


@dead_group.command("list")
@selection_options(statuses=_DEAD)
@LIMIT
@AFTER
@JSON
@command
def dead_list(
    ctx: Context,
    selection: Selected,
    limit: int,
    after: str | None,
    as_json: bool,
) -> None:
    """The dead groups, the longest dead first: `outbox groups --status dead --status held`."""
    _list(ctx, selection(), limit, after, as_json)


@dead_group.command("show")
@click.argument("group_id", type=click.UUID, metavar="GROUP")
@JSON
@command
def dead_show(ctx: Context, group_id: uuid.UUID, as_json: bool) -> None:
    """A dead group in full: `outbox show GROUP`."""
    _show(ctx, group_id, as_json)


_VERBS = {
    schema.OperationAction.DISCARD: ("discarded", "would discard"),
    schema.OperationAction.REPLAY: ("replayed", "would replay"),
    schema.OperationAction.RETRY: ("made due now", "would make due now"),
}


def print_operation(result: group_operations.OperationResult, as_json: bool) -> None:
    if as_json:
        print_json(result)
        return
    done, would = _VERBS[result.action]
    verb = would if result.dry_run else done
    print_table(
        ("handler", "group", "status", "events"),
        [(g.handler, str(g.group_id), g.status.value, str(g.events)) for g in result.groups],
    )
    for group, why in result.skipped:
        click.echo(f"left {group.group_id} ({group.handler}): {why}")
    record = "" if result.operation_id is None else f" (operation {result.operation_id})"
    click.echo(
        f"{verb} {_count(len(result.groups), 'group')}, {_count(result.events, 'event')}{record}"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


@main.command()
@selection_options()
@click.option("--reason", default=None, help="Why, recorded with the operation.")
@click.option("--dry-run", is_flag=True, help="Name the groups it would discard; change nothing.")
@JSON
@click.option(
    "--chunk",
    default=group_operations.DISCARD_PAGE,
    show_default=True,
    type=click.IntRange(1, groups.MAX_LIMIT),
    help="Groups discarded per transaction.",
)
@command
def discard(
    ctx: Context,
    selection: Selected,
    reason: str | None,
    dry_run: bool,
    as_json: bool,
    chunk: int,
) -> None:
    """Give groups up: never handled again, their events archived as discarded (dead ones
    marked discarded, their held keys released). Groups in flight are left. Takes the filters
    of `outbox groups`, at least one; recorded with who did it (`outbox history`)."""
    chosen = selection()
    if chosen.empty:
        fail("discard needs a filter: --handler, --status, --older-than, --error, --key, "
             "--payload or --group", EXIT_USAGE)  # fmt: skip
    app = ready(ctx.app())
    with reporting("discard", dry_run=dry_run) as progress:
        result = group_operations.discard(
            app, chosen, reason=reason, dry_run=dry_run, page_size=chunk, progress=progress
        )
    print_operation(result, as_json)


@main.command()
@selection_options()
@click.option("--dry-run", is_flag=True, help="Name the groups it would retry; change nothing.")
@JSON
@command
def retry(ctx: Context, selection: Selected, dry_run: bool, as_json: bool) -> None:
    """Run groups now that wait for a retry or a deferral (waiting ones too): each made due,
    taken by a worker at its next poll, its attempts still counted. Groups in flight, paused,
    refused or dead are left, each named with why. Takes the filters of `outbox groups`, at
    least one; recorded with who did it (`outbox history`)."""
    chosen = selection()
    if chosen.empty:
        fail("retry needs a filter: --handler, --status, --older-than, --error, --key, "
             "--payload or --group", EXIT_USAGE)  # fmt: skip
    app = ready(ctx.app())
    print_operation(group_operations.retry(app, chosen, dry_run=dry_run), as_json)


@main.command()
@click.option(
    "--action",
    type=click.Choice([a.value for a in schema.OperationAction], case_sensitive=False),
    default=None,
    help="Only this kind of operation.",
)
@click.option(
    "--limit", default=50, show_default=True, type=click.IntRange(1, 1000), help="Operations shown."
)
@JSON
@command
def history(ctx: Context, action: str | None, limit: int, as_json: bool) -> None:
    """What operators did, newest first: each replay, edit and discard, who did it, when, with
    which filter, and how many groups and events it took."""
    app = ready(ctx.app())
    operations = operators.history(app, action=action, limit=limit)
    if as_json:
        print_json(operations)
        return
    print_table(
        ("id", "when", "action", "by", "groups", "events", "filter", "detail"),
        [
            (
                str(o.id),
                o.done_at.isoformat(sep=" ", timespec="seconds"),
                o.action.value,
                o.actor,
                str(o.groups),
                str(o.events),
                _filter_text(o.selection),
                o.detail or "",
            )
            for o in operations
        ],
    )


def _filter_text(selection: dict[str, Any]) -> str:
    return " ".join(
        f"{name}={','.join(map(str, value)) if isinstance(value, list) else value}"
        for name, value in sorted(selection.items())
    )
