"""The distributor: enqueues the claim jobs each handler needs, and no more."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Connection, event, select

from outbox import Batch, Outbox, schema
from outbox._engine import distributor
from outbox._engine.distributor import Distribution
from tests.models import ActivityEvent, EmailEvent


def noop(batch: Batch[Any]) -> None:
    """Accept every event."""


def claim_jobs(app: Outbox, handler: str = "noop") -> list[int]:
    """The slots of the handler's claim jobs, in order."""
    with app.engine.connect() as conn:
        rows = conn.execute(
            select(schema.jobs.c.slot)
            .where(schema.jobs.c.handler == handler, schema.jobs.c.kind == "claim")
            .order_by(schema.jobs.c.slot)
        )
        return list(rows.scalars())


@pytest.fixture
def app(make_app: Callable[[str], Outbox], database_url: str) -> Outbox:
    """An application with one handler of batch_size 10 and max_batches 5."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=10, max_batches=5)(noop)
    return app


@pytest.mark.parametrize(("events", "expected"), [(1, 1), (10, 1), (11, 2), (30, 3)])
def test_enqueues_one_claim_job_per_started_batch(
    app: Outbox, commit_events: Callable[..., list[int]], events: int, expected: int
) -> None:
    """ceil(unclaimed / batch_size) claim jobs are enqueued."""
    commit_events(app.engine, events)
    (result,) = distributor.run_once(app)
    assert (expected, expected) == (result.enqueued, len(claim_jobs(app)))


def test_empty_buffer_enqueues_nothing(app: Outbox) -> None:
    """No unclaimed rows, no claim jobs."""
    assert [Distribution("noop", 0, False, 0, 0)] == distributor.run_once(app)


def test_pending_claim_jobs_are_subtracted(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Claim jobs already pending count toward what is needed."""
    commit_events(app.engine, 15)
    distributor.run_once(app)
    commit_events(app.engine, 20)
    (result,) = distributor.run_once(app)
    assert (2, 2, [0, 1, 2, 3]) == (result.pending, result.enqueued, claim_jobs(app))


def test_enqueued_jobs_are_capped_by_max_batches(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """However large the backlog, at most max_batches claim jobs are pending."""
    commit_events(app.engine, 200)
    (result,) = distributor.run_once(app)
    assert (5, [0, 1, 2, 3, 4]) == (result.enqueued, claim_jobs(app))


def test_count_stops_at_the_cap(app: Outbox, commit_events: Callable[..., list[int]]) -> None:
    """The unclaimed count is capped at batch_size * max_batches and says so."""
    commit_events(app.engine, 200)
    (result,) = distributor.run_once(app)
    assert (50, True) == (result.unclaimed, result.capped)


def test_running_twice_does_not_double(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A second run with nothing new enqueues nothing."""
    commit_events(app.engine, 25)
    distributor.run_once(app)
    (second,) = distributor.run_once(app)
    assert (0, [0, 1, 2]) == (second.enqueued, claim_jobs(app))


def test_claimed_rows_are_not_counted(app: Outbox, commit_events: Callable[..., list[int]]) -> None:
    """Rows already stamped with a group need no claim job."""
    from outbox._engine import claimer

    commit_events(app.engine, 10)
    claimer.run_once(app, app.get_handler("noop"))
    assert [Distribution("noop", 0, False, 0, 0)] == distributor.run_once(app)


def test_claim_jobs_carry_the_handler_priority(
    make_app: Callable[[str], Outbox],
    database_url: str,
    commit_events: Callable[..., list[int]],
) -> None:
    """A claim job is enqueued at its handler's urgency priority, due now."""
    from outbox import Urgency

    app = make_app(database_url)
    app.handler(ActivityEvent, urgency=Urgency.REALTIME)(noop)
    commit_events(app.engine, 1)
    distributor.run_once(app)
    with app.engine.connect() as conn:
        row = conn.execute(select(schema.jobs)).one()
    assert ("claim", "noop", 0, 0, None) == (
        row.kind,
        row.handler,
        row.priority,
        row.attempts,
        row.lease_token,
    )


def test_each_handler_is_distributed_separately(
    make_app: Callable[[str], Outbox],
    database_url: str,
    commit_events: Callable[..., list[int]],
) -> None:
    """Each handler gets the claim jobs of its own buffer."""
    app = make_app(database_url)
    app.handler(ActivityEvent, name="activities", batch_size=10)(noop)
    app.handler(EmailEvent, name="emails", batch_size=10)(noop)
    commit_events(app.engine, 25, ActivityEvent)
    commit_events(app.engine, 5, EmailEvent)
    results = distributor.run_once(app)
    assert {"activities": 3, "emails": 1} == {r.handler: r.enqueued for r in results}


def test_named_handlers_only(
    make_app: Callable[[str], Outbox],
    database_url: str,
    commit_events: Callable[..., list[int]],
) -> None:
    """run_once(app, [name]) distributes only the named handler."""
    app = make_app(database_url)
    app.handler(ActivityEvent, name="activities")(noop)
    app.handler(EmailEvent, name="emails")(noop)
    commit_events(app.engine, 5, ActivityEvent)
    commit_events(app.engine, 5, EmailEvent)
    results = distributor.run_once(app, ["emails"])
    assert (["emails"], [], [0]) == (
        [r.handler for r in results],
        claim_jobs(app, "activities"),
        claim_jobs(app, "emails"),
    )


def test_overlapping_distributions_do_not_exceed_what_is_needed(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    commit_events: Callable[..., list[int]],
) -> None:
    """Two distributions whose transactions overlap enqueue the needed jobs once."""
    apps = [make_app(postgres_database) for _ in range(2)]
    for app in apps:
        app.handler(ActivityEvent, batch_size=10, max_batches=5)(noop)
    commit_events(apps[0].engine, 35)
    # Both runs count and read the taken slots before either inserts.
    barrier = threading.Barrier(2, timeout=10)
    waited = threading.local()
    for app in apps:

        @event.listens_for(app.engine, "before_cursor_execute")
        def wait_before_insert(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
            if statement.startswith("INSERT INTO outbox_jobs") and not hasattr(waited, "done"):
                waited.done = True
                barrier.wait()

    results: list[int] = []
    errors: list[BaseException] = []

    def distribute(app: Outbox) -> None:
        try:
            results.append(distributor.enqueued(distributor.run_once(app)))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=distribute, args=(app,)) for app in apps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert ([], 4, [0, 1, 2, 3]) == (errors, sum(results), claim_jobs(apps[0]))


@pytest.mark.parametrize(("events", "expected"), [(50, (50, False, 5)), (100, (80, True, 20))])
def test_a_backlog_past_the_counted_batches_fills_every_slot(
    make_app: Callable[[str], Outbox],
    database_url: str,
    commit_events: Callable[..., list[int]],
    events: int,
    expected: tuple[int, bool, int],
) -> None:
    """The count stops after COUNTED_BATCHES batches; a deeper backlog gets max_batches jobs."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=10, max_batches=20)(noop)
    assert distributor.COUNTED_BATCHES == 8
    commit_events(app.engine, events)
    (result,) = distributor.run_once(app)
    assert expected == (result.unclaimed, result.capped, result.enqueued)
