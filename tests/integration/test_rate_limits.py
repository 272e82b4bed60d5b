"""Shared rate limits: a worker's threads together never call faster than the limit, in calls
and in events, and a group whose turn is far off goes back unattempted. On SQLite, PostgreSQL
and MariaDB."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import select, update

from outbox import Batch, ConfigurationError, Outbox, RateLimit, RetryAfter, RetryPolicy, schema
from outbox._db import queries
from outbox._db.dialects import db_now_plus
from outbox._engine import claimer
from outbox.ops import flow, metrics
from outbox.testing import drain
from outbox.worker import Worker
from tests.models import ActivityEvent

Commit = Callable[..., list[int]]
NO_WAIT = RetryPolicy(max_attempts=3, scale=0.0, base_delay=0.0, jitter=0.0)


def most_in_any_window(starts: list[float], weights: list[int], window: float = 1.0) -> int:
    """The largest total weight of the calls that started within any ``window`` seconds."""
    calls = sorted(zip(starts, weights, strict=True))
    most = 0
    for i, (start, _) in enumerate(calls):
        most = max(most, sum(w for t, w in calls[i:] if t < start + window))
    return most


def _recording(app: Outbox, **options: object) -> tuple[list[float], list[int]]:
    starts: list[float] = []
    sizes: list[int] = []
    lock = threading.Lock()

    @app.handler(ActivityEvent, retry=NO_WAIT, **options)  # type: ignore[arg-type]
    def limited(batch: Batch[ActivityEvent]) -> None:
        with lock:
            starts.append(time.monotonic())
            sizes.append(len(batch))

    return starts, sizes


def test_threads_together_keep_to_the_calls_limit(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """Eight threads, thirty groups, a limit of 18 calls a second: no second holds more than
    18, so the thirty take more than a second."""
    app = make_app(database_url)
    starts, _ = _recording(app, batch_size=1, rate_limit=RateLimit(calls_per_second=18))
    commit_events(app.engine, 30)
    Worker(app, concurrency=8, burst=True).run()
    assert (30, True) == (len(starts), most_in_any_window(starts, [1] * 30) <= 18)
    assert max(starts) - min(starts) > 1.0


def test_threads_together_keep_to_the_events_limit(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """Groups of ten, 90 events a second: never more than 90 events in any second."""
    app = make_app(database_url)
    starts, sizes = _recording(app, batch_size=10, rate_limit=RateLimit(events_per_second=90))
    commit_events(app.engine, 200)
    Worker(app, concurrency=8, burst=True).run()
    assert (200, True) == (sum(sizes), most_in_any_window(starts, sizes) <= 90)


def test_a_group_whose_turn_is_far_off_goes_back_unattempted(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """A turn further off than a worker waits (a third of the lease, at most 10 s): the group's
    job goes back, due when its turn comes, its attempt not counted."""
    app = make_app(database_url)
    starts, _ = _recording(app, batch_size=1, rate_limit=RateLimit(calls_per_second=0.05))
    commit_events(app.engine, 2)
    for _ in range(2):
        claimer.run_once(app, app.get_handler("limited"))
    worker = Worker(app, concurrency=2)
    worker.run_once()
    with app.engine.connect() as conn:
        now = queries.database_now(conn)
        jobs = conn.execute(select(schema.jobs)).mappings().all()
    (waiting,) = [job for job in jobs if job["lease_token"] is None]
    due_in = (waiting["run_at"] - now).total_seconds()
    assert (1, 1, 0, True) == (
        len(starts),
        worker.stats.groups_throttled,
        waiting["attempts"],
        15 < due_in <= 20.5,
    )


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"calls_per_second": 0},
        {"events_per_second": float("inf")},
        {"calls_per_second": 1, "burst": 0},
        {"events_per_second": 1, "event_burst": 1.5},
        {"calls_per_second": "10"},
        {"events_per_second": 1e-9},
        {"calls_per_second": True},
        {"calls_per_second": 1, "burst": True},
    ],
)
def test_rate_limit_refuses_bad_settings(options: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match="RateLimit"):
        RateLimit(**options)  # type: ignore[arg-type]


def test_a_rate_limit_key_gives_each_key_a_limit_of_its_own(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """Three calls a second per account, two accounts of five groups of one: no second holds
    more than three calls of one account, while the two accounts' calls go side by side."""
    app = make_app(database_url)
    starts: dict[int, list[float]] = {}
    lock = threading.Lock()

    @app.handler(
        ActivityEvent,
        batch_size=1,
        retry=NO_WAIT,
        rate_limit=RateLimit(calls_per_second=3),
        rate_limit_key="activity_id",
    )
    def per_account(batch: Batch[ActivityEvent]) -> None:
        with lock:
            starts.setdefault(batch.events[0].activity_id, []).append(time.monotonic())

    for _ in range(5):
        commit_events(app.engine, 1, activity_id=1)
        commit_events(app.engine, 1, activity_id=2)
    Worker(app, concurrency=8, burst=True).run()
    most = [most_in_any_window(starts[a], [1] * len(starts[a])) for a in (1, 2)]
    both = sorted(starts[1] + starts[2])
    assert ([5, 5], [3, 3], 6) == (
        [len(starts[1]), len(starts[2])],
        most,
        most_in_any_window(both, [1] * 10),
    )


def test_rate_limit_key_needs_a_rate_limit() -> None:
    app = Outbox("sqlite://")
    with pytest.raises(ConfigurationError, match="rate_limit_key needs a rate_limit"):
        app.handler(ActivityEvent, name="keyed", rate_limit_key="activity_id")(lambda b: None)


def test_status_says_each_handlers_limit(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    app = make_app(database_url)
    limit = RateLimit(calls_per_second=9, events_per_second=4000, event_burst=500)
    app.handler(ActivityEvent, name="limited", rate_limit=limit, rate_limit_key="activity_id")(
        lambda batch: None
    )
    (status,) = metrics.collect(app)
    assert "9 calls/s; 4000 events/s, burst 500 per activity_id" == status.rate_limit


def test_check_names_the_rate_limit_of_a_late_handler(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)
    app.handler(ActivityEvent, name="limited", rate_limit=RateLimit(calls_per_second=2))(
        lambda batch: None
    )
    commit_events(app.engine, 1)
    with app.engine.begin() as conn:
        conn.execute(update(ActivityEvent).values(created_at=db_now_plus(-7200)))
    (status,) = metrics.collect(app)
    late = [alert for alert in status.alerts if "staleness" in alert]
    assert [True] == [alert.endswith("(rate limit 2 calls/s)") for alert in late]


def _per_account_429(app: Outbox) -> list[int]:
    """A handler with a limit per account, whose downstream answers account 1 with a 429 and
    Retry-After 30; the accounts of its calls, in order."""
    calls: list[int] = []

    @app.handler(
        ActivityEvent,
        batch_size=5,
        retry=NO_WAIT,
        group_by="activity_id",
        rate_limit=RateLimit(calls_per_second=100),
        rate_limit_key="activity_id",
    )
    def per_account(batch: Batch[ActivityEvent]) -> None:
        calls.append(batch.events[0].activity_id)
        if calls[-1] == 1:
            raise RetryAfter(30, reason="429: account 1 is over its quota")

    return calls


def test_a_keys_retry_after_does_not_stop_its_worker_for_other_keys(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """The worker that saw account 1's 429 goes straight on to account 2's group: it does not
    take the Retry-After for a pause of the handler either."""
    app = make_app(database_url)
    calls = _per_account_429(app)

    for account in (1, 2):
        commit_events(app.engine, 2, activity_id=account)
    handler = app.get_handler("per_account")
    for _ in range(2):
        claimer.run_once(app, handler)
    worker = Worker(app, concurrency=1)
    ran = [worker.run_once(), worker.run_once()]
    assert ([1, 1], [1, 2]) == (ran, calls)


def test_a_keys_retry_after_holds_that_key_back_and_pauses_nothing(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """Per-key limits: account 1's group is answered 429 with Retry-After 30. That group is
    deferred, and account 1's next group goes back unattempted; account 2 goes on, and the
    handler is not paused."""
    app = make_app(database_url)
    calls = _per_account_429(app)

    for account in (1, 2):
        commit_events(app.engine, 3, activity_id=account)
    first = drain(app).stats
    for account in (1, 2):
        commit_events(app.engine, 1, activity_id=account)
    second = drain(app).stats
    with app.engine.connect() as conn:
        now = queries.database_now(conn)
        jobs = conn.execute(select(schema.jobs)).mappings().all()
    due_in = sorted((job["run_at"].replace(tzinfo=None) - now.replace(tzinfo=None)).total_seconds()
                    for job in jobs)  # fmt: skip
    assert ([1, 2, 2], 1, 1, {}) == (
        sorted(calls),
        first.groups_deferred,
        second.groups_throttled,
        flow.paused(app),
    )
    # Both wait out the Retry-After, counted from the 429 (the drains take a second or so).
    assert [True, True] == [25 < due <= 33.1 for due in due_in], due_in
