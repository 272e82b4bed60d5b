"""Prometheus exposition: database gauges at scrape time, worker counters, the HTTP endpoint."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import update

from outbox import Batch, Outbox, RetryPolicy, Settings, Urgency
from outbox._db.dialects import db_now_plus
from outbox.ops.metrics import collect
from outbox.prometheus import WorkerMetrics, register, start_http_server
from outbox.results import BatchResult
from outbox.worker import Worker
from tests.models import ActivityEvent

FAST = Settings(poll_interval=0.05, rescue_interval=0.05)
ONE_SHOT = RetryPolicy(max_attempts=1)
UNREACHABLE_URL = "postgresql+psycopg://postgres@127.0.0.1:1/x"
LABELS = {"handler": "noop", "band": "MINUTES"}
AGE_TOLERANCE_SECONDS = 5.0


@pytest.fixture
def registry() -> CollectorRegistry:
    """A registry of the test's own, so that tests never share metrics."""
    return CollectorRegistry()


@pytest.fixture
def app(make_app: Callable[[str], Outbox], database_url: str) -> Outbox:
    """An application with one MINUTES handler, ``noop``, in batches of 10."""
    app = make_app(database_url)
    app.settings = FAST
    app.handler(ActivityEvent, batch_size=10, urgency=Urgency.MINUTES, name="noop")(
        lambda batch: None
    )
    return app


def _age_events(app: Outbox, seconds: float) -> None:
    with app.engine.begin() as conn:
        conn.execute(update(ActivityEvent).values(created_at=db_now_plus(-seconds)))


def _burst(app: Outbox, metrics: WorkerMetrics) -> list[BatchResult]:
    """Handle everything due now with a worker whose results feed ``metrics``; the results."""
    results: list[BatchResult] = []
    observe = metrics.callback(app)

    def on_result(result: BatchResult) -> None:
        results.append(result)
        observe(result)

    assert Worker(app, concurrency=1, burst=True, on_result=on_result).run()
    return results


def test_collector_reports_unclaimed_events(
    app: Outbox, registry: CollectorRegistry, commit_events: Callable[..., list[int]]
) -> None:
    """outbox_unclaimed_events is the unclaimed count of metrics.collect."""
    commit_events(app.engine, 25)
    register(app, registry)
    (status,) = collect(app)
    assert status.unclaimed == registry.get_sample_value("outbox_unclaimed_events", LABELS)


def test_collector_reports_the_oldest_event_age(
    app: Outbox, registry: CollectorRegistry, commit_events: Callable[..., list[int]]
) -> None:
    """outbox_oldest_event_age_seconds is the oldest age of metrics.collect, read at scrape."""
    commit_events(app.engine, 3)
    _age_events(app, 120)
    register(app, registry)
    (status,) = collect(app)
    actual = registry.get_sample_value("outbox_oldest_event_age_seconds", LABELS)
    assert status.oldest_age == pytest.approx(actual, abs=AGE_TOLERANCE_SECONDS)


def test_collector_reports_staleness(
    app: Outbox, registry: CollectorRegistry, commit_events: Callable[..., list[int]]
) -> None:
    """outbox_staleness_ratio is the staleness of metrics.collect: age over the band's promise."""
    commit_events(app.engine, 3)
    _age_events(app, 600)
    register(app, registry)
    (status,) = collect(app)
    actual = registry.get_sample_value("outbox_staleness_ratio", LABELS)
    assert status.staleness == pytest.approx(actual, abs=AGE_TOLERANCE_SECONDS / 300)


def test_collector_reports_an_empty_buffer_as_age_zero(
    app: Outbox, registry: CollectorRegistry
) -> None:
    """With nothing in the buffer, the oldest age is 0 rather than a missing series."""
    register(app, registry)
    assert 0.0 == registry.get_sample_value("outbox_oldest_event_age_seconds", LABELS)


def test_collector_reports_dead_events(
    make_app: Callable[[str], Outbox],
    database_url: str,
    registry: CollectorRegistry,
    commit_events: Callable[..., list[int]],
) -> None:
    """outbox_dead_events counts the dead letters in the archive."""
    app = make_app(database_url)
    app.settings = FAST

    @app.handler(ActivityEvent, urgency=Urgency.MINUTES, retry=ONE_SHOT, name="noop")
    def refuse(batch: Batch[ActivityEvent]) -> None:
        raise RuntimeError("downstream refused the batch")

    commit_events(app.engine, 4)
    _burst(app, WorkerMetrics(registry))
    register(app, registry)
    assert 4.0 == registry.get_sample_value("outbox_dead_events", LABELS)


def test_successful_scrape_reports_no_error(app: Outbox, registry: CollectorRegistry) -> None:
    """A scrape that read the database sets outbox_scrape_error to 0."""
    register(app, registry)
    assert 0.0 == registry.get_sample_value("outbox_scrape_error")


def test_scrape_during_an_outage_reports_an_error(
    make_app: Callable[[str], Outbox], registry: CollectorRegistry
) -> None:
    """A scrape that cannot reach the database yields outbox_scrape_error 1 and does not raise."""
    app = make_app(UNREACHABLE_URL)
    app.handler(ActivityEvent, urgency=Urgency.MINUTES, name="noop")(lambda batch: None)
    register(app, registry)
    assert 1.0 == registry.get_sample_value("outbox_scrape_error")


def test_events_counter_moves_after_the_worker_handles_events(
    app: Outbox, registry: CollectorRegistry, commit_events: Callable[..., list[int]]
) -> None:
    """outbox_events_total{outcome="succeeded"} counts every event a worker handled."""
    commit_events(app.engine, 25)
    _burst(app, WorkerMetrics(registry))
    labels = {**LABELS, "outcome": "succeeded"}
    assert 25.0 == registry.get_sample_value("outbox_events_total", labels)


def test_groups_counter_matches_the_batch_size_histogram(
    app: Outbox, registry: CollectorRegistry, commit_events: Callable[..., list[int]]
) -> None:
    """Every succeeded group is one observation of outbox_batch_size, summing to the events."""
    commit_events(app.engine, 25)
    _burst(app, WorkerMetrics(registry))
    groups = registry.get_sample_value("outbox_groups_total", {**LABELS, "outcome": "succeeded"})
    sizes = (
        registry.get_sample_value("outbox_batch_size_count", LABELS),
        registry.get_sample_value("outbox_batch_size_sum", LABELS),
    )
    assert (groups, 25.0) == sizes


def test_dead_groups_are_counted(
    make_app: Callable[[str], Outbox],
    database_url: str,
    registry: CollectorRegistry,
    commit_events: Callable[..., list[int]],
) -> None:
    """A group that fails its only attempt counts as a dead group and its events as dead."""
    app = make_app(database_url)
    app.settings = FAST

    @app.handler(ActivityEvent, urgency=Urgency.MINUTES, retry=ONE_SHOT, name="noop")
    def refuse(batch: Batch[ActivityEvent]) -> None:
        raise RuntimeError("downstream refused the batch")

    commit_events(app.engine, 4)
    _burst(app, WorkerMetrics(registry))
    actual = (
        registry.get_sample_value("outbox_groups_total", {**LABELS, "outcome": "dead"}),
        registry.get_sample_value("outbox_events_total", {**LABELS, "outcome": "dead"}),
    )
    assert (1.0, 4.0) == actual


def test_handler_duration_is_observed_per_group(
    app: Outbox, registry: CollectorRegistry, commit_events: Callable[..., list[int]]
) -> None:
    """outbox_handler_duration_seconds has one observation per finished group."""
    commit_events(app.engine, 25)
    results = _burst(app, WorkerMetrics(registry))
    labels = {**LABELS, "outcome": "succeeded"}
    actual = registry.get_sample_value("outbox_handler_duration_seconds_count", labels)
    assert float(len(results)) == actual


def test_end_to_end_latency_is_observed_per_handled_event(
    app: Outbox, registry: CollectorRegistry, commit_events: Callable[..., list[int]]
) -> None:
    """outbox_end_to_end_latency_seconds has one observation per event handled."""
    commit_events(app.engine, 25)
    _burst(app, WorkerMetrics(registry))
    assert 25.0 == registry.get_sample_value("outbox_end_to_end_latency_seconds_count", LABELS)


@pytest.fixture
def served(app: Outbox, registry: CollectorRegistry) -> Iterator[str]:
    """The URL of the metrics endpoint of ``app``, on a free port; stopped after the test."""
    WorkerMetrics(registry)
    server, thread = start_http_server(app, 0, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_http_server_serves_every_metric_name(
    served: str, commit_events: Callable[..., list[int]], app: Outbox
) -> None:
    """The endpoint serves the text exposition with every documented metric name."""
    commit_events(app.engine, 3)
    body = httpx.get(served, timeout=10).text
    names = [
        "outbox_unclaimed_events",
        "outbox_claimed_events",
        "outbox_oldest_event_age_seconds",
        "outbox_staleness_ratio",
        "outbox_groups_waiting",
        "outbox_groups_in_flight",
        "outbox_groups_retrying",
        "outbox_groups_refused",
        "outbox_max_failed_attempts",
        "outbox_dead_events",
        "outbox_alerts",
        "outbox_paused",
        "outbox_breaker_probing",
        "outbox_consecutive_failures",
        "outbox_held_keys",
        "outbox_inbox_ids",
        "outbox_inbox_oldest_seconds",
        "outbox_inbox_expired_ids",
        "outbox_inbox_horizon_seconds",
        "outbox_scrape_error",
        "outbox_scrape_duration_seconds",
        "outbox_events_total",
        "outbox_groups_total",
        "outbox_batch_size",
        "outbox_handler_duration_seconds",
        "outbox_end_to_end_latency_seconds",
    ]
    assert [] == [name for name in names if f"# TYPE {name}" not in body]


def test_http_server_serves_text_exposition(served: str) -> None:
    """The endpoint answers with the Prometheus text format."""
    response = httpx.get(served, timeout=10)
    assert (200, "text/plain") == (
        response.status_code,
        response.headers["content-type"].split(";")[0],
    )
