"""outbox_jobs: a worker's lease, and the fence every finishing write goes through.

A worker extends the leases of the jobs it runs, and finishes a job by deleting it, giving it
back (released with a delay, or returned uncounted) or holding it as refused. Each of those
writes names the lease token: a worker whose job was rescued, or leased to another worker since,
changes nothing, and is told so by a False.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import Connection

from outbox._db import queries
from tests.conformance._database import Database
from tests.conformance._factories import (
    OTHER_WORKER,
    WORKER,
    add_batch_job,
    existing_job,
    job,
    lease,
)

FencedWrite = Callable[[Connection, int, uuid.UUID], bool]

FENCED_WRITES: dict[str, FencedWrite] = {
    "extend_lease": lambda conn, job_id, token: queries.extend_lease(conn, job_id, token, 60.0),
    "delete_job": queries.delete_job,
    "release_job": lambda conn, job_id, token: queries.release_job(
        conn, job_id, token, delay_seconds=0.0, error="failed"
    ),
    "return_job": queries.return_job,
    "hold_refused_job": lambda conn, job_id, token: queries.hold_refused_job(
        conn, job_id, token, "refused"
    ),
}


@pytest.mark.parametrize("write", list(FENCED_WRITES))
def test_a_write_with_another_workers_token_changes_nothing(db: Database, write: str) -> None:
    """A job leased to another worker is left as it is, and the write says False."""
    job_id = add_batch_job(db.engine)
    lease(db.engine, job_id, owner=OTHER_WORKER)
    before = existing_job(db.engine, job_id)
    done = db.run(lambda conn: FENCED_WRITES[write](conn, job_id, uuid.uuid4()))
    assert (False, before) == (done, job(db.engine, job_id))


@pytest.mark.parametrize("write", list(FENCED_WRITES))
def test_a_write_with_a_rescued_lease_changes_nothing(db: Database, write: str) -> None:
    """A worker whose lease was rescued (the job free again) changes nothing with its token."""
    job_id = add_batch_job(db.engine)
    token = lease(db.engine, job_id, expires_in=-5.0)
    db.run(lambda conn: queries.rescue_expired_jobs(conn, db.dialect))
    before = existing_job(db.engine, job_id)
    done = db.run(lambda conn: FENCED_WRITES[write](conn, job_id, token))
    assert (False, before) == (done, job(db.engine, job_id))


@pytest.mark.parametrize("write", list(FENCED_WRITES))
def test_a_write_with_a_lease_taken_over_changes_nothing(db: Database, write: str) -> None:
    """A worker whose job was rescued and leased to another worker changes nothing."""
    job_id = add_batch_job(db.engine)
    stale = lease(db.engine, job_id, expires_in=-5.0)
    db.run(lambda conn: queries.rescue_expired_jobs(conn, db.dialect))
    lease(db.engine, job_id, owner=OTHER_WORKER)
    before = existing_job(db.engine, job_id)
    done = db.run(lambda conn: FENCED_WRITES[write](conn, job_id, stale))
    assert (False, before) == (done, job(db.engine, job_id))


def test_extend_lease_pushes_the_lease_back(db: Database) -> None:
    """The job's lease now ends the given seconds from now; the write says True."""
    job_id = add_batch_job(db.engine)
    token = lease(db.engine, job_id, expires_in=5.0)
    extended = db.run(lambda conn: queries.extend_lease(conn, job_id, token, 60.0))
    expires_in = db.seconds_from_now(existing_job(db.engine, job_id)["lease_expires_at"])
    assert (True, True) == (extended, 55 < expires_in <= 60)


def test_extend_leases_pushes_back_the_named_jobs_of_the_worker(db: Database) -> None:
    """Only the jobs named that the worker holds are extended; the count says how many."""
    named, unnamed, others = (add_batch_job(db.engine) for _ in range(3))
    for job_id in (named, unnamed):
        lease(db.engine, job_id, expires_in=5.0)
    lease(db.engine, others, owner=OTHER_WORKER, expires_in=5.0)
    extended = db.run(lambda conn: queries.extend_leases(conn, WORKER, [named, others], 60.0))
    expiries = [
        db.seconds_from_now(existing_job(db.engine, job_id)["lease_expires_at"])
        for job_id in (named, unnamed, others)
    ]
    assert (1, [True, False, False]) == (extended, [55 < e <= 60 for e in expiries])


def test_extend_leases_of_no_jobs_extends_nothing(db: Database) -> None:
    """A worker running nothing extends nothing."""
    lease(db.engine, add_batch_job(db.engine))
    assert 0 == db.run(lambda conn: queries.extend_leases(conn, WORKER, [], 60.0))


def test_extend_leases_leaves_a_rescued_job(db: Database) -> None:
    """A job rescued from the worker is no longer its own to extend."""
    job_id = add_batch_job(db.engine)
    lease(db.engine, job_id, expires_in=-5.0)
    db.run(lambda conn: queries.rescue_expired_jobs(conn, db.dialect))
    assert 0 == db.run(lambda conn: queries.extend_leases(conn, WORKER, [job_id], 60.0))


def test_delete_job_deletes_a_held_job(db: Database) -> None:
    """A worker that holds the lease deletes its finished job."""
    job_id = add_batch_job(db.engine)
    token = lease(db.engine, job_id)
    deleted = db.run(lambda conn: queries.delete_job(conn, job_id, token))
    assert (True, None) == (deleted, job(db.engine, job_id))


def test_release_job_gives_the_job_back_after_the_delay(db: Database) -> None:
    """A released job has no lease, is due after the delay, keeps its attempt and records
    the error."""
    job_id = add_batch_job(db.engine)
    token = lease(db.engine, job_id)
    released = db.run(
        lambda conn: queries.release_job(conn, job_id, token, delay_seconds=60.0, error="boom")
    )
    row = existing_job(db.engine, job_id)
    due_in = db.seconds_from_now(row["run_at"])
    lease_columns = (row["lease_owner"], row["lease_token"], row["lease_expires_at"])
    actual = (released, lease_columns, row["attempts"], row["last_error"], 55 < due_in <= 60)
    assert (True, (None, None, None), 1, "boom", True) == actual


def test_return_job_gives_the_job_back_uncounted(db: Database) -> None:
    """A returned job has no lease, its attempt is taken back, its last error stays."""
    job_id = add_batch_job(db.engine, attempts=2, last_error="earlier")
    token = lease(db.engine, job_id)
    returned = db.run(lambda conn: queries.return_job(conn, job_id, token))
    row = existing_job(db.engine, job_id)
    lease_columns = (row["lease_owner"], row["lease_token"], row["lease_expires_at"])
    actual = (returned, lease_columns, row["attempts"], row["last_error"])
    assert (True, (None, None, None), 2, "earlier") == actual


def test_hold_refused_job_keeps_the_token_without_an_expiry(db: Database) -> None:
    """A job held as refused keeps its token, has no owner and no expiry, and says why."""
    job_id = add_batch_job(db.engine)
    token = lease(db.engine, job_id)
    held = db.run(lambda conn: queries.hold_refused_job(conn, job_id, token, "refused: why"))
    row = existing_job(db.engine, job_id)
    lease_columns = (row["lease_owner"], row["lease_token"], row["lease_expires_at"])
    actual = (held, lease_columns, row["attempts"], row["last_error"])
    assert (True, (None, token, None), 1, "refused: why") == actual
