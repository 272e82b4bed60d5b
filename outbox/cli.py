"""The ``outbox`` command: the only place that configures logging and handles signals.

Exit codes: 0 ok; 1 runtime failure (including tables not migrated, a handler's buffer table
missing, and a worker that had to abandon in-flight work); 2 usage error (bad ``--app``,
unknown handler, bad option); 3 database unreachable or unusable.
"""

from __future__ import annotations

import gc
import importlib
import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, ModuleType
from typing import Any, NoReturn

import click
import structlog
from click.core import ParameterSource
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, OperationalError

from outbox import _db, archive, distributor, metrics, prefork, schema
from outbox._cli_options import GRACE_PERIOD, INTERVAL, LEASE, MAX_PRUNE_AGE_SECONDS, Duration
from outbox._dialects import error_summary
from outbox.app import DATABASE_URL_ENV, MAX_BATCH_SIZE, Outbox
from outbox.exceptions import (
    BufferTableMissingError,
    ConfigurationError,
    DatabaseUnavailableError,
    OutboxError,
    SchemaMissingError,
)
from outbox.worker import (
    CLAIMS_IN_FLIGHT_PER_HANDLER,
    DEFAULT_CONCURRENCY,
    DEFAULT_SHUTDOWN_GRACE_PERIOD_SECONDS,
    MAX_CONCURRENCY,
    Worker,
)

APP_ENV = "OUTBOX_APP"
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
MAX_PORT = 65535
# How long `outbox distribute` rides out a database restart before it gives up (exit 1).
DISTRIBUTE_PATIENCE_SECONDS = 30.0


class Context:
    """What the group options give every command.

    ``app_source`` and ``url_source`` name where ``--app`` and ``--database-url`` came from
    (the option, or its environment variable), for error messages.
    """

    def __init__(
        self,
        app_spec: str | None,
        database_url: str | None,
        *,
        app_source: str = "--app",
        url_source: str = "--database-url",
    ) -> None:
        self.app_spec = app_spec
        self.database_url = database_url
        self.app_source = app_source
        self.url_source = url_source
        self._app: Outbox | None = None
        self._driver_loaded = False

    def app(self) -> Outbox:
        """The application named by ``--app`` / ``OUTBOX_APP``, on ``--database-url`` if given.

        Its database URL is parsed and its driver imported (nothing is connected to), so that
        a bad URL is a ConfigurationError naming where the URL came from.
        """
        app = self._loaded_app()
        if not self._driver_loaded:
            url = self._url_if_any()
            if url is not None:  # with none, the command says so when it opens the engine
                _load_driver(url, self._url_source())
            self._driver_loaded = True
        return app

    def url(self) -> URL:
        """The database URL the commands would use, parsed; its driver need not be installed."""
        url = self._url_if_any()
        if url is None:
            return self._loaded_app().url  # raises: no URL anywhere, and says where to give one
        return url

    def _url_if_any(self) -> URL | None:
        """The database URL, parsed; None when neither the options nor the application give one."""
        if self.database_url:
            return _parse_url(self.database_url, self.url_source)
        try:
            return self._loaded_app().url
        except ConfigurationError:
            return None
        except (ArgumentError, ValueError) as error:
            # Outbox parses its own URL; the text is not at hand here, and not shown.
            what = (
                "its port is not a number"
                if isinstance(error, ValueError)
                else f"a database URL looks like {_db.URL_FORM}"
            )
            raise ConfigurationError(f"{self._url_source()}: cannot parse it: {what}") from None

    def bare_app(self) -> Outbox:
        """The application if one is named, else an Outbox on the database URL alone."""
        if self.app_spec:
            return self.app()
        if self._app is None:
            url = self.database_url or os.environ.get(DATABASE_URL_ENV)
            if not url:
                raise click.UsageError(
                    f"no database: pass --database-url, set {DATABASE_URL_ENV}, or name an "
                    f"application with --app / {APP_ENV}"
                )
            source = self.url_source if self.database_url else DATABASE_URL_ENV
            _load_driver(_parse_url(url, source), source)
            self._app = Outbox(url)
        return self._app

    def _loaded_app(self) -> Outbox:
        """The application, imported once and pointed at ``--database-url`` if given (parsed
        by :meth:`app` and :meth:`url`, which name its source when it is malformed)."""
        if self._app is None:
            if not self.app_spec:
                raise click.UsageError(
                    f"no application: pass --app module:attribute or set {APP_ENV}"
                )
            app = load_app(self.app_spec, source=self.app_source)
            if self.database_url:
                app.use_database(self.database_url)
            settle_heap()
            self._app = app
        return self._app

    def _url_source(self) -> str:
        if self.database_url:
            return self.url_source
        return f"the database URL of {self.app_source} {self.app_spec}"


def _parse_url(url: str, source: str) -> URL:
    """Parse a database URL; a ConfigurationError naming ``source`` (never the password)."""
    # A ConfigurationError (exit 2, one line) rather than a click.UsageError: the command line
    # is well formed, and its synopsis would not help.
    try:
        return _db.parse_url(url)
    except ConfigurationError as error:
        raise ConfigurationError(f"{source}: {error}") from error


def _load_driver(url: URL, source: str) -> None:
    """Import the dialect and driver outbox will use for the URL (for an async driver's URL,
    its sync sibling's); a ConfigurationError naming ``source`` if missing."""
    try:
        _db.load_driver(_db.sync_url(url))
    except ConfigurationError as error:
        raise ConfigurationError(f"{source}: {error}") from error


# Collect cyclic garbage after this many new container objects instead of Python's 700: a worker
# builds a row object per event, so the default ran a collection about twice per 1,000-event
# batch.
GC_THRESHOLD = 10_000


def settle_heap() -> None:
    """Tune the garbage collector of an ``outbox`` process once the application is loaded.

    What the imports built (SQLAlchemy, the application's models: some 70,000 objects) stays
    for the process's life, so it is frozen out of the collector's sight: full collections
    during a drain and the collection at exit no longer walk it (exiting took 0.1 s more
    without it). Only the ``outbox`` command does this; a ``Worker`` embedded in an
    application leaves the application's collector alone.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD)


def load_app(spec: str, *, source: str = "--app") -> Outbox:
    """Import ``module:attribute`` (the current directory is importable) and check it.

    ``source`` names where the spec came from (``--app`` or ``OUTBOX_APP``) in errors.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.UsageError(f"{source} must look like module:attribute, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise click.UsageError(
            f"{source} {spec}: cannot import {module_name!r}: {error}"
        ) from error
    except SystemExit as error:
        # A module that exits when imported (a script's `sys.exit()` outside its main guard)
        # would otherwise end the command silently with its own exit code.
        raise click.UsageError(
            f"{source} {spec}: importing {module_name!r} exited (SystemExit {error.code!r})"
        ) from error
    except Exception as error:
        raise click.UsageError(
            f"{source} {spec}: importing {module_name!r} raised {type(error).__name__}: {error} "
            f"(run `python -c 'import {module_name}'` for the traceback)"
        ) from error
    try:
        app = getattr(module, attribute)
    except AttributeError:
        found = sorted(n for n, v in vars(module).items() if isinstance(v, Outbox))
        hint = f"; Outbox objects in it: {', '.join(found)}" if found else ""
        raise click.UsageError(
            f"{source} {spec}: module {module_name!r} has no attribute {attribute!r}{hint}"
        ) from None
    if not isinstance(app, Outbox):
        raise click.UsageError(
            f"{source} {spec}: expected an outbox.Outbox instance (app = Outbox(...)), "
            f"found {_what_is(app)}"
        )
    return app


def _what_is(value: object) -> str:
    """A value in plain words: ``the class myapp.Base``, ``the module json``, ``an int``."""
    if isinstance(value, type):
        return f"the class {value.__module__}.{value.__qualname__}"
    if isinstance(value, ModuleType):
        return f"the module {value.__name__}"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"the function {value.__qualname__}"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name} ({value!r:.60})"


def configure_logging(level: str, fmt: str) -> None:
    """Readable lines on a terminal, JSON lines otherwise; to stderr, filtered by level."""
    renderer: Any
    if fmt == "json" or (fmt == "auto" and not sys.stderr.isatty()):
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        # One write per line (print() writes the line and its newline apart): the workers of
        # `outbox work --processes N` share stderr, and a line must not land inside another.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


@contextmanager
def _errors() -> Iterator[None]:
    """Map outbox's errors to messages and exit codes."""
    try:
        yield
    except ConfigurationError as error:
        _fail(str(error), EXIT_USAGE)
    except DatabaseUnavailableError as error:
        _fail(str(error), EXIT_UNREACHABLE)
    except SchemaMissingError as error:
        _fail(str(error), EXIT_FAILURE)
    except BufferTableMissingError as error:
        _fail(str(error), EXIT_FAILURE)
    except OutboxError as error:
        _fail(str(error), EXIT_FAILURE)
    except OperationalError as error:
        _fail(f"database error: {error_summary(error)}", EXIT_FAILURE)


def _ready(app: Outbox, handlers: tuple[str, ...] | None = None) -> Outbox:
    """Connect and check the tables, so that problems surface as one clear message.

    ``handlers``: also check the buffer tables of these handlers (all when empty).
    """
    _db.check_schema(app.engine)
    if handlers is not None:
        _check_buffers(app, handlers)
    return app


def _check_buffers(app: Outbox, handlers: tuple[str, ...]) -> None:
    """Refuse to run when a buffer table of the handlers (all when none) does not exist: a
    deploy that has not created it. The message names the handlers that could run alone."""
    selected = app.select_handlers(handlers)
    try:
        _db.check_buffer_tables(app.engine, {h.name: h.table for h in selected})
    except BufferTableMissingError as error:
        others = [h.name for h in selected if h.name not in error.missing]
        message = str(error)
        if others:
            message += "; " + " ".join(f"--handler {name}" for name in others)
            message += " selects the others"
        _fail(message, EXIT_FAILURE)


def _command(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command inside the error mapping, with the shared Context."""

    @click.pass_obj
    def wrapper(ctx: Context, *args: Any, **kwargs: Any) -> Any:
        with _errors():
            return func(ctx, *args, **kwargs)

    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


@click.group()
@click.option(
    "--app",
    "app_spec",
    envvar=APP_ENV,
    metavar="MODULE:ATTR",
    help=f"The Outbox application object (or {APP_ENV}).",
)
@click.option(
    "--database-url",
    envvar=DATABASE_URL_ENV,
    metavar="URL",
    help=f"Database URL, overriding the application's (or {DATABASE_URL_ENV}).",
)
@click.option(
    "--log-level",
    envvar="OUTBOX_LOG_LEVEL",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
)
@click.option(
    "--log-format",
    envvar="OUTBOX_LOG_FORMAT",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "console", "json"]),
    help="auto: readable on a terminal, JSON lines otherwise.",
)
@click.version_option(package_name="sqlalchemy-outbox")
@click.pass_context
def main(
    click_ctx: click.Context,
    app_spec: str | None,
    database_url: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """outbox: buffer tables drained in bulk by batch handlers."""
    configure_logging(log_level, log_format)

    def source(name: str, option: str, envvar: str) -> str:
        from_env = click_ctx.get_parameter_source(name) is ParameterSource.ENVIRONMENT
        return envvar if from_env else option

    click_ctx.obj = Context(
        app_spec,
        database_url,
        app_source=source("app_spec", "--app", APP_ENV),
        url_source=source("database_url", "--database-url", DATABASE_URL_ENV),
    )


@main.command()
@_command
def migrate(ctx: Context) -> None:
    """Create or upgrade outbox's own tables (idempotent)."""
    from outbox.migrate import upgrade

    app = ctx.bare_app()
    _db.check_connection(app.engine)
    before, after = upgrade(app.engine)
    where = _db.describe(app.engine.url)
    if before == after:
        click.echo(f"outbox tables are up to date (revision {after}) in {where}")
    else:
        click.echo(f"outbox tables migrated from {before or 'nothing'} to {after} in {where}")


@main.group("schema")
def schema_group() -> None:
    """Inspect outbox's own schema."""


@schema_group.command("sql")
@click.option(
    "--dialect",
    type=click.Choice(["postgresql", "sqlite", "mysql"]),
    default=None,
    help="Dialect of the DDL; default: that of the database URL, else postgresql.",
)
@_command
def schema_sql(ctx: Context, dialect: str | None) -> None:
    """Print the DDL of outbox's tables, for teams that manage schema by hand."""
    from sqlalchemy.schema import CreateIndex, CreateTable

    from outbox import _dialects

    if dialect is None:
        # Only the URL's kind matters: DDL needs no driver and no connection.
        url = ctx.database_url or os.environ.get(DATABASE_URL_ENV)
        backend = (
            _parse_url(url, ctx.url_source if ctx.database_url else DATABASE_URL_ENV)
            if url
            else ctx.url()
            if ctx.app_spec
            else None
        )
        dialect = "postgresql" if backend is None else backend.get_backend_name()
    target = _dialects.dialect_named(dialect)
    if target is None:
        raise click.UsageError(
            f"outbox has no schema for {dialect!r}; use --dialect postgresql, sqlite or mysql"
        )
    for table in schema.metadata.sorted_tables:
        click.echo(str(CreateTable(table).compile(dialect=target)).strip() + ";\n")
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            click.echo(str(CreateIndex(index).compile(dialect=target)).strip() + ";")
        click.echo()


@main.command()
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@_command
def distribute(ctx: Context, handlers: tuple[str, ...]) -> None:
    """Enqueue the claim jobs each handler needs (safe from cron, safe to overlap)."""
    app = _ready(ctx.app(), handlers)
    for result in distributor.run_once(app, handlers, patience=DISTRIBUTE_PATIENCE_SECONDS):
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
    type=click.IntRange(1, prefork.MAX_PROCESSES),
    help="Worker processes forked after one start-up, each with --concurrency threads (POSIX).",
)
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@click.option("--burst", is_flag=True, help="Handle everything due now, then exit.")
@click.option(
    "--distribute-every",
    type=INTERVAL,
    default=None,
    metavar="SECONDS",
    help=f"Also distribute every SECONDS (one leader across all workers; {INTERVAL.allowed}).",
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
    "worker i serves PORT + i.",
)
@click.option(
    "--listen/--no-listen",
    envvar="OUTBOX_LISTEN",
    default=None,
    help="PostgreSQL: wake on notifications (default on; off behind a transaction pooler).",
)
@_command
def work(
    ctx: Context,
    concurrency: int,
    processes: int,
    handlers: tuple[str, ...],
    burst: bool,
    distribute_every: float | None,
    shutdown_grace_period: float,
    lease: float | None,
    poll_interval: float | None,
    metrics_port: int | None,
    listen: bool | None,
) -> None:
    """Run claim and batch jobs until stopped (SIGTERM/SIGINT: graceful; twice: at once)."""
    if processes > 1 and not hasattr(os, "fork"):
        raise click.BadParameter("needs fork(), missing here", param_hint="--processes")
    if metrics_port is not None and not 0 < metrics_port <= MAX_PORT - processes + 1:
        raise click.BadParameter(
            f"ports {metrics_port}..{metrics_port + processes - 1} are not all in 1..{MAX_PORT}",
            param_hint="--metrics-port",
        )
    app = ctx.app()
    # Checked here, before any fork: an error is then printed once, not once per process.
    app.select_handlers(handlers)
    if metrics_port is not None:
        _require_prometheus()
    changes = {"lease_seconds": lease, "poll_interval": poll_interval, "listen": listen}
    app.with_settings(**{k: v for k, v in changes.items() if v is not None})
    _ready(app, handlers)

    def run_worker(index: int, signals: tuple[signal.Signals, ...]) -> None:
        worker = Worker(
            app,
            concurrency=concurrency,
            handlers=handlers,
            burst=burst,
            distribute_every=distribute_every,
            shutdown_grace_period=shutdown_grace_period,
            on_result=None if metrics_port is None else _serve_metrics(app, metrics_port + index),
            claims_in_flight=max(1, CLAIMS_IN_FLIGHT_PER_HANDLER // processes),
        )
        with _stop_on_signals(worker, signals):
            clean = worker.run()
        _report_stopped(worker, clean)
        if worker.missing_tables:
            # The others' work is done; the handlers whose tables went missing could not run.
            raise BufferTableMissingError(worker.missing_tables)

    if processes == 1:
        run_worker(0, (signal.SIGTERM, signal.SIGINT))
        return
    # The workers open connections of their own: none may be shared across the fork.
    app.engine.dispose()

    def run_forked(index: int) -> int:
        # In a forked worker, click's own handling of usage errors is not on the stack.
        try:
            with _errors():
                run_worker(index, (signal.SIGTERM,))
        except click.ClickException as error:
            error.show()
            return error.exit_code
        return EXIT_OK

    code = prefork.run_processes(processes, run_forked, restart=not burst, usage_error=EXIT_USAGE)
    if code != EXIT_OK:
        sys.exit(code)


def _report_stopped(worker: Worker, clean: bool) -> None:
    """Print the worker's summary line; leave at once if work was abandoned."""
    stats = worker.stats
    click.echo(
        f"worker {worker.id} stopped: {stats.groups_succeeded} groups succeeded, "
        f"{stats.groups_retried} retried, {stats.groups_dead} dead, "
        f"{stats.events_succeeded} events handled"
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
    return prometheus.WorkerMetrics().callback(app)


@contextmanager
def _stop_on_signals(worker: Worker, signals: tuple[signal.Signals, ...]) -> Iterator[None]:
    """First of ``signals``: stop gracefully. Second: abandon in-flight work at once."""
    received = 0

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal received
        received += 1
        if received == 1:
            worker.stop()
        else:
            worker.abort()

    previous = {s: signal.signal(s, handle) for s in signals}
    # A forked worker starts with them blocked (see prefork), so that none is lost before now.
    prefork.unblock_stop_signals()
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@main.group("notify")
def notify_group() -> None:
    """PostgreSQL notify triggers on buffer tables: instant wake-ups for idle workers."""


@notify_group.command("install")
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@_command
def notify_install(ctx: Context, handlers: tuple[str, ...]) -> None:
    """Create (or replace) the notify trigger of each buffer; idempotent."""
    from outbox import notify

    app = ctx.app()
    _db.check_connection(app.engine)
    _check_buffers(app, handlers)
    for table in notify.install(app, handlers):
        click.echo(f"notify trigger installed on {table}")


@notify_group.command("remove")
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@_command
def notify_remove(ctx: Context, handlers: tuple[str, ...]) -> None:
    """Drop the notify trigger of each buffer (workers fall back to polling)."""
    from outbox import notify

    app = ctx.app()
    _db.check_connection(app.engine)
    _check_buffers(app, handlers)
    for table in notify.remove(app, handlers):
        click.echo(f"notify trigger removed from {table}")


@notify_group.command("sql")
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@_command
def notify_sql(ctx: Context, handlers: tuple[str, ...]) -> None:
    """Print the trigger DDL, for an application's own migrations."""
    from outbox import notify

    for statement in notify.ddl(ctx.app(), handlers):
        click.echo(statement + ";")


@main.command()
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@click.option("--dry-run", is_flag=True, help="Say what would be rebuilt; change nothing.")
@_command
def reindex(ctx: Context, handlers: tuple[str, ...], dry_run: bool) -> None:
    """Rebuild bloated buffer indexes after a backlog drained (PostgreSQL; safe from cron)."""
    from outbox.reindex import reindex as reindex_buffers

    app = _ready(ctx.app(), handlers)
    reports = reindex_buffers(app, handlers, dry_run=dry_run)
    _table(
        ("table", "index", "size", "rows need", "action", "size after"),
        [
            (r.table, r.index, _bytes(r.bytes), _bytes(r.needed_bytes), r.action,
             "" if r.bytes_after is None else _bytes(r.bytes_after))
            for r in reports
        ],
    )  # fmt: skip


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@_command
def status(ctx: Context, as_json: bool, handlers: tuple[str, ...]) -> None:
    """Per handler: backlog, oldest event age, staleness, groups by state, dead letters."""
    app = _ready(ctx.app(), handlers)
    rows = metrics.collect(app, handlers)
    band_rows = metrics.bands(rows)
    if as_json:
        document = {
            "handlers": [r.as_dict() for r in rows],
            "bands": [b.as_dict() for b in band_rows],
        }
        click.echo(json.dumps(document, indent=2))
        return
    _table(
        ("handler", "urgency", "unclaimed", "oldest", "staleness",
         "waiting", "in flight", "retrying", "refused", "failed", "dead", "alerts"),
        [
            (r.handler, r.urgency, str(r.unclaimed), _age(r.oldest_age), _ratio(r.staleness),
             str(r.groups_waiting), str(r.groups_in_flight), str(r.groups_retrying),
             str(r.groups_refused), str(r.max_failed_attempts), str(r.dead), str(len(r.alerts)))
            for r in rows
        ],
    )  # fmt: skip
    click.echo()
    _table(
        ("band", "promise", "handlers", "unclaimed", "oldest", "staleness", "failed", "dead"),
        [
            (b.urgency, _age(b.promise), str(len(b.handlers)), str(b.unclaimed),
             _age(b.oldest_age), _ratio(b.staleness), str(b.max_failed_attempts), str(b.dead))
            for b in band_rows
        ],
    )  # fmt: skip
    for r in rows:
        for alert in r.alerts:
            click.echo(f"alert: {r.handler} ({r.urgency}): {alert}")


@main.command()
@click.option("--handler", "handlers", multiple=True, help="Only this handler (repeatable).")
@_command
def check(ctx: Context, handlers: tuple[str, ...]) -> None:
    """Exit 1 when a handler breaks its band's promise (for cron, probes, monitoring)."""
    app = _ready(ctx.app(), handlers)
    broken = [(r, alert) for r in metrics.collect(app, handlers) for alert in r.alerts]
    for r, alert in broken:
        click.echo(f"{r.handler} ({r.urgency}): {alert}")
    if broken:
        sys.exit(EXIT_FAILURE)
    click.echo("all promises hold")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _bytes(size: int) -> str:
    value, unit = float(size), "B"
    for larger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


@main.command()
@click.option("--handler", default=None, help="Only events of this handler.")
@click.option(
    "--status",
    "status_",
    type=click.Choice(list(schema.ArchiveStatus)),
    default=None,
    help="Only events archived with this status.",
)
@click.option("--group", "group_id", type=click.UUID, default=None, help="Only this group.")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed, change nothing.")
@_command
def replay(
    ctx: Context,
    handler: str | None,
    status_: str | None,
    group_id: uuid.UUID | None,
    dry_run: bool,
) -> None:
    """Put archived events back into their buffers to be handled again."""
    app = _ready(ctx.app(), () if handler is None else (handler,))
    result = archive.replay(
        app, handler=handler, status=status_, group_id=group_id, dry_run=dry_run
    )
    verb = "would replay" if dry_run else "replayed"
    detail = ", ".join(f"{h}: {n}" for h, n in sorted(result.by_handler.items()))
    click.echo(f"{verb} {result.events} events" + (f" ({detail})" if detail else ""))


@main.group("refused")
def refused_group() -> None:
    """Groups whose outcome the database refused to record: held until released."""


@refused_group.command("list")
@click.option("--handler", default=None, help="Only groups of this handler.")
@_command
def refused_list(ctx: Context, handler: str | None) -> None:
    """Each held group: handler, group id, attempts, and the database's error."""
    from outbox import refused

    app = _ready(ctx.app())
    held = refused.groups(app, handler)
    _table(
        ("handler", "group", "attempts", "error"),
        [(g.handler, str(g.group_id), str(g.attempts), (g.error or "")[:200]) for g in held],
    )
    click.echo(f"{len(held)} refused group{'s' * (len(held) != 1)}")


@refused_group.command("release")
@click.option("--handler", default=None, help="Only groups of this handler.")
@click.option("--group", "group_id", type=click.UUID, default=None, help="Only this group.")
@_command
def refused_release(ctx: Context, handler: str | None, group_id: uuid.UUID | None) -> None:
    """Give held groups back to the workers, to be handled again (fix the cause first)."""
    from outbox import refused

    app = _ready(ctx.app())
    count = refused.release(app, handler, group_id)
    click.echo(f"released {count} refused group{'s' * (count != 1)}")


@main.command()
@click.option(
    "--older-than",
    required=True,
    type=Duration(MAX_PRUNE_AGE_SECONDS),
    metavar="DURATION",
    help="Delete archive rows archived longer ago than this (90s, 15m, 12h, 30d, 2w).",
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
@_command
def prune(ctx: Context, older_than: float, chunk: int) -> None:
    """Delete old archive rows in bounded batches."""
    app = _ready(ctx.bare_app())
    click.echo(f"pruned {archive.prune(app, older_than=older_than, chunk=chunk)} archive rows")


@main.command()
@click.option("--events", default=5000, show_default=True, type=int, help="Events to write.")
@click.option(
    "--database-url",
    "demo_url",
    default=None,
    metavar="URL",
    help="Run on this database instead of a fresh SQLite file.",
)
@click.pass_context
@_command
def demo(ctx: Context, click_ctx: click.Context, events: int, demo_url: str | None) -> None:
    """Write events through simulated transactions and drain them, on SQLite by default."""
    from outbox.demo import run_demo

    group = click_ctx.parent
    if group is not None and group.get_parameter_source("log_level") is ParameterSource.DEFAULT:
        # The demo talks through its own summary; per-batch log lines would drown it.
        configure_logging("error", group.params["log_format"])
    if events < 1:
        raise click.BadParameter("must be >= 1", param_hint="--events")
    if demo_url is not None:
        _load_driver(_parse_url(demo_url, "--database-url"), "--database-url")
    run_demo(events=events, database_url=demo_url)
