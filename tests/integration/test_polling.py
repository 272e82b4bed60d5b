"""Coordinated polling: the fleet polls at one global rate, whatever its size."""

from __future__ import annotations

import random
from collections.abc import Callable

from outbox import Outbox
from outbox._db import queries
from outbox.worker import Worker
from tests.models import ActivityEvent


def _app(url: str, make_app: Callable[[str], Outbox]) -> Outbox:
    app = make_app(url)
    app.with_settings(poll_interval=2.0)
    app.handler(ActivityEvent, name="noop")(lambda batch: None)
    return app


def test_heartbeat_learns_the_fleet_size(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """After a heartbeat, a worker knows how many workers are alive, itself included."""
    app = _app(database_url, make_app)
    with app.engine.begin() as conn:
        for n in range(3):
            queries.insert_worker(conn, f"other-{n}", "host", n, 1)
    worker = Worker(app)
    with app.engine.begin() as conn:
        queries.insert_worker(conn, worker.id, "host", 99, 1)
    worker._heartbeat()
    assert 4 == worker.live_workers


def test_idle_wait_grows_with_the_fleet(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Each of N workers waits N poll intervals (±50%): the fleet polls once per interval."""
    app = _app(database_url, make_app)
    worker = Worker(app)
    worker.live_workers = 10
    random.seed(3)
    waits = [worker._poll_timeout() for _ in range(200)]
    assert (True, True) == (min(waits) >= 10.0, max(waits) <= 30.0)


def test_a_distribution_interval_set_on_a_worker_is_the_one_its_maintenance_keeps(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """``worker.distribute_every`` set after the worker is made is what its maintenance loop
    distributes by: one value, not a copy taken when the worker was made."""
    worker = Worker(_app(database_url, make_app), distribute_every=5.0)
    worker.distribute_every = None
    assert (None, None) == (worker.distribute_every, worker._maintenance.distribute_every)
