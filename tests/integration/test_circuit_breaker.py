"""The circuit breaker: failed groups in a row pause the handler fleet-wide; once the pause is
over it probes one group at a time; a success closes it, a failed probe opens it again for
longer. Counted in the database, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable

import pytest

from outbox import Batch, CircuitBreaker, ConfigurationError, Outbox, RetryAfter, RetryPolicy
from outbox._db import queries
from outbox._engine import breaker as _breaker
from outbox._engine import claimer
from outbox._engine.flow_state import FlowState
from outbox.ops import flow, metrics
from outbox.results import SUCCEEDED, BatchResult
from outbox.testing import drain
from outbox.worker import Worker
from tests._support import JULIANDAY_ERROR
from tests.models import ActivityEvent

NO_WAIT = RetryPolicy(max_attempts=20, scale=0.0, base_delay=0.0, jitter=0.0)
BREAKER = CircuitBreaker(failures=3, probe_after=30.0)

Commit = Callable[..., list[int]]


def _status(app: Outbox) -> metrics.HandlerStatus:
    (row,) = metrics.collect(app)
    return row


def _probing(app: Outbox, name: str) -> None:
    """Put the handler's breaker where a pause it opened has just ended: probing."""
    with app.engine.begin() as conn:
        queries.lock_handler_state(conn, app.dialect, name)
        queries.set_breaker_counts(conn, name, failures=0, trips=1)


def _waiting_groups(app: Outbox, name: str, count: int) -> None:
    for _ in range(count):
        assert claimer.run_once(app, app.get_handler(name)) is not None


def test_failed_groups_in_a_row_open_the_breaker(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """The third failed group in a row pauses the handler for ``probe_after``: no fourth
    group is handed over."""
    app = make_app(database_url)
    calls: list[int] = []

    @app.handler(ActivityEvent, batch_size=1, retry=NO_WAIT, circuit_breaker=BREAKER)
    def down(batch: Batch[ActivityEvent]) -> None:
        calls.extend(batch.ids)
        raise RuntimeError("503 from the bulk API")

    commit_events(app.engine, 5)
    drain(app)
    status = _status(app)
    assert (3, "open", True, "breaker") == (
        len(calls),
        status.breaker,
        status.paused,
        status.pause_cause,
    )
    assert 29 < (status.paused_for or 0) <= 30 + JULIANDAY_ERROR
    assert status.pause_reason == (
        "circuit breaker open: 3 groups failed in a row; "
        "last error: RuntimeError: 503 from the bulk API"
    )


def test_a_success_breaks_the_run_of_failures(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)
    outcomes = iter([False, False, True, False, False])

    @app.handler(
        ActivityEvent, batch_size=1, retry=RetryPolicy(max_attempts=1), circuit_breaker=BREAKER
    )
    def flaky(batch: Batch[ActivityEvent]) -> None:
        if not next(outcomes):
            raise RuntimeError("503")

    commit_events(app.engine, 5)
    stats = drain(app).stats
    status = _status(app)
    assert (1, 4, "closed", 2, False) == (
        stats.groups_succeeded,
        stats.groups_dead,
        status.breaker,
        status.consecutive_failures,
        status.paused,
    )


def test_a_success_breaks_a_run_of_failures_another_worker_counted(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """Failures another worker counted are reset by a success here once this worker has read
    them (its view of the breakers is read at its start and every second): two failures
    elsewhere, a success here, two failures here: two in a row, the breaker closed."""
    app = make_app(database_url)
    outcomes = iter([True, False, False])

    @app.handler(
        ActivityEvent, batch_size=1, retry=RetryPolicy(max_attempts=1), circuit_breaker=BREAKER
    )
    def flaky(batch: Batch[ActivityEvent]) -> None:
        if not next(outcomes):
            raise RuntimeError("503")

    with app.engine.begin() as conn:
        queries.lock_handler_state(conn, app.dialect, "flaky")
        queries.set_breaker_counts(conn, "flaky", failures=2, trips=0)
    commit_events(app.engine, 3)
    stats = drain(app).stats
    status = _status(app)
    assert (1, 2, "closed", 2, False) == (
        stats.groups_succeeded,
        stats.groups_dead,
        status.breaker,
        status.consecutive_failures,
        status.paused,
    )


def test_a_worker_whose_view_of_the_breakers_is_stale_resets_the_count(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """A success skips the reset only on a view read within two refresh periods: a view never
    refreshed (or long ago) says a count may be there, and the success resets it."""
    app = make_app(database_url)

    @app.handler(ActivityEvent, batch_size=1, circuit_breaker=BREAKER)
    def fine(batch: Batch[ActivityEvent]) -> None:
        """Accept every event."""

    with app.engine.begin() as conn:
        queries.lock_handler_state(conn, app.dialect, "fine")
        queries.set_breaker_counts(conn, "fine", failures=2, trips=0)
    view = FlowState(app, refresh_every=60.0)
    success = BatchResult(
        handler="fine", group_id=uuid.uuid4(), attempt=1, outcome=SUCCEEDED, size=1
    )
    assert view.counting("fine")
    _breaker.record(app, app.get_handler("fine"), BREAKER, success, view)
    view.refresh()
    assert (0, False) == (_status(app).consecutive_failures, view.counting("fine"))


def test_deferrals_are_not_failures(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)
    calls: list[int] = []

    @app.handler(ActivityEvent, batch_size=1, retry=NO_WAIT, circuit_breaker=BREAKER)
    def limited(batch: Batch[ActivityEvent]) -> None:
        calls.append(batch.attempt)
        raise RetryAfter(60)

    commit_events(app.engine, 4)
    drain(app)
    status = _status(app)
    assert (1, "closed", 0, "retry_after") == (
        len(calls),
        status.breaker,
        status.consecutive_failures,
        status.pause_cause,
    )


def test_a_probing_breaker_lets_one_group_run_at_a_time(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """Probing, a worker with four threads leases one group; its success closes the breaker,
    and the next acquisition takes four."""
    app = make_app(database_url)
    app.handler(
        ActivityEvent, name="recovered", batch_size=1, retry=NO_WAIT, circuit_breaker=BREAKER
    )(lambda batch: None)

    commit_events(app.engine, 6)
    _waiting_groups(app, "recovered", 6)
    _probing(app, "recovered")
    worker = Worker(app, concurrency=4)
    first = worker.run_once()
    closed = _status(app).breaker
    second = worker.run_once()
    assert (1, "closed", 4) == (first, closed, second)


def test_no_group_runs_beside_a_probe_on_a_busy_worker(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """A worker with four threads draining claim jobs: the probe runs alone; once it has
    succeeded, groups run side by side again."""
    app = make_app(database_url)
    spans: list[tuple[float, float]] = []

    @app.handler(ActivityEvent, batch_size=1, retry=NO_WAIT, circuit_breaker=BREAKER)
    def recovered(batch: Batch[ActivityEvent]) -> None:
        start = time.monotonic()
        time.sleep(0.1)
        spans.append((start, time.monotonic()))

    commit_events(app.engine, 9)
    _probing(app, "recovered")
    Worker(app, concurrency=4, burst=True).run()
    probe, *rest = sorted(spans)
    beside_probe = [span for span in rest if span[0] < probe[1]]
    side_by_side = sum(1 for a, b in itertools.pairwise(rest) if b[0] < a[1])
    assert (9, [], True) == (len(spans), beside_probe, side_by_side > 0)


def test_a_failed_probe_opens_the_breaker_for_twice_as_long(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)

    @app.handler(ActivityEvent, batch_size=1, retry=NO_WAIT, circuit_breaker=BREAKER)
    def still_down(batch: Batch[ActivityEvent]) -> None:
        raise RuntimeError("503")

    commit_events(app.engine, 3)
    _waiting_groups(app, "still_down", 3)
    _probing(app, "still_down")
    ran = Worker(app, concurrency=4).run_once()
    status = _status(app)
    with app.engine.connect() as conn:
        trips = queries.handler_states(conn)["still_down"].trips
    assert (1, "open", 2) == (ran, status.breaker, trips)
    assert 59 < (status.paused_for or 0) <= 60 + JULIANDAY_ERROR
    assert status.pause_reason is not None
    assert status.pause_reason.startswith("circuit breaker open: a probe failed")


def test_resume_closes_an_open_breaker(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)

    @app.handler(ActivityEvent, batch_size=1, retry=NO_WAIT, circuit_breaker=BREAKER)
    def down(batch: Batch[ActivityEvent]) -> None:
        raise RuntimeError("503")

    commit_events(app.engine, 3)
    drain(app)
    assert "open" == _status(app).breaker
    flow.resume(app, "down")
    status = _status(app)
    assert ("closed", False, 0) == (status.breaker, status.paused, status.consecutive_failures)


def test_the_breaker_stays_open_no_longer_than_max_probe_after() -> None:
    breaker = CircuitBreaker(failures=1, probe_after=10, max_probe_after=50)
    assert [10, 20, 40, 50, 50] == [breaker.open_for(trips) for trips in range(1, 6)]
    assert 50 == breaker.open_for(10_000)


@pytest.mark.parametrize(
    "options",
    [
        {"failures": 0},
        {"probe_after": 0},
        {"probe_after": float("nan")},
        {"max_probe_after": float("inf")},
        {"probe_after": 60, "max_probe_after": 30},
        {"failures": 2.5},
        {"failures": True},
        {"probe_after": "30"},
        {"max_probe_after": 1e12},
    ],
)
def test_circuit_breaker_refuses_bad_settings(options: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match="CircuitBreaker"):
        CircuitBreaker(**options)  # type: ignore[arg-type]
