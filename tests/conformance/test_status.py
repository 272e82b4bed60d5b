"""What ``outbox status`` and the metrics read: jobs by state, failed attempts, archive counts,
buffer rows and the age of the oldest event.

A job's state is derived from its lease columns (:class:`outbox.schema.JobState`): waiting
(never attempted), retrying (attempted, not leased), running (leased) and refused (a token
with no expiry).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import Engine

from outbox import schema
from outbox._db import queries
from tests.conformance._database import Database
from tests.conformance._factories import (
    ACTIVITY,
    HANDLER,
    OTHER_HANDLER,
    add_archived,
    add_batch_job,
    add_claim_job,
    add_events,
    lease,
    refuse,
)

BATCH = schema.JobKind.BATCH
CLAIM = schema.JobKind.CLAIM
State = schema.JobState


def _waiting(engine: Engine) -> None:
    add_batch_job(engine)


def _retrying(engine: Engine) -> None:
    add_batch_job(engine, attempts=1, last_error="failed", due_in=30.0)


def _running(engine: Engine) -> None:
    lease(engine, add_batch_job(engine))


def _refused(engine: Engine) -> None:
    refuse(engine, add_batch_job(engine))


JOBS_IN_STATE: dict[State, Callable[[Engine], None]] = {
    State.WAITING: _waiting,
    State.RETRYING: _retrying,
    State.RUNNING: _running,
    State.REFUSED: _refused,
}


@pytest.mark.parametrize("state", list(JOBS_IN_STATE))
def test_job_counts_count_a_job_in_its_state(db: Database, state: State) -> None:
    """A job is counted once, in the state its lease columns say."""
    JOBS_IN_STATE[state](db.engine)
    assert {(HANDLER, BATCH, state.value): 1} == db.run(queries.job_counts)


def test_a_running_job_that_was_attempted_before_is_running(db: Database) -> None:
    """A lease says running, whatever the attempts before it."""
    lease(db.engine, add_batch_job(db.engine, attempts=3))
    assert {(HANDLER, BATCH, State.RUNNING.value): 1} == db.run(queries.job_counts)


def test_job_counts_count_by_handler_and_kind(db: Database) -> None:
    """Jobs are counted apart per handler and per kind."""
    add_claim_job(db.engine, 0)
    add_claim_job(db.engine, 1)
    add_batch_job(db.engine)
    add_claim_job(db.engine, 0, handler=OTHER_HANDLER)
    expected = {
        (HANDLER, CLAIM, State.WAITING.value): 2,
        (HANDLER, BATCH, State.WAITING.value): 1,
        (OTHER_HANDLER, CLAIM, State.WAITING.value): 1,
    }
    assert expected == db.run(queries.job_counts)


def test_max_failed_attempts_looks_at_waiting_batch_jobs_only(db: Database) -> None:
    """Per handler, the most attempts of a batch job waiting for its next attempt; a running
    job's attempt in progress and claim jobs do not count."""
    add_batch_job(db.engine, attempts=2)
    add_batch_job(db.engine, attempts=1)
    lease(db.engine, add_batch_job(db.engine, attempts=5))
    add_claim_job(db.engine, 0, attempts=7)
    add_batch_job(db.engine, handler=OTHER_HANDLER)
    assert {HANDLER: 2, OTHER_HANDLER: 0} == db.run(queries.max_failed_attempts)


def test_archive_counts_count_by_handler_and_status(db: Database) -> None:
    """Archived rows are counted apart per handler and per status."""
    add_archived(db.engine)
    add_archived(db.engine)
    add_archived(db.engine, status=schema.ArchiveStatus.DEAD)
    add_archived(db.engine, handler=OTHER_HANDLER)
    expected = {
        (HANDLER, schema.ArchiveStatus.SUCCEEDED.value): 2,
        (HANDLER, schema.ArchiveStatus.DEAD.value): 1,
        (OTHER_HANDLER, schema.ArchiveStatus.SUCCEEDED.value): 1,
    }
    assert expected == db.run(queries.archive_counts)


@pytest.mark.parametrize(("unclaimed", "expected"), [(True, 3), (False, 2), (None, 5)])
@pytest.mark.parametrize("cap", [None, 4])
def test_count_buffer_rows_counts_unclaimed_or_claimed_rows(
    db: Database, unclaimed: bool | None, expected: int, cap: int | None
) -> None:
    """Unclaimed rows, the rows in groups, or all of them; no further than a cap."""
    add_events(db.engine, 3)
    add_events(db.engine, 1, group_id=uuid.uuid4())
    add_events(db.engine, 1, group_id=uuid.uuid4())
    assert min(expected, cap or expected) == db.run(
        lambda conn: queries.count_buffer_rows(conn, ACTIVITY, unclaimed=unclaimed, cap=cap)
    )


def test_oldest_event_age_of_an_empty_buffer_is_none(db: Database) -> None:
    """No event, no age."""
    assert None is db.run(lambda conn: queries.oldest_event_age(conn, ACTIVITY))


def test_oldest_event_age_is_the_oldest_rows_claimed_or_not(db: Database) -> None:
    """The age of the oldest event still in the buffer, claimed or not, on the database
    clock."""
    add_events(db.engine, 1, group_id=uuid.uuid4(), age=60.0)
    add_events(db.engine, 1, age=30.0)
    age = db.run(lambda conn: queries.oldest_event_age(conn, ACTIVITY))
    assert True is (age is not None and 60.0 <= age < 65.0)


def test_oldest_event_age_is_never_negative(db: Database) -> None:
    """An event dated ahead of the database clock has waited no time, not less."""
    add_events(db.engine, 1, age=-30.0)
    assert 0.0 == db.run(lambda conn: queries.oldest_event_age(conn, ACTIVITY))
