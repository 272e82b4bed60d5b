"""A buffer's events that wait with no claim job: what says that nothing distributes.

``undistributed_age`` is the age of the oldest unclaimed (claimable) event while its handler
has no claim job, pending or running; None once a claim job exists or nothing waits.
"""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement

from outbox._db import queries
from tests.conformance._database import Database
from tests.conformance._factories import (
    ACTIVITY,
    HANDLER,
    OTHER_HANDLER,
    add_claim_job,
    add_events,
    lease,
)


def _age(db: Database, only: ColumnElement[bool] | None = None) -> float | None:
    return db.run(lambda conn: queries.undistributed_age(conn, ACTIVITY, HANDLER, only))


def test_events_without_a_claim_job_have_the_oldest_ones_age(db: Database) -> None:
    """The oldest unclaimed event's age, by the database clock."""
    add_events(db.engine, 2, age=300.0)
    add_events(db.engine, 1)
    age = _age(db)
    assert True is (age is not None and 299 < age < 310)


def test_a_pending_claim_job_means_they_are_distributed(db: Database) -> None:
    """A claim job of the handler waits: None."""
    add_events(db.engine, 1, age=300.0)
    add_claim_job(db.engine, 0)
    assert None is _age(db)


def test_a_running_claim_job_means_they_are_distributed(db: Database) -> None:
    """A claim job of the handler is leased: None."""
    add_events(db.engine, 1, age=300.0)
    lease(db.engine, add_claim_job(db.engine, 0))
    assert None is _age(db)


def test_another_handlers_claim_job_does_not_count(db: Database) -> None:
    """Only the handler's own claim jobs count."""
    add_events(db.engine, 1, age=300.0)
    add_claim_job(db.engine, 0, handler=OTHER_HANDLER)
    assert True is ((_age(db) or 0) > 299)


def test_claimed_events_do_not_count(db: Database) -> None:
    """Nothing unclaimed waits: None."""
    add_events(db.engine, 2, age=300.0, group_id=uuid.uuid4())
    assert None is _age(db)


def test_only_the_rows_a_claim_may_take_count(db: Database) -> None:
    """With a condition (an ordered handler's claimable rows), the oldest row that meets it."""
    _, new = add_events(db.engine, 1, age=300.0) + add_events(db.engine, 1, age=30.0)
    age = _age(db, ACTIVITY.c.id == new)
    assert True is (age is not None and 29 < age < 40)
