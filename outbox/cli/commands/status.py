"""``outbox status``, ``outbox check`` and ``outbox reindex``: where the handlers stand."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from typing import Any

import click
from sqlalchemy.exc import SQLAlchemyError

from outbox import Outbox, lifecycle
from outbox._core.durations import duration
from outbox.cli._context import Context
from outbox.cli._errors import EXIT_FAILURE, EXIT_OK, command, named_database, ready, said
from outbox.cli._main import main
from outbox.cli._options import MAX_DEAD_SINCE_SECONDS, DurationOrOff
from outbox.cli._output import bytes_text, print_table, ratio_text
from outbox.cli._progress import reporting
from outbox.cli.commands.fanout import fanout_line
from outbox.cli.commands.flags import flags_line
from outbox.cli.commands.inbox import inbox_line
from outbox.exceptions import OutboxError
from outbox.ops import buffer_clock, fanout, flags, fleet, inboxes, metrics, scaling
from outbox.ops.fanout import FanoutStatus
from outbox.ops.flags import FlagStatus
from outbox.ops.inboxes import InboxStatus
from outbox.ops.metrics import HandlerStatus
from outbox.ops.totals import DatabaseTotals, database_totals, fleet_totals

# Held ordering keys listed by `outbox status`; `outbox held list` lists them all.
HELD_KEYS_SHOWN = 10
# Inboxes listed by `outbox status`, a line each; `outbox inbox list` lists them all.
INBOXES_SHOWN = 10


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
        read = _read_status(apps[0], handlers, dead_since)
        if as_json:
            click.echo(json.dumps(read.document(), indent=2))
        else:
            _print_status(read)
        return
    # Of several databases, one that cannot be read is said and the others are shown: an
    # outage of one tenant must not hide the fleet from its operator.
    documents: dict[str, dict[str, Any]] = {}
    totals: dict[str, DatabaseTotals | None] = {}
    code = EXIT_OK
    for index, app in enumerate(apps):
        name = str(app.database_name)
        if not as_json:
            click.echo(("\n" if index else "") + f"database {name}")
        try:
            with named_database(app):
                read = _read_status(app, handlers, dead_since)
        except (OutboxError, SQLAlchemyError) as error:
            message, failure = said(error)
            if not isinstance(error, OutboxError):  # named_database named outbox's own
                message = f"database {name!r}: {message}"
            code = max(code, failure)
            documents[name], totals[name] = {"error": message}, None
            if not as_json:
                click.echo(f"Error: {message}", err=True)
            continue
        documents[name], totals[name] = read.document(), read.totals()
        if not as_json:
            _print_status(read)
    fleet_total = fleet_totals(t for t in totals.values() if t is not None)
    if as_json:
        click.echo(json.dumps({"databases": documents, "total": fleet_total.as_dict()}, indent=2))
    else:
        click.echo()
        _print_totals(totals, fleet_total)
    if code != EXIT_OK:
        sys.exit(code)


def _print_totals(totals: dict[str, DatabaseTotals | None], fleet_total: DatabaseTotals) -> None:
    """Each database on one line (a database that could not be read: ``error``), then the
    fleet as a whole."""
    rows: list[tuple[str, ...]] = []
    for name, total in [*totals.items(), ("(all)", fleet_total)]:
        if total is None:
            rows.append((name, "error", "", "", "", "", "", "", "", ""))
            continue
        rows.append(
            (name, str(total.unclaimed), duration(total.oldest_age), ratio_text(total.staleness),
             str(total.groups_in_flight), str(total.groups_retrying), str(total.groups_refused),
             str(total.dead), str(total.alerts), str(total.workers_alive or 0))
        )  # fmt: skip
    print_table(
        ("database", "unclaimed", "oldest", "staleness", "in flight", "retrying", "refused",
         "dead", "alerts", "workers"),
        rows,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Status:
    """One database's status, as ``outbox status`` reads it."""

    rows: list[HandlerStatus]
    versions: fleet.Fleet
    wanted: scaling.Scaling
    inboxes: list[InboxStatus]
    fanouts: list[FanoutStatus]
    flags: list[FlagStatus]

    def document(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {
            "handlers": [r.as_dict() for r in self.rows],
            "bands": [b.as_dict() for b in metrics.bands(self.rows)],
            "fleet": self.versions.as_dict(),
            "scaling": self.wanted.as_dict(),
            "inboxes": [i.as_dict() for i in self.inboxes],
            "fanouts": [f.as_dict() for f in self.fanouts],
            "flags": [f.as_dict() for f in self.flags],
        }

    def totals(self) -> DatabaseTotals:
        """Its handlers added up, with its live workers."""
        return database_totals(self.rows, sum(w.live for w in self.versions.workers))


def _read_status(app: Outbox, handlers: tuple[str, ...], dead_since: float) -> _Status:
    app = ready(app, handlers)
    rows = _started(app, handlers, dead_since)
    return _Status(
        rows,
        fleet.fleet(app),
        scaling.read_scaling(app, handlers),
        inboxes.inboxes(app),
        fanout.fanouts(app, handlers=handlers),
        flags.flag_tables(app, handlers=handlers),
    )


def _print_status(status: _Status) -> None:
    """One database's status as tables and lines."""
    rows, band_rows = status.rows, metrics.bands(status.rows)
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
    _print_scaling(status.wanted)
    _print_fleet(status.versions)
    for kept in status.inboxes[:INBOXES_SHOWN]:
        click.echo(inbox_line(kept))
    if len(status.inboxes) > INBOXES_SHOWN:
        click.echo(f"{len(status.inboxes) - INBOXES_SHOWN} more inboxes (outbox inbox list)")
    for each in status.fanouts:
        click.echo(fanout_line(each))
    for flagged in status.flags:
        click.echo(flags_line(flagged))
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
