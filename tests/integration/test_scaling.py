"""Desired workers and Apdex checked against a real drain: a burst worker handles a backlog,
records what it handled, and the scaling read agrees with what happened."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select, update

from outbox import Batch, Outbox, Settings, Urgency, schema
from outbox._db import queries
from outbox._db.dialects import db_now_plus
from outbox.ops import flow
from outbox.ops.scaling import read_scaling
from outbox.prometheus import register
from outbox.results import BatchResult
from outbox.worker import Worker
from tests.models import ActivityEvent

FAST = Settings(poll_interval=0.05, rescue_interval=0.05)
BATCH = 10
HANDLER_SECONDS = 0.02
"""Each batch takes at least this long: one slot handles at most BATCH / HANDLER_SECONDS
(500) events a second."""
SECOND = Urgency("SECOND", priority=0, promise=1.0)
"""A band whose half promise one slot fills with at most 250 events."""


@pytest.fixture
def app(make_app: Callable[[str], Outbox], database_url: str) -> Outbox:
    """One handler, ``timed``, of the one-second band, in batches of 10 taking 20 ms each."""
    app = make_app(database_url)
    app.settings = FAST

    @app.handler(ActivityEvent, batch_size=BATCH, urgency=SECOND, name="timed")
    def timed(batch: Batch[ActivityEvent]) -> None:
        time.sleep(HANDLER_SECONDS)

    return app


@pytest.fixture
def registry() -> CollectorRegistry:
    """A registry of the test's own, so that tests never share metrics."""
    return CollectorRegistry()


def _drain(app: Outbox) -> list[BatchResult]:
    """Handle everything due with one burst worker of one slot; its batch results."""
    results: list[BatchResult] = []
    assert Worker(app, concurrency=1, burst=True, on_result=results.append).run()
    return results


def _date_back(app: Outbox, ids: list[int], seconds: float) -> None:
    with app.engine.begin() as conn:
        conn.execute(
            update(ActivityEvent)
            .where(ActivityEvent.id.in_(ids))
            .values(created_at=db_now_plus(-seconds))
        )


def test_a_backlog_one_slot_cannot_drain_in_time_asks_for_more(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """After a drain measured the handler (at most 500 events a second a slot), 1,000 events
    of a one-second promise ask for more than one slot: the measured rate is never above the
    real one, so the ask is never below what one slot can do in half the promise."""
    commit_events(app.engine, 50)
    _drain(app)
    commit_events(app.engine, 1000)
    found = read_scaling(app)
    (timed,) = found.handlers
    assert (True, True, 1000) == (
        found.desired_workers > 1,
        timed.rate_per_slot is not None and timed.rate_per_slot <= BATCH / HANDLER_SECONDS,
        found.runnable,
    )


def test_a_drain_records_its_slots_busy_seconds_and_the_rate_is_measured_over_them(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """50 events in 5 batches: the handler's busy seconds are the batches' durations, and a
    slot's rate is what it handled over them."""
    commit_events(app.engine, 50)
    results = _drain(app)
    with app.engine.connect() as conn:
        busy = conn.execute(
            select(func.sum(schema.throughput.c.busy_seconds)).where(
                schema.throughput.c.handler == "timed"
            )
        ).scalar_one()
    (timed,) = read_scaling(app).handlers
    assert (pytest.approx(sum(r.duration for r in results)), pytest.approx(50 / busy)) == (
        busy,
        timed.rate_per_slot,
    )


def test_a_drained_backlog_asks_for_no_worker(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Before the drain the backlog asks for a slot; after it, with no lease and nothing
    runnable, none, and the drain time is 0."""
    commit_events(app.engine, 200)
    before = read_scaling(app)
    _drain(app)
    after = read_scaling(app)
    assert ((True, 200), (0, 0, 0.0)) == (
        (before.desired_workers >= 1, before.runnable),
        (after.desired_workers, after.runnable, after.drain_seconds),
    )


def test_the_gauge_is_the_desired_workers_read(
    app: Outbox, commit_events: Callable[..., list[int]], registry: CollectorRegistry
) -> None:
    """A backlog after a measured drain: ``outbox_desired_workers`` asks for more than one slot,
    all of them for the one band, and ``outbox_worker_slots`` counts none live."""
    commit_events(app.engine, 50)
    _drain(app)
    commit_events(app.engine, 1000)
    register(app, registry)
    # One scrape for all three: each scrape reads anew, and the backlog ages between them.
    samples = {
        (s.name, s.labels.get("band")): s.value for m in registry.collect() for s in m.samples
    }
    total = samples.get(("outbox_desired_workers", None))
    band = samples.get(("outbox_band_desired_workers", "SECOND"))
    slots = samples.get(("outbox_worker_slots", None))
    assert (True, total, 0.0) == (total is not None and total > 1, band, slots)


def test_a_paused_handlers_backlog_asks_for_no_worker(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Paused, its 100 events are no demand; resumed, they are."""
    commit_events(app.engine, 100)
    flow.pause(app, "timed", actor="test")
    paused = read_scaling(app)
    flow.resume(app, "timed", actor="test")
    resumed = read_scaling(app)
    assert ((0, 0), (1, 100)) == (
        (paused.desired_workers, paused.runnable),
        (resumed.desired_workers, resumed.runnable),
    )


def test_apdex_is_what_the_drain_did(
    make_app: Callable[[str], Outbox],
    database_url: str,
    commit_events: Callable[..., list[int]],
    registry: CollectorRegistry,
) -> None:
    """Events a minute old when handled (within 4 x the 60 s promise) tolerate, 10 minutes
    old frustrate, fresh ones satisfy: the Apdex read back, in the status and in the gauge,
    is the one counted from the ages the worker's results carry."""
    app = make_app(database_url)
    app.settings = FAST
    app.handler(ActivityEvent, batch_size=BATCH, urgency=Urgency.REALTIME, name="realtime")(
        lambda batch: None
    )
    fresh = commit_events(app.engine, 30)
    tolerated = commit_events(app.engine, 20)
    frustrated = commit_events(app.engine, 10)
    _date_back(app, tolerated, 90.0)
    _date_back(app, frustrated, 600.0)
    results = _drain(app)
    ages = [age for r in results for age in r.event_ages]
    satisfied = sum(1 for age in ages if age <= 60.0)
    tolerating = sum(1 for age in ages if 60.0 < age <= 240.0)
    (band,) = read_scaling(app).bands
    register(app, registry)
    gauge = registry.get_sample_value("outbox_band_apdex", {"band": "REALTIME"})
    expected = (satisfied + tolerating / 2) / len(ages)
    assert ((60, 30, 20), expected, expected) == (
        (band.handled, band.satisfied, band.tolerating),
        band.apdex,
        gauge,
    )
    assert len(fresh) == satisfied


def test_on_postgresql_the_read_opens_no_transaction_around_its_statement(
    make_app: Callable[[str], Outbox], postgres_database: str
) -> None:
    """The read runs in autocommit: after its statement the server's session is idle, no
    BEGIN was sent and no ROLLBACK is owed (two round trips saved a read)."""
    app = make_app(postgres_database)
    app.handler(ActivityEvent, name="timed")(lambda batch: None)
    with queries.reading_connection(app.engine) as conn:
        queries.scaling_rows(
            conn,
            [("timed", app.get_handler("timed").table)],
            rate_seconds=120.0,
            apdex_seconds=3600.0,
            stale_seconds=60.0,
        )
        status = conn.connection.driver_connection.info.transaction_status  # type: ignore[union-attr]
    assert psycopg.pq.TransactionStatus.IDLE == status
