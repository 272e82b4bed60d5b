"""Prometheus exposition: database gauges at scrape time, worker counters and histograms.

Needs the ``metrics`` extra (``pip install 'sqlalchemy-outbox[metrics]'``). Two halves:

- :class:`OutboxCollector` reads :func:`outbox.ops.metrics.collect` on every scrape, so its gauges
  are the same numbers as ``outbox status``, from whichever process is scraped. A scrape that
  cannot reach the database reports ``outbox_scrape_error 1`` instead of failing.
- :class:`WorkerMetrics` counts what one process's workers did, from the
  :class:`~outbox.results.BatchResult` each batch job returns (``Worker(on_result=...)``).

Labels are kept to ``handler``, ``band`` (the urgency band's name), ``outcome``, ``inbox`` and
``state`` (of a flagged row: ``waiting`` or ``taken``): their values are bounded by the
registered handlers and the inboxes, never by events, groups, rows or message ids.
docs/metrics.md lists every name.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

try:
    import prometheus_client
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client.core import GaugeMetricFamily
except ImportError as error:  # the extra is optional; say how to get it
    raise ImportError(
        "outbox.prometheus needs prometheus-client: pip install 'sqlalchemy-outbox[metrics]'",
        name="prometheus_client",
    ) from error

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from outbox._core import log as _log
from outbox._core.in_flight import InFlight
from outbox.app import Outbox
from outbox.exceptions import OutboxError
from outbox.ops import flags, inboxes, metrics, scaling
from outbox.ops.flags import FlagStatus
from outbox.ops.inboxes import InboxStatus
from outbox.results import (
    DEAD,
    DEFERRED,
    LEASE_LOST,
    RETRYING,
    SUCCEEDED,
    THROTTLED,
    BatchResult,
)

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer
    from wsgiref.types import WSGIApplication

log = _log.get_logger(__name__)


DEFAULT_ADDRESS = "0.0.0.0"  # noqa: S104 - Prometheus scrapes from another host
EVENT_OUTCOMES = ("succeeded", "retried", "deferred", "discarded", "dead", "expired", "superseded")
"""The ``outcome`` values of ``outbox_events_total``: the :class:`BatchResult` counts."""
GROUP_OUTCOMES = (SUCCEEDED, RETRYING, DEFERRED, THROTTLED, DEAD, LEASE_LOST)
"""The ``outcome`` values of ``outbox_groups_total``: :attr:`BatchResult.outcome`."""

BATCH_SIZE_BUCKETS = (1, 5, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 50_000, 100_000)
"""Events per batch job; the largest allowed ``batch_size`` is 100,000."""
DURATION_BUCKETS_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
LATENCY_BUCKETS_SECONDS = (
    1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21_600, 86_400, 259_200, 604_800,
)  # fmt: skip
"""From seconds to the WEEK band's promise: each band's promise is a bucket boundary."""

_LABELS = ("handler", "band")
_REGISTRY = None
"""The key of the registry's reading among the databases' (whose names are never None)."""
DATABASE_TIMEOUT_SECONDS = 5.0
"""How long a scrape of an application of several databases waits for each: half of
Prometheus's default scrape timeout."""


class OutboxCollector:
    """Gauges of every handler (or the named ones), read from the database at each scrape.

    A database or configuration error during a scrape yields ``outbox_scrape_error 1`` and no
    handler gauges, and is logged once per outage; the exporter keeps serving. Each scrape runs
    the queries of ``outbox status``, which count the unclaimed rows of every buffer: on very
    large backlogs, keep the scrape interval at tens of seconds.

    Of an application serving several databases, every sample carries a ``database`` label
    (as does one of them, ``app.on(name)``): the databases are read at once, each in a thread
    of its own, and one that has not answered within ``timeout`` seconds is reported as a
    scrape error of its own while the others are reported. A database still answering an
    earlier scrape is not asked again, so a hung one holds one thread, not one per scrape.
    """

    def __init__(
        self,
        app: Outbox,
        handlers: tuple[str, ...] | list[str] = (),
        *,
        timeout: float = DATABASE_TIMEOUT_SECONDS,
    ) -> None:
        self.app = app
        self.handlers = tuple(handlers)
        self.timeout = timeout
        self._failing: set[str | None] = set()
        self._failing_lock = threading.Lock()
        self._reads = InFlight("outbox-scrape")

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The metric families without samples, so that registering does not query."""
        labels = _labels_of(self.app)
        yield from _families(labels).values()
        yield from _scaling_families(labels)
        yield from _inbox_families(labels).values()
        yield _flag_family(labels)
        yield from _scrape_families(labels)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Read the status of the handlers now and yield it as gauges."""
        labels = _labels_of(self.app)
        families = _families(labels)
        scaling_families = _scaling_families(labels)
        inbox_families = _inbox_families(labels)
        flagged = _flag_family(labels)
        failed, took = _scrape_families(labels)
        for name, read in self._read_all():
            prefix = () if name is None and not labels else (name or "",)
            failed.add_metric(prefix, float(read.error))
            took.add_metric(prefix, read.duration)
            if not read.error:
                _add_status(families, prefix, read.rows)
                _add_scaling(scaling_families, prefix, read.wanted)
                _add_inboxes(inbox_families, prefix, read.inboxes)
                _add_flags(flagged, prefix, read.flags)
        yield from families.values()
        yield from scaling_families
        yield from inbox_families.values()
        yield flagged
        yield from (failed, took)

    def _read_all(self) -> list[tuple[str | None, _Read]]:
        """Each database's read: this application's own, or, of several, all at once (the
        registry read once, in the same time bound)."""
        if not self.app.serves_many:
            return [(self.app.database_name, self._read(self.app))]
        started = time.monotonic()
        deadline = started + self.timeout
        listing = self._reads.start(_REGISTRY, self.app.each)
        wait([listing], timeout=self.timeout)
        try:
            if not listing.done():
                raise TimeoutError(f"the registry gave no answer within {self.timeout:g} s")
            views = listing.result()
        except (OutboxError, TimeoutError) as error:  # said as one error, of no database
            self._report(None, error)
            return [(None, _Read(error=True, duration=time.monotonic() - started))]
        pending = {
            name: self._reads.start(name, functools.partial(self._read, view))
            for name, view in views.items()
        }
        self._reads.forget([_REGISTRY, *views])
        wait(pending.values(), timeout=max(0.0, deadline - time.monotonic()))
        reads: list[tuple[str | None, _Read]] = []
        for name, future in pending.items():
            if future.done():
                reads.append((name, future.result()))
            else:
                # Still waiting: reported as an error now; it is not asked again until it
                # answers.
                self._report(name, TimeoutError(f"no answer within {self.timeout:g} s"))
                reads.append((name, _Read(error=True, duration=time.monotonic() - started)))
        return reads

    def _read(self, app: Outbox) -> _Read:
        started = time.monotonic()
        try:
            rows = metrics.collect(app, self.handlers)
            wanted = scaling.read_scaling(app, self.handlers)
            # Counted up to a cap: an inbox of millions of ids costs a scrape a bounded read.
            kept = inboxes.inboxes(app)
            # Counted up to a cap too; a flag handler whose tables cannot be read has no
            # series (its reading says why: outbox flags list), the others have theirs.
            flagged = flags.flag_tables(app, handlers=self.handlers)
        except (SQLAlchemyError, OutboxError) as error:
            self._report(app.database_name, error)
            return _Read(error=True, duration=time.monotonic() - started)
        self._report(app.database_name, None)
        return _Read(False, time.monotonic() - started, rows, wanted, kept, flagged)

    def _report(self, database: str | None, error: Exception | None) -> None:
        """Log a failure once per outage of a database, not once per scrape, and its end;
        the message is the driver's first line only."""
        with self._failing_lock:
            known = database in self._failing
            if error is None:
                self._failing.discard(database)
            else:
                self._failing.add(database)
        named = {} if database is None else {"database": database}
        if error is None:
            if known:
                log.info(_log.SCRAPE_RECOVERED, **named)
            return
        if not known:
            reason = error.orig if isinstance(error, DBAPIError) and error.orig else error
            log.warning(
                _log.SCRAPE_FAILED,
                error_type=type(error).__name__,
                error=(str(reason).strip().splitlines() or [""])[0][:500],
                **named,
            )


@dataclass(frozen=True, slots=True)
class _Read:
    """One database's answer to a scrape."""

    error: bool
    duration: float
    rows: list[metrics.HandlerStatus] = field(default_factory=list)
    wanted: scaling.Scaling | None = None
    inboxes: list[InboxStatus] = field(default_factory=list)
    flags: list[FlagStatus] = field(default_factory=list)


def _labels_of(app: Outbox) -> tuple[str, ...]:
    """The labels before a sample's own: ``database`` for an application of several (or one
    of them), none for an application of one."""
    return ("database",) if app.serves_many or app.database_name is not None else ()


def _add_status(
    families: dict[str, GaugeMetricFamily],
    prefix: tuple[str, ...],
    rows: list[metrics.HandlerStatus],
) -> None:
    for row in rows:
        labels = (*prefix, row.handler, row.urgency)
        values: dict[str, float] = {
            "outbox_unclaimed_events": row.unclaimed,
            "outbox_claimed_events": row.claimed,
            "outbox_oldest_event_age_seconds": row.oldest_age or 0.0,
            "outbox_staleness_ratio": row.staleness or 0.0,
            "outbox_groups_waiting": row.groups_waiting,
            "outbox_groups_in_flight": row.groups_in_flight,
            "outbox_groups_retrying": row.groups_retrying,
            "outbox_groups_refused": row.groups_refused,
            "outbox_max_failed_attempts": row.max_failed_attempts,
            "outbox_dead_events": row.dead,
            "outbox_alerts": len(row.alerts),
            "outbox_paused": int(row.paused),
            "outbox_breaker_probing": int(row.breaker == "probing"),
            "outbox_consecutive_failures": row.consecutive_failures,
            "outbox_held_keys": len(row.held_keys),
        }
        for name, value in values.items():
            families[name].add_metric(labels, value)


def _families(prefix: tuple[str, ...]) -> dict[str, GaugeMetricFamily]:
    """The handler gauges, empty, by name; ``prefix``: the labels before their own."""
    documentation = {
        "outbox_unclaimed_events": "Events written and not yet claimed.",
        "outbox_claimed_events": "Events in groups waiting, running or retrying.",
        "outbox_oldest_event_age_seconds": (
            "Age of the oldest event still in the buffer, by the database clock (0 when empty)."
        ),
        "outbox_staleness_ratio": (
            "Oldest event age divided by the band's promise; above 1 the handler is behind."
        ),
        "outbox_groups_waiting": "Batch jobs waiting for a worker, never attempted.",
        "outbox_groups_in_flight": "Batch jobs leased by a worker now.",
        "outbox_groups_retrying": "Batch jobs that failed at least once and wait for a retry.",
        "outbox_groups_refused": (
            "Groups whose finishing write the database refused, held until an operator "
            "releases them."
        ),
        "outbox_max_failed_attempts": (
            "The most failed attempts of any group waiting to be retried (0: none)."
        ),
        "outbox_dead_events": "Dead-lettered events in the archive.",
        "outbox_alerts": "Promises broken now, as `outbox check` counts them (0: all hold).",
        "outbox_paused": (
            "1 while the handler is paused (by an operator, a Retry-After or its circuit "
            "breaker): no worker runs its groups."
        ),
        "outbox_breaker_probing": (
            "1 while the handler's circuit breaker probes: one group at a time, fleet-wide."
        ),
        "outbox_consecutive_failures": (
            "Groups failed in a row, as the circuit breaker counts them (0 after a success)."
        ),
        "outbox_held_keys": (
            "Ordering keys dead groups hold back: their later events wait (outbox held)."
        ),
    }
    return {
        name: GaugeMetricFamily(name, text, labels=(*prefix, *_LABELS))
        for name, text in documentation.items()
    }


def _scaling_families(prefix: tuple[str, ...]) -> list[GaugeMetricFamily]:
    """The fleet's desired size, per band and in total, the drain time and Apdex
    (:mod:`outbox.ops.scaling`), empty; ``prefix``: the labels before their own."""
    band = (*prefix, "band")
    return [
        GaugeMetricFamily(
            "outbox_desired_workers",
            "Worker slots (concurrency units) that keep every promise: what an autoscaler follows.",
            labels=prefix,
        ),
        GaugeMetricFamily(
            "outbox_worker_slots",
            "Slots of the live workers now (the sum of their concurrency).",
            labels=prefix,
        ),
        GaugeMetricFamily(
            "outbox_drain_seconds",
            "Seconds the live workers take to drain every runnable event at the measured rates.",
            labels=prefix,
        ),
        GaugeMetricFamily(
            "outbox_band_desired_workers", "Worker slots that keep the band's promise.", labels=band
        ),
        GaugeMetricFamily(
            "outbox_band_drain_seconds",
            "Seconds the live workers take to drain the band and every more urgent one.",
            labels=band,
        ),
        GaugeMetricFamily(
            "outbox_band_apdex",
            "Share of the band's events handled within its promise, tolerating up to four times "
            "it at half weight, over the Apdex window (an hour).",
            labels=band,
        ),
    ]


def _add_scaling(
    families: list[GaugeMetricFamily], prefix: tuple[str, ...], wanted: scaling.Scaling | None
) -> None:
    """Add ``wanted`` to the families of :func:`_scaling_families`. A value not known (no rate
    measured, nothing handled in the window) has no sample rather than a made-up one."""
    if wanted is None:
        return
    desired, slots, drain, band_desired, band_drain, band_apdex = families
    desired.add_metric(prefix, wanted.desired_workers)
    slots.add_metric(prefix, wanted.fleet_slots)
    if wanted.drain_seconds is not None:
        drain.add_metric(prefix, wanted.drain_seconds)
    for band in wanted.bands:
        labels = (*prefix, band.urgency)
        band_desired.add_metric(labels, band.desired_workers)
        if band.drain_seconds is not None:
            band_drain.add_metric(labels, band.drain_seconds)
        if band.apdex is not None:
            band_apdex.add_metric(labels, band.apdex)


def _inbox_families(prefix: tuple[str, ...]) -> dict[str, GaugeMetricFamily]:
    """The inbox gauges (:mod:`outbox.ops.inboxes`), empty, by name; ``prefix``: the labels
    before their own."""
    cap = f"{inboxes.COUNT_CAP:,}"
    documentation = {
        "outbox_inbox_ids": (
            f"Message ids the inbox keeps, counted up to {cap} (at the cap: at least that many)."
        ),
        "outbox_inbox_oldest_seconds": (
            "Seconds since the oldest id the inbox keeps was received (0 when it keeps none)."
        ),
        "outbox_inbox_expired_ids": (
            f"Ids past the inbox's horizon that no prune deleted yet, counted up to {cap}."
        ),
        "outbox_inbox_horizon_seconds": (
            "Seconds the inbox keeps an id (only for an inbox this application declares)."
        ),
    }
    return {
        name: GaugeMetricFamily(name, text, labels=(*prefix, "inbox"))
        for name, text in documentation.items()
    }


def _add_inboxes(
    families: dict[str, GaugeMetricFamily],
    prefix: tuple[str, ...],
    kept: list[InboxStatus],
) -> None:
    for inbox in kept:
        labels = (*prefix, inbox.name)
        families["outbox_inbox_ids"].add_metric(labels, inbox.ids)
        families["outbox_inbox_oldest_seconds"].add_metric(labels, inbox.oldest_age or 0.0)
        families["outbox_inbox_expired_ids"].add_metric(labels, inbox.expired)
        if inbox.horizon is not None:
            families["outbox_inbox_horizon_seconds"].add_metric(labels, inbox.horizon)


def _flag_family(prefix: tuple[str, ...]) -> GaugeMetricFamily:
    """``outbox_flagged_rows`` (:mod:`outbox.ops.flags`), empty; ``prefix``: the labels
    before its own."""
    return GaugeMetricFamily(
        "outbox_flagged_rows",
        "Rows flagged on a flag handler's business table: waiting (not taken into its buffer "
        "yet) or taken (their key in the buffer); counted up to "
        f"{flags.COUNT_CAP:,} flagged rows (at the cap: at least that many).",
        labels=(*prefix, "handler", "state"),
    )


def _add_flags(family: GaugeMetricFamily, prefix: tuple[str, ...], read: list[FlagStatus]) -> None:
    for status in read:
        if status.waiting is not None and status.taken is not None:
            family.add_metric((*prefix, status.handler, "waiting"), status.waiting)
            family.add_metric((*prefix, status.handler, "taken"), status.taken)


def _scrape_families(prefix: tuple[str, ...]) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    """``outbox_scrape_error`` and ``outbox_scrape_duration_seconds``, empty."""
    failed = GaugeMetricFamily(
        "outbox_scrape_error",
        "1 when the last scrape could not read the database, else 0.",
        labels=prefix,
    )
    took = GaugeMetricFamily(
        "outbox_scrape_duration_seconds",
        "Seconds the last scrape spent reading the database.",
        labels=prefix,
    )
    return failed, took


class WorkerMetrics:
    """Counters and histograms of the batch jobs this process ran; thread-safe.

    ``registry``: where the instruments are registered (default: prometheus_client's
    ``REGISTRY``). ``database``: the name every series is labelled with (``database``), for
    the worker of one of several databases. Feed it with :meth:`observe`, or pass
    :meth:`callback` as a worker's ``on_result``.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, database: str | None = None
    ) -> None:
        registry = REGISTRY if registry is None else registry
        self._database = () if database is None else (database,)
        labels = ("database", *_LABELS) if database is not None else _LABELS
        self.events = Counter(
            "outbox_events_total",
            "Events finished by batch jobs, by outcome: succeeded, retried, deferred, "
            "discarded, dead, expired, superseded.",
            (*labels, "outcome"),
            registry=registry,
        )
        self.groups = Counter(
            "outbox_groups_total",
            "Batch jobs finished, by outcome: succeeded, retrying, deferred, throttled, dead, "
            "lease_lost, refused.",
            (*labels, "outcome"),
            registry=registry,
        )
        self.batch_size = Histogram(
            "outbox_batch_size",
            "Events in each batch job that loaded its group (expired events included).",
            labels,
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            "outbox_handler_duration_seconds",
            "Wall time of each batch job: loading the group, the handler call and completion.",
            (*labels, "outcome"),
            buckets=DURATION_BUCKETS_SECONDS,
            registry=registry,
        )
        self.latency = Histogram(
            "outbox_end_to_end_latency_seconds",
            "Seconds from an event's creation to the end of its succeeded batch, per event.",
            labels,
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=registry,
        )

    def observe(self, result: BatchResult, band: str) -> None:
        """Count one batch job's result; ``band`` is its handler's urgency band name."""
        series = (*self._database, result.handler, band)
        self.groups.labels(*series, result.outcome).inc()
        for outcome in EVENT_OUTCOMES:
            count: int = getattr(result, outcome)
            if count:
                self.events.labels(*series, outcome).inc(count)
        if result.size:
            self.batch_size.labels(*series).observe(result.size)
        self.duration.labels(*series, result.outcome).observe(result.duration)
        if result.event_ages and result.outcome == SUCCEEDED:
            latency = self.latency.labels(*series)
            for age in result.event_ages:
                latency.observe(age)

    def callback(self, app: Outbox) -> Callable[[BatchResult], None]:
        """A ``Worker(on_result=...)`` callback that observes each result under its band.

        Starts the counters of ``app``'s handlers at zero, so that ``rate()`` and
        ``increase()`` see the first events rather than a series appearing at 1.
        """
        for h in app.handlers.values():
            series = (*self._database, h.name, h.urgency.name)
            for outcome in EVENT_OUTCOMES:
                self.events.labels(*series, outcome)
            for outcome in GROUP_OUTCOMES:
                self.groups.labels(*series, outcome)

        def on_result(result: BatchResult) -> None:
            self.observe(result, app.get_handler(result.handler).urgency.name)

        return on_result


def register(
    app: Outbox,
    registry: CollectorRegistry | None = None,
    *,
    handlers: tuple[str, ...] | list[str] = (),
) -> OutboxCollector:
    """Register the database gauges of ``app`` (default registry: ``REGISTRY``); returns them.

    For an application that already serves ``/metrics``: register once at start-up and its
    existing exposition (``prometheus_client.make_wsgi_app`` / ``make_asgi_app``) includes them.
    Registering twice into one registry raises ``ValueError`` (duplicated time series).
    """
    collector = OutboxCollector(app, handlers)
    (REGISTRY if registry is None else registry).register(collector)
    return collector


def make_wsgi_app(app: Outbox, registry: CollectorRegistry | None = None) -> WSGIApplication:
    """Register ``app``'s gauges into ``registry`` and return a WSGI app serving it all."""
    registry = REGISTRY if registry is None else registry
    register(app, registry)
    wsgi_app: WSGIApplication = prometheus_client.make_wsgi_app(registry)
    return wsgi_app


def start_http_server(
    app: Outbox,
    port: int,
    *,
    addr: str = DEFAULT_ADDRESS,
    registry: CollectorRegistry | None = None,
) -> tuple[WSGIServer, threading.Thread]:
    """Register ``app``'s gauges and serve ``registry`` on ``addr:port`` from a daemon thread.

    What ``outbox work --metrics-port`` runs. Port 0 picks a free port (``server.server_port``
    says which). Stop it with ``server.shutdown(); server.server_close()``.
    """
    registry = REGISTRY if registry is None else registry
    register(app, registry)
    return prometheus_client.start_http_server(port, addr=addr, registry=registry)


def fleet_registry(app: Outbox, directory: str) -> CollectorRegistry:
    """A registry of ``app``'s gauges, every database's, and of the counters and histograms
    the worker processes wrote to ``directory`` (prometheus-client's multiprocess mode:
    ``PROMETHEUS_MULTIPROC_DIR``), summed across processes, those that exited included.

    What ``outbox work --metrics-port`` serves for an application of several databases, from
    one port: the worker processes come and go with the registry, the port stays.
    """
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    register(app, registry)
    return registry
