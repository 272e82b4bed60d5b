"""A finishing write the database refuses for good never loops: the group is held as refused,
visible, and released by an operator once the cause is fixed. On every database.

The refusal comes from a trigger of the application's that forbids deleting events, which
makes every completion of the buffer's groups fail the way a value the archive refuses, a
constraint or a statement the database cannot run would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from outbox import Batch, Outbox, RetryPolicy, schema
from outbox.ops import holds
from outbox.ops.metrics import collect
from outbox.testing import drain
from outbox.worker import Worker
from tests._support import REFUSAL, allow_deletes, refuse_deletes
from tests.models import ActivityEvent

TABLE = ActivityEvent.__table__.name
NO_WAIT = RetryPolicy(max_attempts=2, scale=0.0, base_delay=0.0, jitter=0.0)


class Recorder:
    """A handler that records each call's attempt; it fails while ``failing`` is set."""

    def __init__(self, failing: bool = False) -> None:
        self.attempts: list[int] = []
        self.failing = failing

    def __call__(self, batch: Batch[Any]) -> None:
        self.attempts.append(batch.attempt)
        if self.failing:
            raise RuntimeError("the downstream refused the batch")


@pytest.fixture
def app(database_url: str, make_app: Callable[[str], Outbox]) -> Iterator[Outbox]:
    """An app whose buffer refuses to give up its events, until ``allow_deletes``."""
    app = make_app(database_url)
    refuse_deletes(app.engine, TABLE)
    yield app
    allow_deletes(app.engine, TABLE)


def run_everything_due_twice(app: Outbox) -> None:
    """Drain, rescue expired leases, drain again: whatever could run again, would."""
    drain(app)
    Worker(app).rescue()
    drain(app)


def buffered(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one())


def test_a_succeeded_group_the_database_will_not_record_is_held_not_delivered_again(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """The handler succeeded once; the group is held as refused, and never handed over again."""
    recorder = Recorder()
    app.handler(ActivityEvent, name="push", batch_size=10, retry=NO_WAIT)(recorder)
    commit_events(app.engine, 3)

    run_everything_due_twice(app)
    (held,) = holds.refused_groups(app)
    (status,) = collect(app)

    assert ([1], 1, 3, True, True) == (
        recorder.attempts,
        status.groups_refused,
        buffered(app.engine),
        REFUSAL in (held.error or ""),
        any("refused" in alert for alert in status.alerts),
    )


def test_a_group_out_of_attempts_is_held_when_its_dead_letter_is_refused(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A failing group is attempted max_attempts times, then held: never attempted again."""
    recorder = Recorder(failing=True)
    app.handler(ActivityEvent, name="push", batch_size=10, retry=NO_WAIT)(recorder)
    commit_events(app.engine, 3)

    run_everything_due_twice(app)
    (held,) = holds.refused_groups(app)

    assert ([1, 2], 2, "dead") == (
        recorder.attempts,
        held.attempts,
        "dead" if "as dead" in (held.error or "") else held.error,
    )


def test_a_released_group_is_handled_again_once_the_cause_is_fixed(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Released after the trigger is dropped, the group is delivered again and finished."""
    recorder = Recorder()
    app.handler(ActivityEvent, name="push", batch_size=10, retry=NO_WAIT)(recorder)
    commit_events(app.engine, 3)
    drain(app)
    allow_deletes(app.engine, TABLE)

    released = holds.release_refused(app, handler="push")
    drain(app)

    assert (1, [1, 2], [], 0) == (
        released,
        recorder.attempts,
        holds.refused_groups(app),
        buffered(app.engine),
    )


def test_refused_groups_do_not_count_against_a_concurrency_cap(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A capped handler with a refused group still takes its other groups."""
    recorder = Recorder()
    app.handler(ActivityEvent, name="push", batch_size=2, concurrency=1, retry=NO_WAIT)(recorder)
    commit_events(app.engine, 2)
    drain(app)
    allow_deletes(app.engine, TABLE)
    commit_events(app.engine, 2)

    drain(app)

    with app.engine.connect() as conn:
        jobs = conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one()
    assert ([1, 1], 1, 1) == (recorder.attempts, len(holds.refused_groups(app)), jobs)
