"""Per-handler options: timeout, expires_after and the delivery strategy."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy import func, select, update

from outbox import Batch, Delivery, Outbox, RetryPolicy, schema
from outbox._db import queries, run_in_transaction
from outbox._db.dialects import db_now_plus
from outbox._engine.batch_job import run_batch_job
from outbox._engine.claimer import run_once as claim_once
from outbox.testing import drain
from outbox.worker import Worker
from tests.models import ActivityEvent

NO_WAIT = RetryPolicy(max_attempts=3, scale=0.0, base_delay=0.0, jitter=0.0)


def _archive_statuses(app: Outbox) -> dict[str, int]:
    with app.engine.connect() as conn:
        rows = conn.execute(
            select(schema.archive.c.status, func.count()).group_by(schema.archive.c.status)
        )
        return {status: int(n) for status, n in rows}


def _buffered(app: Outbox) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one())


def _lease(app: Outbox, worker_id: str = "test-worker") -> queries.JobRow:
    import uuid

    (job,) = run_in_transaction(
        app.engine,
        lambda conn: queries.acquire_jobs(
            conn,
            app.dialect,
            handlers=list(app.handlers),
            worker_id=worker_id,
            token=uuid.uuid4(),
            limit=1,
            lease_seconds=60,
        ),
    )
    return job


def test_handler_over_its_timeout_fails_the_attempt(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """A handler running past its timeout fails the attempt with HandlerTimeoutError."""
    app = make_app(database_url)
    release = threading.Event()

    @app.handler(ActivityEvent, batch_size=10, timeout=0.2, retry=NO_WAIT)
    def stuck(batch: Batch[ActivityEvent]) -> None:
        release.wait(10)

    commit_events(app.engine, 3)
    claim_once(app, app.get_handler("stuck"))
    try:
        result = run_batch_job(app, app.get_handler("stuck"), _lease(app))
    finally:
        release.set()
    with app.engine.connect() as conn:
        last_error = conn.execute(select(schema.jobs.c.last_error)).scalar_one()
    assert ("retrying", True) == (result.outcome, last_error.startswith("HandlerTimeoutError"))


def test_late_result_of_a_timed_out_handler_changes_nothing(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """When the overrunning call finally returns, its group is not completed by it."""
    app = make_app(database_url)
    returned = threading.Event()
    release = threading.Event()

    @app.handler(ActivityEvent, batch_size=10, timeout=0.2, retry=NO_WAIT)
    def slow(batch: Batch[ActivityEvent]) -> None:
        if batch.attempt == 1:
            release.wait(10)
            returned.set()

    commit_events(app.engine, 3)
    claim_once(app, app.get_handler("slow"))
    run_batch_job(app, app.get_handler("slow"), _lease(app))
    release.set()
    assert returned.wait(5)
    assert (3, 1) == (_buffered(app), _count_jobs(app))


def _count_jobs(app: Outbox) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one())


def test_events_older_than_expires_after_are_archived_as_expired(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """Old events are archived as expired and never reach the handler; fresh ones are handled."""
    app = make_app(database_url)
    handled: list[int] = []

    @app.handler(ActivityEvent, batch_size=10, expires_after=3600)
    def fresh_only(batch: Batch[ActivityEvent]) -> None:
        handled.extend(e.id for e in batch.events)

    old = commit_events(app.engine, 4)
    new = commit_events(app.engine, 3)
    with app.engine.begin() as conn:
        conn.execute(
            update(ActivityEvent)
            .where(ActivityEvent.id.in_(old))
            .values(created_at=db_now_plus(-7200))
        )
    result = drain(app)
    assert (new, {"expired": 4}, 4) == (
        sorted(handled),
        _archive_statuses(app),
        result.stats.events_expired,
    )


def test_group_of_only_expired_events_never_calls_the_handler(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """A group whose events all expired finishes without a handler call."""
    app = make_app(database_url)
    calls: list[int] = []

    @app.handler(ActivityEvent, batch_size=10, expires_after=60)
    def never(batch: Batch[ActivityEvent]) -> None:
        calls.append(len(batch.events))

    ids = commit_events(app.engine, 5)
    with app.engine.begin() as conn:
        conn.execute(
            update(ActivityEvent)
            .where(ActivityEvent.id.in_(ids))
            .values(created_at=db_now_plus(-120))
        )
    drain(app)
    assert ([], {"expired": 5}, 0, 0) == (
        calls,
        _archive_statuses(app),
        _buffered(app),
        _count_jobs(app),
    )


def test_at_most_once_dead_letters_an_interrupted_group(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """An at-most-once group whose worker was lost is dead-lettered, not run a second time."""
    app = make_app(database_url)
    calls: list[int] = []

    @app.handler(ActivityEvent, batch_size=10, delivery=Delivery.AT_MOST_ONCE, retry=NO_WAIT)
    def once(batch: Batch[ActivityEvent]) -> None:
        calls.append(batch.attempt)

    commit_events(app.engine, 3)
    claim_once(app, app.get_handler("once"))
    _lease(app, worker_id="lost-worker")  # leased by a worker that then died
    with app.engine.begin() as conn:
        conn.execute(update(schema.jobs).values(lease_expires_at=db_now_plus(-1)))
    Worker(app).rescue()
    drain(app)
    assert ([], {"dead": 3}) == (calls, _archive_statuses(app))


def test_at_most_once_still_retries_a_handler_that_raised(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """A raising at-most-once handler said it delivered nothing: its group is retried."""
    app = make_app(database_url)
    calls: list[int] = []

    @app.handler(ActivityEvent, batch_size=10, delivery="at_most_once", retry=NO_WAIT)
    def flaky(batch: Batch[ActivityEvent]) -> None:
        calls.append(batch.attempt)
        if batch.attempt == 1:
            raise ConnectionError("try again")

    commit_events(app.engine, 3)
    drain(app)
    assert ([1, 2], {}, 0) == (calls, _archive_statuses(app), _buffered(app))


def test_at_most_once_dead_letters_a_timed_out_group(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """An at-most-once handler that overran may have delivered: its group is dead at once."""
    app = make_app(database_url)
    release = threading.Event()

    @app.handler(
        ActivityEvent, batch_size=10, delivery=Delivery.AT_MOST_ONCE, timeout=0.2, retry=NO_WAIT
    )
    def overrun(batch: Batch[ActivityEvent]) -> None:
        release.wait(10)

    commit_events(app.engine, 2)
    try:
        drain(app)
    finally:
        release.set()
    assert {"dead": 2} == _archive_statuses(app)
