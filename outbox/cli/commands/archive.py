"""``outbox replay``, ``outbox prune`` and ``outbox refused``: the archive and refused groups."""

from __future__ import annotations

import uuid

import click

from outbox import schema
from outbox.cli._context import Context
from outbox.cli._errors import EXIT_USAGE, command, fail, ready
from outbox.cli._main import main
from outbox.cli._options import ARCHIVE_STATUS, MAX_PRUNE_AGE_SECONDS, Duration
from outbox.cli._output import error_text, json_text, print_json, print_table
from outbox.cli._progress import reporting
from outbox.cli.commands.groups import print_operation
from outbox.handler import MAX_BATCH_SIZE
from outbox.ops import archive, edit, group_operations
from outbox.ops.replay import REPLAY_CHUNK, REPLAYABLE
from outbox.ops.replay import replay as replay_archived
from outbox.ops.selection import Selection

# The statuses a replay takes, in the order ArchiveStatus spells them.
_REPLAYABLE = ", ".join(s.value for s in schema.ArchiveStatus if s.value in REPLAYABLE)


@main.command()
@click.option("--handler", default=None, help="Only events of this handler.")
@click.option(
    "--status",
    "statuses",
    type=ARCHIVE_STATUS,
    multiple=True,
    help="Only events archived with this status (repeatable).",
)
@click.option(
    "--all",
    "all_statuses",
    is_flag=True,
    help="Events of every status: discarded and succeeded ones are sent again too (superseded "
    "ones never: a later event carried their state).",
)
@click.option(
    "--group",
    "group_ids",
    type=click.UUID,
    multiple=True,
    help="Only this group (all its events; repeatable).",
)
@click.option(
    "--older-than",
    type=Duration(MAX_PRUNE_AGE_SECONDS),
    default=None,
    metavar="DURATION",
    help="Only dead groups archived longer ago than this (90s, 15m, 12h, 30d).",
)
@click.option("--error", default=None, help="Only dead groups whose error holds this text.")
@click.option("--key", default=None, help="Only dead groups with an event of this ordering key.")
@click.option("--payload", default=None, help="Only dead groups with an event holding this text.")
@click.option(
    "--event",
    "event_id",
    type=int,
    default=None,
    help="With --group and --set: replay this dead or discarded event with values changed.",
)
@click.option(
    "--set",
    "changes",
    multiple=True,
    metavar="COLUMN=VALUE",
    help="With --event: the new value of a column (repeatable; 'null' for NULL).",
)
@click.option(
    "--new-ids",
    is_flag=True,
    help="Give the events new ids: consumers take them as new events (ordered handlers' keep "
    "theirs).",
)
@click.option("--dry-run", is_flag=True, help="Show what would be replayed, change nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of text.")
@click.option(
    "--chunk",
    default=REPLAY_CHUNK,
    show_default=True,
    type=click.IntRange(1, MAX_BATCH_SIZE),
    help="Events replayed per transaction.",
)
@command
def replay(
    ctx: Context,
    handler: str | None,
    statuses: tuple[str, ...],
    all_statuses: bool,
    group_ids: tuple[uuid.UUID, ...],
    older_than: float | None,
    error: str | None,
    key: str | None,
    payload: str | None,
    event_id: int | None,
    changes: tuple[str, ...],
    new_ids: bool,
    dry_run: bool,
    as_json: bool,
    chunk: int,
) -> None:
    """Put archived events back into their buffers to be handled again.

    Say which: --status dead for the dead letters (repeat --status for several), --all for
    every status, --group for groups' events, or the filters of `outbox groups` (--older-than,
    --error, --key, --payload) for dead groups. Given none of them, it says what the archive
    holds and changes nothing. --group G --event ID --set COLUMN=VALUE replays one dead or
    discarded event with values changed. Each event goes back under its own id, so sinks send
    it under its own message id (--new-ids: new ids, new messages). Each replay is recorded
    (`outbox history`); the archive keeps the replayed rows, marked replayed.
    """
    if statuses and all_statuses:
        fail("--status and --all: give one or the other", EXIT_USAGE)
    if (event_id is None) != (not changes):
        fail("--event and --set go together: the event to edit and its new values", EXIT_USAGE)
    if new_ids and event_id is not None:
        fail("--new-ids and --event: an edited event keeps its id", EXIT_USAGE)
    app = ready(ctx.app(), () if handler is None else (handler,))
    if event_id is not None:
        if len(group_ids) != 1:
            fail("--event needs the one --group the event is in", EXIT_USAGE)
        edited = edit.edit(app, group_ids[0], event_id, _changes(changes))
        if as_json:
            print_json(edited)
        else:
            click.echo(
                f"replayed event {edited.event_id} of group {edited.group_id} as event "
                f"{edited.new_event_id} ({', '.join(edited.changed)} changed; operation "
                f"{edited.operation_id})"
            )
        return
    filtered = any(v is not None for v in (older_than, error, key, payload))
    if filtered:
        if statuses or all_statuses:
            fail("--older-than, --error, --key and --payload take dead groups: no --status or "
                 "--all with them", EXIT_USAGE)  # fmt: skip
        selection = Selection(
            handlers=() if handler is None else (handler,),
            statuses=(schema.GroupStatus.DEAD, schema.GroupStatus.HELD),
            older_than=older_than,
            error=error,
            key=key,
            payload=payload,
            group_ids=group_ids,
        )
        with reporting("replay", dry_run=dry_run) as progress:
            replayed = group_operations.replay(
                app, selection, dry_run=dry_run, chunk=chunk, progress=progress, new_ids=new_ids
            )
        print_operation(replayed, as_json)
        return
    if not statuses and not all_statuses and not group_ids:
        found = _by_status(archive.counts(app, handler=handler))
        holds = ", ".join(f"{n} {s}" for s, n in found.items()) or "no events"
        fail(
            f"replay needs --status (one or several of {_REPLAYABLE}) or --all; the archive "
            f"holds {holds}{'' if handler is None else f' (handler {handler})'}",
            EXIT_USAGE,
        )
    with reporting("replay", dry_run=dry_run) as progress:
        result = replay_archived(
            app,
            handler=handler,
            status=statuses or None,
            group_ids=group_ids or None,
            dry_run=dry_run,
            all_statuses=all_statuses,
            chunk=chunk,
            progress=progress,
            new_ids=new_ids,
        )
    if as_json:
        print_json(result)
        return
    verb = "would replay" if dry_run else "replayed"
    detail = ", ".join(f"{h}: {n}" for h, n in sorted(result.by_handler.items()))
    record = "" if result.operation_id is None else f" (operation {result.operation_id})"
    click.echo(f"{verb} {result.events} events" + (f" ({detail})" if detail else "") + record)
    if dry_run and result.groups:
        print_table(
            ("handler", "group", "events"),
            [
                (h, "-" if g is None else str(g), str(n))
                for (h, g), n in sorted(result.groups.items(), key=lambda item: str(item[0]))
            ],
        )


def _changes(given: tuple[str, ...]) -> dict[str, str | None]:
    """``COLUMN=VALUE`` options as a mapping; ``null`` is NULL."""
    changes: dict[str, str | None] = {}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            fail(f"--set {item!r}: expected COLUMN=VALUE", EXIT_USAGE)
        changes[name.strip()] = None if value == "null" else value
    return changes


def _by_status(counts: dict[tuple[str, str], int]) -> dict[str, int]:
    """Archived events per status, in the order ArchiveStatus spells them."""
    totals = {s.value: 0 for s in schema.ArchiveStatus}
    for (_, status), count in counts.items():
        totals[status] = totals.get(status, 0) + count
    return {s: n for s, n in totals.items() if n}


@main.group("refused")
def refused_group() -> None:
    """Groups whose outcome the database refused to record: held until released."""


@refused_group.command("list")
@click.option("--handler", default=None, help="Only groups of this handler.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@command
def refused_list(ctx: Context, handler: str | None, as_json: bool) -> None:
    """Each held group: handler, group id, attempts, and the database's error."""
    from outbox.ops import holds

    app = ready(ctx.app())
    held = holds.refused_groups(app, handler)
    if as_json:
        print_json(held)
        return
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
    from outbox.ops import holds

    app = ready(ctx.app())
    count = holds.release_refused(app, handler, group_id)
    click.echo(f"released {count} refused group{'s' * (count != 1)}")


@main.command()
@click.option(
    "--older-than",
    required=True,
    type=Duration(MAX_PRUNE_AGE_SECONDS),
    metavar="DURATION",
    help="Delete archive rows archived longer ago than this (90s, 15m, 12h, 30d, 2w).",
)
@click.option(
    "--status",
    "statuses",
    type=ARCHIVE_STATUS,
    multiple=True,
    help=(
        "Only rows of this status (repeatable). Default: "
        f"{', '.join(archive.PRUNE_STATUSES)}; dead letters stay unless named (--status dead)."
    ),
)
@click.option("--all", "all_statuses", is_flag=True, help="Rows of every status, dead letters too.")
@click.option(
    "--dry-run", is_flag=True, help="Count the rows it would delete, per handler and status."
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
def prune(
    ctx: Context,
    older_than: float,
    statuses: tuple[str, ...],
    all_statuses: bool,
    dry_run: bool,
    chunk: int,
) -> None:
    """Delete old archive rows in bounded batches, and the rate limits of keys gone quiet.

    Dead letters are kept unless named: --status dead, or --all.
    """
    from outbox.ops import flow

    if statuses and all_statuses:
        fail("--status and --all: give one or the other", EXIT_USAGE)
    app = ready(ctx.bare_app())
    chosen = None if all_statuses else (statuses or archive.PRUNE_STATUSES)
    if dry_run:
        found = archive.counts(app, status=chosen, older_than=older_than)
        print_table(
            ("handler", "status", "rows"),
            [(h, s, str(n)) for (h, s), n in sorted(found.items())],
        )
        click.echo(f"would prune {sum(found.values())} archive rows")
    else:
        with reporting("prune") as progress:
            pruned = archive.prune(
                app,
                older_than=older_than,
                chunk=chunk,
                status=chosen,
                all_statuses=all_statuses,
                progress=progress,
            )
        forgotten = flow.forget_idle_limits(app)
        click.echo(f"pruned {pruned} archive rows, {forgotten} idle rate limits")
    if chosen is not None and schema.ArchiveStatus.DEAD not in chosen:
        kept = sum(
            archive.counts(app, status=schema.ArchiveStatus.DEAD, older_than=older_than).values()
        )
        if kept:
            click.echo(
                f"kept {kept} dead letter{'s' * (kept != 1)} as old: replay them "
                "(outbox replay --status dead) or prune them by name (--status dead)"
            )


@main.group("archive")
def archive_group() -> None:
    """The archive: events delivered (with archive=True), dead, discarded, expired, replayed,
    superseded."""


@archive_group.command("list")
@click.option("--handler", default=None, help="Only events of this handler.")
@click.option(
    "--status",
    "statuses",
    type=ARCHIVE_STATUS,
    multiple=True,
    help="Only events archived with this status (repeatable).",
)
@click.option("--group", "group_id", type=click.UUID, default=None, help="Only this group.")
@click.option(
    "--payload",
    default=None,
    help=f"Only events whose values hold this text (among the newest {archive.PAYLOAD_SCAN:,}).",
)
@click.option(
    "--limit", default=50, show_default=True, type=click.IntRange(1, 1000), help="Events shown."
)
@click.option("--before", type=int, default=None, help="The next page: the id a listing printed.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@command
def archive_list(
    ctx: Context,
    handler: str | None,
    statuses: tuple[str, ...],
    group_id: uuid.UUID | None,
    payload: str | None,
    limit: int,
    before: int | None,
    as_json: bool,
) -> None:
    """Archived events, newest first: why each is there, its values, what became of it (the
    operation that replayed or discarded it, the event a replay made of it)."""
    app = ready(ctx.app())
    found = archive.browse(
        app,
        status=statuses or None,
        handler=handler,
        group_id=group_id,
        payload=payload,
        limit=limit,
        before=before,
    )
    if as_json:
        print_json(found)
        return
    print_table(
        ("id", "archived", "handler", "group", "event", "status", "became", "error", "values"),
        [
            (
                str(e.id),
                e.archived_at.isoformat(sep=" ", timespec="seconds"),
                e.handler,
                "-" if e.group_id is None else str(e.group_id),
                str(e.event_id),
                e.status.value,
                "-" if e.replay_event_id is None else f"event {e.replay_event_id}",
                error_text(e.error, 60),
                json_text(e.values)[:80],
            )
            for e in found.events
        ],
    )
    if found.searched is not None:
        click.echo(f"searched the newest {found.searched:,} archived events")
    if found.next is not None:
        click.echo(f"more: --before {found.next}")


@archive_group.command("days")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@command
def archive_days(ctx: Context, as_json: bool) -> None:
    """The archive's partitions by day (PostgreSQL from migration 0009, MariaDB from 0010): rows
    (estimated), dead letters kept, size; and the retention the application sets."""
    app = ready(ctx.bare_app())
    found = archive.parts(app)
    days = app.settings.archive_retention_days
    if as_json:
        print_json({"retention_days": days, "partitions": found})
        return
    if not found:
        click.echo("the archive is one table here: retention and prune delete its rows")
    else:
        print_table(
            ("partition", "day", "rows", "dead", "size"),
            [
                (
                    p.name,
                    "-" if p.day is None else p.day.isoformat(),
                    f"{p.rows:,}",
                    "-" if p.dead_rows is None else f"{p.dead_rows:,}",
                    f"{p.bytes / 2**20:,.1f} MiB",
                )
                for p in found
            ],
        )
    click.echo(
        "retention: off (Settings.archive_retention_days)"
        if days is None
        else f"retention: {days} days of history, dead letters kept"
    )
