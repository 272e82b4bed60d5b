"""``outbox distribute`` and ``outbox work``: the claim jobs and the workers that run them."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import click

from outbox.app import Outbox
from outbox.cli._context import Context
from outbox.cli._errors import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    command,
    exits_on_errors,
    fail,
    named_database,
    ready,
)
from outbox.cli._main import main
from outbox.cli._options import GRACE_PERIOD, INTERVAL, LEASE, MAX_INTERVAL_SECONDS, Seconds
from outbox.cli._signals import MAX_PROCESSES, stop_on_signals, supervise, unblock_stop_signals
from outbox.exceptions import BufferTableMissingError, SchemaIncompatibleError
from outbox.ops import buffer_clock, database, flow
from outbox.worker import (
    CLAIMS_IN_FLIGHT_PER_HANDLER,
    DEFAULT_CONCURRENCY,
    DEFAULT_DISTRIBUTE_EVERY_SECONDS,
    DEFAULT_SHUTDOWN_GRACE_PERIOD_SECONDS,
    MAX_CONCURRENCY,
    Worker,
)

MAX_PORT = 65535
# How a forked worker that stopped because the schema is one it may not work on tells its
# parent not to start another in its place (the command itself then exits 1).
_EXIT_SCHEMA_INCOMPATIBLE = 4
# How often `outbox work` reads again a registry of databases that is a function.
REGISTRY_SECONDS = 30.0
REGISTRY_EVERY = Seconds(0.5, MAX_INTERVAL_SECONDS)
# The unit of the process serving the metrics of several databases' workers.
_METRICS_UNIT: tuple[str | None, int] = (None, -1)
_MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
# How long `outbox distribute` rides out a database restart before it gives up (exit 1).
DISTRIBUTE_PATIENCE_SECONDS = 30.0


@main.command()
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@command
def distribute(ctx: Context, handlers: tuple[str, ...]) -> None:
    """Enqueue the claim jobs each handler needs (safe from cron, safe to overlap); then a
    pass of the archive's retention."""
    app = ready(ctx.app(), handlers)
    for result in flow.distribute(app, handlers, patience=DISTRIBUTE_PATIENCE_SECONDS):
        click.echo(result.summary())


@main.command()
@click.option(
    "--concurrency",
    "-c",
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    type=click.IntRange(1, MAX_CONCURRENCY),
    help="Jobs run at once, in threads.",
)
@click.option(
    "--processes",
    "-p",
    default=1,
    show_default=True,
    type=click.IntRange(1, MAX_PROCESSES),
    help="Worker processes forked after one start-up, each with --concurrency threads (POSIX).",
)
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@click.option(
    "--burst",
    is_flag=True,
    help=(
        "Handle everything due now (and what rate limits give back for a turn soon), then exit "
        "(1 if any group was held as refused)."
    ),
)
@click.option(
    "--distribute-every",
    type=INTERVAL,
    default=None,
    metavar="SECONDS",
    help=f"Distribute every SECONDS (the fleet's leader only; default "
    f"{DEFAULT_DISTRIBUTE_EVERY_SECONDS:g}; {INTERVAL.allowed}).",
)
@click.option(
    "--no-distribute",
    is_flag=True,
    help="Leave distribution to `outbox distribute` from cron.",
)
@click.option(
    "--registry-every",
    type=REGISTRY_EVERY,
    default=REGISTRY_SECONDS,
    show_default=True,
    metavar="SECONDS",
    help="Of an application whose databases a function lists: how often to read it again, "
    "starting workers for new databases and stopping those of removed ones "
    f"({REGISTRY_EVERY.allowed}).",
)
@click.option(
    "--shutdown-grace-period",
    type=GRACE_PERIOD,
    default=DEFAULT_SHUTDOWN_GRACE_PERIOD_SECONDS,
    show_default=True,
    metavar="SECONDS",
    help="On SIGTERM/SIGINT, how long in-flight batches may take to finish "
    f"({GRACE_PERIOD.allowed}).",
)
@click.option(
    "--lease",
    type=LEASE,
    default=None,
    metavar="SECONDS",
    help=f"Job lease length ({LEASE.allowed}).",
)
@click.option(
    "--poll-interval",
    type=INTERVAL,
    default=None,
    metavar="SECONDS",
    help=f"How long an idle worker waits before looking for work ({INTERVAL.allowed}).",
)
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    envvar="OUTBOX_METRICS_PORT",
    metavar="PORT",
    help="Serve Prometheus metrics on PORT (needs the metrics extra); with --processes N, "
    "worker i serves PORT + i; of several databases, PORT serves them all.",
)
@click.option(
    "--listen/--no-listen",
    envvar="OUTBOX_LISTEN",
    default=None,
    help="PostgreSQL: wake on notifications (default on; off behind a transaction pooler).",
)
@command
def work(
    ctx: Context,
    concurrency: int,
    processes: int,
    handlers: tuple[str, ...],
    burst: bool,
    distribute_every: float | None,
    no_distribute: bool,
    registry_every: float,
    shutdown_grace_period: float,
    lease: float | None,
    poll_interval: float | None,
    metrics_port: int | None,
    listen: bool | None,
) -> None:
    """Run claim and batch jobs until stopped (SIGTERM/SIGINT: graceful; twice: at once).

    The fleet's leader also distributes, every second unless told otherwise.
    """
    if no_distribute and distribute_every is not None:
        raise click.BadParameter(
            "cannot be given with --distribute-every", param_hint="--no-distribute"
        )
    every = None if no_distribute else (distribute_every or DEFAULT_DISTRIBUTE_EVERY_SECONDS)
    if processes > 1 and not hasattr(os, "fork"):
        raise click.BadParameter("needs fork(), missing here", param_hint="--processes")
    apps = ctx.each_database()
    # Of several databases, the supervisor serves one port for all (its workers come and go
    # with the registry); of one, each worker process serves its own.
    fleet_metrics = metrics_port is not None and ctx.database_name is None and ctx.app().serves_many
    ports = 1 if fleet_metrics else processes
    if metrics_port is not None and not 0 < metrics_port <= MAX_PORT - ports + 1:
        raise click.BadParameter(
            f"ports {metrics_port}..{metrics_port + ports - 1} are not all in 1..{MAX_PORT}",
            param_hint="--metrics-port",
        )
    # Checked here, before any fork: an error is then printed once, not once per process.
    apps[0].select_handlers(handlers)
    metrics_directory = _multiprocess_directory() if fleet_metrics else None
    if metrics_port is not None:
        _require_prometheus()
    changes = {"lease_seconds": lease, "poll_interval": poll_interval, "listen": listen}
    for app in apps:
        with named_database(app):
            app.with_settings(**{k: v for k, v in changes.items() if v is not None})
            ready(app, handlers)
            database.check_generation(app.engine)
            if processes > 1 or len(apps) > 1:
                # Refused once here rather than by every forked worker, each restarted in
                # turn; the workers log the warnings themselves.
                buffer_clock.enforce(
                    app, [h.table for h in app.select_handlers(handlers)], warn=False
                )
    # A unit is a worker process: a database (None: the one) and its number there. Each
    # database has --processes workers of its own: a backlog on one cannot take another's
    # threads, and one that goes away stalls only its own.
    units = [(app.database_name, k) for app in apps for k in range(processes)]
    dynamic = ctx.database_name is None and ctx.app().databases_change
    if (len(units) > 1 or dynamic) and not hasattr(os, "fork"):
        raise click.BadParameter("a worker process per database needs fork(), missing here")

    def run_worker(unit: tuple[str | None, int], signals: tuple[signal.Signals, ...]) -> None:
        app = ctx.database(unit[0])
        if unit[0] is not None and unit not in units:
            # A database the registry listed since the command started: checked here.
            with named_database(app):
                ready(app, handlers)
                database.check_generation(app.engine)
        if metrics_directory is not None:
            on_result = _count_for_fleet(app)
        elif metrics_port is not None:
            on_result = _serve_metrics(app, metrics_port + unit[1])
        else:
            on_result = None
        worker = Worker(
            app,
            concurrency=concurrency,
            handlers=handlers,
            burst=burst,
            distribute_every=every,
            shutdown_grace_period=shutdown_grace_period,
            on_result=on_result,
            claims_in_flight=max(1, CLAIMS_IN_FLIGHT_PER_HANDLER // processes),
        )
        with stop_on_signals(worker, signals):
            clean = worker.run()
        _report_stopped(worker, clean)
        if worker.schema_incompatible is not None:
            # Stopped on its own: a restart would find the same schema.
            raise worker.schema_incompatible
        if burst and worker.stats.groups_refused:
            # Held groups wait for an operator: a burst run (a cron job, a CI step) that left
            # some must not look like one that handled everything.
            fail(
                f"{worker.stats.groups_refused} groups held as refused: their outcome could not "
                "be recorded (outbox refused list)",
                EXIT_FAILURE,
            )
        if worker.missing_tables:
            # The others' work is done; the handlers whose tables went missing could not run.
            raise BufferTableMissingError(worker.missing_tables)

    if len(units) == 1 and not (dynamic and not burst) and metrics_directory is None:
        run_worker(units[0], (signal.SIGTERM, signal.SIGINT))
        return
    # The workers open connections of their own: none may be shared across the fork.
    for app in apps:
        app.engine.dispose()

    def run_forked(unit: tuple[str | None, int]) -> int:
        # In a forked worker, click's own handling of usage errors is not on the stack.
        try:
            with exits_on_errors():
                try:
                    if unit == _METRICS_UNIT and metrics_port and metrics_directory:
                        _serve_fleet_metrics(ctx.app(), metrics_port, metrics_directory)
                    else:
                        run_worker(unit, (signal.SIGTERM,))
                except SchemaIncompatibleError as error:
                    click.echo(f"Error: {error}", err=True)
                    return _EXIT_SCHEMA_INCOMPATIBLE
        except click.ClickException as error:
            error.show()
            return error.exit_code
        return EXIT_OK

    def plan() -> list[tuple[str | None, int]]:
        workers = [(app.database_name, k) for app in ctx.each_database() for k in range(processes)]
        return [*workers, _METRICS_UNIT] if metrics_directory is not None else workers

    code = supervise(
        plan,
        run_forked,
        restart=not burst,
        usage_error=EXIT_USAGE,
        final=_EXIT_SCHEMA_INCOMPATIBLE,
        # A registry that is a function is read again while the workers run (not in burst
        # mode, whose workers end once their database is drained).
        replan_every=registry_every if dynamic and not burst else None,
        serving=_METRICS_UNIT if metrics_directory is not None else None,
    )
    if code != EXIT_OK:
        sys.exit(code)


def _report_stopped(worker: Worker, clean: bool) -> None:
    """Print the worker's summary line; leave at once if work was abandoned."""
    stats = worker.stats
    click.echo(
        f"worker {worker.id} stopped: {stats.groups_succeeded} groups succeeded, "
        f"{stats.groups_retried} retried, {stats.groups_dead} dead, "
        f"{stats.events_succeeded} events handled"
        + (f", {stats.groups_deferred} deferred" if stats.groups_deferred else "")
        + (f", {stats.groups_refused} groups refused" if stats.groups_refused else "")
    )
    if not clean:
        # Abandoned handler threads must not hold the process open: their leases will expire
        # and another worker will take their groups.
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(EXIT_FAILURE)


def _require_prometheus() -> None:
    """A usage error saying how to install the metrics extra, if it is missing."""
    try:
        from outbox import prometheus  # noqa: F401 - imported to see that it can be
    except ImportError as error:
        raise click.UsageError(str(error)) from error


def _serve_metrics(app: Outbox, port: int) -> Callable[[Any], None]:
    """Start the Prometheus endpoint; returns the worker's result callback that feeds it."""
    _require_prometheus()
    from outbox import prometheus

    try:
        prometheus.start_http_server(app, port)
    except OSError as error:
        raise click.BadParameter(f"port {port}: {error}", param_hint="--metrics-port") from error
    return prometheus.WorkerMetrics(database=app.database_name).callback(app)


def _multiprocess_directory() -> str:
    """Where the worker processes of several databases write their counters for the one port
    (prometheus-client's multiprocess mode). It must be chosen before prometheus-client is
    imported: the application may have imported it already."""
    given = os.environ.get(_MULTIPROCESS_ENV)
    if given:
        if not os.path.isdir(given):
            fail(f"{_MULTIPROCESS_ENV}={given}: not a directory", EXIT_USAGE)
        return given
    if "prometheus_client" in sys.modules:
        fail(
            "--metrics-port: the application imported prometheus_client before outbox could "
            f"choose where its worker processes count: set {_MULTIPROCESS_ENV} to an empty "
            "directory",
            EXIT_USAGE,
        )
    directory = tempfile.mkdtemp(prefix="outbox-metrics-")
    # Removed when the command exits, whichever way; the forked processes leave with
    # os._exit, which runs no exit handler.
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    os.environ[_MULTIPROCESS_ENV] = directory
    return directory


def _count_for_fleet(app: Outbox) -> Callable[[Any], None]:
    """The worker's result callback: counters in the multiprocess directory, which the
    supervisor's metrics process serves."""
    from prometheus_client import CollectorRegistry

    from outbox import prometheus

    # A registry of its own: the values live in the directory, served by another process.
    counters = prometheus.WorkerMetrics(CollectorRegistry(), database=app.database_name)
    return counters.callback(app)


def _serve_fleet_metrics(app: Outbox, port: int, directory: str) -> None:
    """The metrics process of several databases: serve every database's gauges and every
    worker process's counters on ``port`` until SIGTERM."""
    import prometheus_client

    from outbox import prometheus

    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.set())
    unblock_stop_signals()
    try:
        registry = prometheus.fleet_registry(app, directory)
        server, _ = prometheus_client.start_http_server(
            port, addr=prometheus.DEFAULT_ADDRESS, registry=registry
        )
    except OSError as error:
        raise click.BadParameter(f"port {port}: {error}", param_hint="--metrics-port") from error
    stopped.wait()
    server.shutdown()
