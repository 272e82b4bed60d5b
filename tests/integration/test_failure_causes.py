"""Failures have a cause: the circuit breaker counts only the downstream's. A poison event that
bisection is isolating, or a failure the handler marks as the data's (``DataError``), never
opens it; a probe is a group never attempted. On SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from sqlalchemy import select

from outbox import Batch, CircuitBreaker, DataError, DownstreamError, Outbox, RetryPolicy, schema
from outbox._db import queries
from outbox._engine import claimer
from outbox.ops import metrics
from outbox.testing import drain
from tests.models import ActivityEvent

NO_WAIT = RetryPolicy(max_attempts=8, scale=0.0, base_delay=0.0, jitter=0.0)
BREAKER = CircuitBreaker(failures=2, probe_after=30.0)

Commit = Callable[..., list[int]]


def _status(app: Outbox) -> metrics.HandlerStatus:
    (row,) = metrics.collect(app)
    return row


def _archived(app: Outbox) -> dict[int, str]:
    with app.engine.connect() as conn:
        rows = conn.execute(select(schema.archive.c.event_id, schema.archive.c.status))
        return dict(rows.all())


def _drain_all(app: Outbox) -> None:
    # Bisection's halves wait no backoff here, but each drain stops once nothing is due.
    for _ in range(20):
        if not drain(app).jobs:
            return


@pytest.mark.parametrize("marked", [False, True])
def test_bisection_isolates_a_poison_event_without_opening_the_breaker(
    database_url: str, make_app: Callable[..., Outbox], commit_events: Commit, marked: bool
) -> None:
    """docs/flow-control.md pairs bisection with a breaker. Before, each failed half counted
    as a failure of the downstream: two in a row opened the breaker, and every event waited
    while the poison one was being isolated. Now only the whole group's first failure counts
    (unmarked), or none (``DataError``)."""
    app = make_app(database_url)
    delivered: list[int] = []

    @app.handler(ActivityEvent, batch_size=8, retry=NO_WAIT, bisect=True, circuit_breaker=BREAKER)
    def bulk(batch: Batch[ActivityEvent]) -> None:
        if poison in batch.ids:
            if marked:
                raise DataError("400: record 3 cannot be read")
            raise ValueError("400: record 3 cannot be read")
        delivered.extend(batch.ids)

    ids = commit_events(app.engine, 8)
    poison = ids[2]
    _drain_all(app)
    status = _status(app)
    assert (status.paused, status.breaker) == (False, "closed")
    assert sorted(delivered) == [i for i in ids if i != poison]
    assert _archived(app) == {poison: "dead"}


def test_a_data_error_never_counts_for_the_breaker(
    database_url: str, make_app: Callable[..., Outbox], commit_events: Commit
) -> None:
    """Groups refused for their data, one after the other: the breaker stays closed."""
    app = make_app(database_url)

    @app.handler(ActivityEvent, batch_size=1, retry=NO_WAIT, circuit_breaker=BREAKER)
    def bulk(batch: Batch[ActivityEvent]) -> None:
        raise DataError("422: unprocessable")

    commit_events(app.engine, 4)
    drain(app)
    status = _status(app)
    assert (status.paused, status.consecutive_failures) == (False, 0)


@pytest.mark.parametrize(
    "error", [ConnectionError("reset by peer"), TimeoutError("read"), DownstreamError("503")]
)
def test_the_downstreams_failures_count_even_while_bisecting(
    database_url: str,
    make_app: Callable[..., Outbox],
    commit_events: Commit,
    error: Exception,
) -> None:
    """A half failing with a connection error, a timeout or a ``DownstreamError`` is the
    downstream's: counted, so that an outage during a bisection still opens the breaker."""
    app = make_app(database_url)
    calls: list[int] = []

    @app.handler(ActivityEvent, batch_size=4, retry=NO_WAIT, bisect=True, circuit_breaker=BREAKER)
    def bulk(batch: Batch[ActivityEvent]) -> None:
        calls.append(len(batch))
        raise error

    commit_events(app.engine, 4)
    drain(app)
    status = _status(app)
    assert (status.paused, status.pause_cause, calls) == (True, "breaker", [4, 2])


def test_a_probe_takes_a_group_never_attempted_before_one_that_failed(
    database_url: str, make_app: Callable[..., Outbox], commit_events: Commit
) -> None:
    """Before, every probe picked the longest-due group: a poison half, which failed again
    and doubled the pause. A probe now takes a group never attempted when there is one."""
    app = make_app(database_url)
    calls: list[list[int]] = []

    backoff = RetryPolicy(max_attempts=8, scale=0.0, base_delay=0.3, jitter=0.0)

    @app.handler(ActivityEvent, batch_size=1, retry=backoff, circuit_breaker=BREAKER)
    def bulk(batch: Batch[ActivityEvent]) -> None:
        calls.append(batch.ids)
        if batch.ids == [poison]:
            raise ValueError("400")

    poison, *_ = commit_events(app.engine, 1)
    drain(app)  # the poison group fails once, due again in 0.3 s
    fresh = commit_events(app.engine, 1)
    assert claimer.run_once(app, app.get_handler("bulk")) is not None
    with app.engine.begin() as conn:  # the breaker probes: one group at a time
        queries.lock_handler_state(conn, app.dialect, "bulk")
        queries.set_breaker_counts(conn, "bulk", failures=0, trips=1)
    time.sleep(0.4)  # both due, the failed one longer
    drain(app)
    assert calls[:2] == [[poison], fresh]
    assert _status(app).breaker == "closed"
