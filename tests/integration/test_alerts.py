"""Alerts: staleness beyond a band's promise, and groups failing too often."""

from __future__ import annotations

import re
from collections.abc import Callable

from sqlalchemy import update

from outbox import Batch, Outbox, RetryPolicy, Urgency
from outbox._db.dialects import db_now_plus
from outbox._engine import distributor
from outbox.ops.metrics import bands, collect
from outbox.testing import drain
from outbox.worker import Worker
from tests.models import ActivityEvent, EmailEvent

FAIL_FOREVER = RetryPolicy(max_attempts=10, scale=0.0, base_delay=0.0, jitter=0.0)


def _age(app: Outbox, model: type[ActivityEvent] | type[EmailEvent], seconds: float) -> None:
    with app.engine.begin() as conn:
        conn.execute(update(model).values(created_at=db_now_plus(-seconds)))


def test_fresh_events_raise_no_alert(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """Events younger than their band's promise break no promise."""
    app = make_app(database_url)
    app.handler(ActivityEvent, urgency=Urgency.REALTIME, name="h")(lambda b: None)
    commit_events(app.engine, 3)
    (status,) = collect(app)
    assert [] == status.alerts


def test_event_older_than_the_promise_raises_a_staleness_alert(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """An unhandled event older than the REALTIME promise (60 s) is a broken promise."""
    app = make_app(database_url)
    app.handler(ActivityEvent, urgency=Urgency.REALTIME, name="h")(lambda b: None)
    commit_events(app.engine, 3)
    _age(app, ActivityEvent, 120)
    (status,) = collect(app)
    [alert] = status.alerts
    late = r"oldest event is 2 min( \d+ s)? old: staleness 2\.\d\d is above 1 for the REALTIME "
    assert re.fullmatch(late + "promise of 1 min", alert), alert


def test_same_age_holds_the_day_promise(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """Two minutes is late for REALTIME and well within DAY."""
    app = make_app(database_url)
    app.handler(ActivityEvent, urgency=Urgency.DAY, name="h")(lambda b: None)
    commit_events(app.engine, 3)
    _age(app, ActivityEvent, 120)
    (status,) = collect(app)
    assert [] == status.alerts


def test_interactive_band_alerts_after_two_failed_attempts(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """A REALTIME group that failed twice raises an attempts alert; one failure does not."""
    app = make_app(database_url)

    @app.handler(ActivityEvent, urgency=Urgency.REALTIME, retry=FAIL_FOREVER)
    def failing(batch: Batch[ActivityEvent]) -> None:
        raise RuntimeError("down")

    commit_events(app.engine, 2)
    worker = Worker(app, concurrency=1)
    distributor.run_once(app)
    worker.run_once()  # the claim, and attempt 1 of its group, which fails
    after_one = collect(app)[0].alerts
    worker.run_once()  # attempt 2 fails
    after_two = collect(app)[0].alerts
    assert (0, 1) == (len(after_one), len(after_two))


def test_eventual_band_tolerates_two_failed_attempts(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """A DAY group alerts only at 8 failed attempts, so two failures raise nothing."""
    app = make_app(database_url)

    @app.handler(ActivityEvent, urgency=Urgency.DAY, retry=FAIL_FOREVER)
    def failing(batch: Batch[ActivityEvent]) -> None:
        raise RuntimeError("down")

    commit_events(app.engine, 2)
    worker = Worker(app, concurrency=1)
    distributor.run_once(app)
    for _ in range(2):  # the claim with attempt 1, then attempt 2: both fail
        worker.run_once()
    assert (2, []) == (collect(app)[0].max_failed_attempts, collect(app)[0].alerts)


def test_bands_sum_up_their_handlers(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """Band status adds up unclaimed events and takes the worst staleness of its handlers."""
    app = make_app(database_url)
    app.handler(ActivityEvent, urgency=Urgency.HOUR, name="a")(lambda b: None)
    app.handler(EmailEvent, urgency=Urgency.HOUR, name="b")(lambda b: None)
    commit_events(app.engine, 3)
    commit_events(app.engine, 4, model=EmailEvent)
    _age(app, EmailEvent, 7200)
    (hour,) = bands(collect(app))
    assert ("HOUR", ["a", "b"], 7, True) == (
        hour.urgency,
        hour.handlers,
        hour.unclaimed,
        hour.staleness is not None and hour.staleness >= 2.0,
    )


def _dead_letter_everything(app: Outbox) -> None:
    def fail(batch: Batch[ActivityEvent]) -> None:
        raise RuntimeError("the downstream refused the batch")

    app.handler(ActivityEvent, urgency=Urgency.DAY, retry=RetryPolicy(max_attempts=1), name="h")(
        fail
    )


def test_a_recent_dead_letter_raises_an_alert_whatever_the_band(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """Events dead-lettered within the window alert even in the DAY band, naming how many and
    the newest error; the count is in the status."""
    app = make_app(database_url)
    _dead_letter_everything(app)
    commit_events(app.engine, 3)
    drain(app)
    (status,) = collect(app)
    (alert,) = status.alerts
    assert (3, True, True) == (
        status.recent_dead,
        alert.startswith("3 events dead-lettered in the last 1 d, the newest "),
        alert.endswith(
            "RuntimeError: the downstream refused the batch (outbox replay --status dead)"
        ),
    )


def test_no_dead_letter_alert_when_the_window_is_off(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """``dead_since=0`` (or None): dead letters, however recent, raise no alert."""
    app = make_app(database_url)
    _dead_letter_everything(app)
    commit_events(app.engine, 3)
    drain(app)
    assert ([], [], 0) == (
        collect(app, dead_since=0)[0].alerts,
        collect(app, dead_since=None)[0].alerts,
        collect(app, dead_since=0)[0].recent_dead,
    )
