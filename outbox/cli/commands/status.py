"""``outbox status``, ``outbox check`` and ``outbox reindex``: where the handlers stand."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Any

import click

from outbox import Outbox, lifecycle
from outbox._core.durations import duration
from outbox.cli._context import Context
from outbox.cli._errors import EXIT_FAILURE, command, named_database, ready
from outbox.cli._main import main
from outbox.cli._options import MAX_DEAD_SINCE_SECONDS, DurationOrOff
from outbox.cli._output import bytes_text, print_table, ratio_text
from outbox.cli._progress import reporting
from outbox.ops import buffer_clock, fleet, metrics, scaling
from outbox.ops.metrics import HandlerStatus

# Held ordering keys listed by `outbox status`; `outbox held list` lists them all.
HELD_KEYS_SHOWN = 10


@main.command()
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@click.option("--dry-run", is_flag=True, help="Say what would be rebuilt; change nothing.")
@command
def reindex(ctx: Context, handlers: tuple[str, ...], dry_run: bool) -> None:
    """Rebuild bloated buffer indexes after a backlog drained (PostgreSQL; safe from cron)."""
    from outbox.ops.reindex import reindex as reindex_buffers

    app = ready(ctx.app(), handlers)
    with reporting("reindex", dry_run=dry_run) as progress:
        reports = reindex_buffers(app, handlers, dry_run=dry_run, progress=progress)
    print_table(
        ("table", "index", "size", "rows need", "action", "size after"),
        [
            (r.table, r.index, bytes_text(r.bytes), bytes_text(r.needed_bytes), r.action,
             "" if r.bytes_after is None else bytes_text(r.bytes_after))
            for r in reports
        ],
    )  # fmt: skip


# `--dead-since` of `status` and `check`: the window in which a dead letter raises an alert.
dead_since_option = click.option(
    "--dead-since",
    type=DurationOrOff(MAX_DEAD_SINCE_SECONDS),
    default="24h",
    show_default=True,
    metavar="DURATION",
    help="Alert on events dead-lettered less than this long ago (90s, 15m, 12h, 30d, 2w; "
    "0 or off: no dead-letter alert).",
)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@dead_since_option
@command
def status(ctx: Context, as_json: bool, handlers: tuple[str, ...], dead_since: float) -> None:
    """Per handler: backlog, oldest event age, staleness, groups by state, dead letters; of
    each database, for an application serving several (unless --database names one)."""
    apps = ctx.each_database()
    if len(apps) == 1 and apps[0].database_name is None:
        document = _status_of(apps[0], as_json, handlers, dead_since)
        if document is not None:
            click.echo(json.dumps(document, indent=2))
        return
    if as_json:
        documents = {}
        for app in apps:
            with named_database(app):
                documents[app.database_name] = _status_of(app, True, handlers, dead_since)
        click.echo(json.dumps({"databases": documents}, indent=2))
        return
    for index, app in enumerate(apps):
        if index:
            click.echo()
        click.echo(f"database {app.database_name}")
        with named_database(app):
            _status_of(app, False, handlers, dead_since)


def _status_of(
    app: Outbox, as_json: bool, handlers: tuple[str, ...], dead_since: float
) -> dict[str, Any] | None:
    """Print one database's status; with ``as_json``, return its document instead."""
    app = ready(app, handlers)
    rows = _started(app, handlers, dead_since)
    band_rows = metrics.bands(rows)
    versions = fleet.fleet(app)
    wanted = scaling.read_scaling(app, handlers)
    if as_json:
        return {
            "handlers": [r.as_dict() for r in rows],
            "bands": [b.as_dict() for b in band_rows],
            "fleet": versions.as_dict(),
            "scaling": wanted.as_dict(),
        }
    print_table(
        ("handler", "urgency", "paused", "unclaimed", "oldest", "staleness",
         "waiting", "in flight", "retrying", "refused", "failed", "dead", "alerts"),
        [
            (r.handler, r.urgency, _paused(r), str(r.unclaimed), duration(r.oldest_age),
             ratio_text(r.staleness), str(r.groups_waiting), str(r.groups_in_flight),
             str(r.groups_retrying),
             str(r.groups_refused), str(r.max_failed_attempts), str(r.dead), str(len(r.alerts)))
            for r in rows
        ],
    )  # fmt: skip
    click.echo()
    print_table(
        ("band", "promise", "handlers", "unclaimed", "oldest", "staleness", "failed", "dead"),
        [
            (b.urgency, duration(b.promise), str(len(b.handlers)), str(b.unclaimed),
             duration(b.oldest_age), ratio_text(b.staleness), str(b.max_failed_attempts),
             str(b.dead))
            for b in band_rows
        ],
    )  # fmt: skip
    click.echo()
    _print_scaling(wanted)
    _print_fleet(versions)
    for r in rows:
        if r.paused:
            click.echo(
                f"{r.handler}: {metrics.pause_text(r.pause_cause, r.paused_for, r.pause_reason)}"
            )
    for r in rows:
        for limit in r.rate_limits:
            click.echo(f"{r.handler}: rate limit {limit}")
        if r.guarantee is not None:
            click.echo(f"{r.handler}: delivery {r.guarantee}")
        if r.refused_at_start is not None:
            reason = r.refused_at_start.removeprefix(f"handler {r.handler!r}: ")
            click.echo(f"{r.handler}: a worker refuses to start: {reason}")
        for key in r.held_keys[:HELD_KEYS_SHOWN]:
            click.echo(f"{r.handler}: key {key} held by a dead group (outbox held list)")
        if len(r.held_keys) > HELD_KEYS_SHOWN:
            click.echo(f"{r.handler}: {len(r.held_keys) - HELD_KEYS_SHOWN} more held keys")
    for r in rows:
        for holding in r.silent_holdings:
            click.echo(f"{r.handler}: {holding.text()}")
    for r in rows:
        for alert in r.alerts:
            click.echo(f"alert: {r.handler} ({r.urgency}): {alert}")
    return None


def _started(app: Outbox, handlers: tuple[str, ...], dead_since: float) -> list[HandlerStatus]:
    """Each handler's status, read after its object's start check ran (as a worker runs it:
    a sink connects, reads what it checks, such as a stream's duplicate window, and closes),
    with why a worker would refuse to start it."""
    refused = lifecycle.refusals(app, app.select_handlers(handlers))
    rows = metrics.collect(app, handlers, dead_since=dead_since)
    return [replace(r, refused_at_start=refused.get(r.handler)) for r in rows]


def _print_scaling(wanted: scaling.Scaling) -> None:
    """Desired worker slots against the fleet's, the drain time, and each band's Apdex."""
    drain = "" if wanted.drain_seconds is None else f", drains in {duration(wanted.drain_seconds)}"
    wanted_slots = f"{wanted.desired_workers} slot{'s' * (wanted.desired_workers != 1)}"
    click.echo(f"desired workers: {wanted_slots} (live: {wanted.fleet_slots}){drain}")
    apdex = [
        f"{b.urgency} {b.apdex:.2f} ({b.handled} events)"
        for b in wanted.bands
        if b.apdex is not None
    ]
    if apdex:
        click.echo(f"apdex over the last {duration(wanted.apdex_window)}: {', '.join(apdex)}")


def _print_fleet(versions: fleet.Fleet) -> None:
    """The schema generation, and the live workers by outbox version."""
    if versions.generation is None:
        click.echo("schema generation: none recorded")
    else:
        by = f", migrated by outbox {versions.migrated_by}" if versions.migrated_by else ""
        click.echo(
            f"schema generation {versions.generation} (workers from generation "
            f"{versions.workers_from}){by}"
        )
    if not versions.workers:
        click.echo("no live workers")
        return
    print_table(
        ("outbox", "generation", "live workers"),
        [
            (w.text(), "-" if w.generation is None else str(w.generation), str(w.live))
            for w in versions.workers
        ],
    )


def _paused(row: metrics.HandlerStatus) -> str:
    if not row.paused:
        return "probing" if row.breaker == "probing" else "no"
    return "until resumed" if row.paused_for is None else duration(row.paused_for)


@main.command()
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@dead_since_option
@command
def check(ctx: Context, handlers: tuple[str, ...], dead_since: float) -> None:
    """Exit 1 when a handler breaks its band's promise or dead-lettered events lately (for
    cron, probes, monitoring); warn of live workers older than the schema."""
    app = ready(ctx.app(), handlers)
    rows = _started(app, handlers, dead_since)
    broken = [(r, alert) for r in rows for alert in r.alerts]
    for r, alert in broken:
        click.echo(f"{r.handler} ({r.urgency}): {alert}")
    # What a worker refuses at start (the very check it runs) fails a pre-deploy check.
    refused = [r.refused_at_start for r in rows if r.refused_at_start is not None]
    for reason in refused:
        click.echo(f"alert: {reason}")
    # A buffer whose times outbox would misread (a worker refuses to start) is an alert; one
    # that only sessions in other zones would date wrongly is a warning.
    clocks = buffer_clock.check(app, [h.table for h in app.select_handlers(handlers)])
    for finding in clocks:
        click.echo(f"{'alert' if finding.refuse else 'warning'}: {finding.text}")
    # Old workers alive break no promise yet: a warning, not an alert.
    for line in fleet.old_worker_warnings(app):
        click.echo(f"warning: {line}")
    if broken or refused or any(finding.refuse for finding in clocks):
        sys.exit(EXIT_FAILURE)
    click.echo("all promises hold")
