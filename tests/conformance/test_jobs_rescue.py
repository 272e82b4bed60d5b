"""outbox_jobs: rescuing the jobs whose lease ran out.

Rescue frees an expired lease for another worker: the attempt stays counted and the job says
it was interrupted. It leaves live leases and refused jobs alone, and steps over a job row
that another transaction holds locked (a completion in progress) instead of waiting for it.
"""

from __future__ import annotations

import time
import uuid

from sqlalchemy import Connection

from outbox import schema
from outbox._db import queries
from tests._support import wait_for
from tests.conformance._database import Database
from tests.conformance._factories import (
    HANDLER,
    WORKER,
    add_batch_job,
    existing_job,
    lease,
    refuse,
)


def _rescue(db: Database) -> int:
    return db.run(lambda conn: queries.rescue_expired_jobs(conn, db.dialect))


def test_rescue_frees_an_expired_lease(db: Database) -> None:
    """The job has no lease any more and is due now; the count says one job was rescued."""
    job_id = add_batch_job(db.engine, due_in=-60.0)
    lease(db.engine, job_id, expires_in=-1.0)
    rescued = _rescue(db)
    row = existing_job(db.engine, job_id)
    lease_columns = (row["lease_owner"], row["lease_token"], row["lease_expires_at"])
    due_in = db.seconds_from_now(row["run_at"])
    assert (1, (None, None, None), True) == (rescued, lease_columns, -5 < due_in <= 0)


def test_rescue_keeps_the_attempt_counted_and_says_why(db: Database) -> None:
    """The interrupted attempt stays counted, and the job's last error says it was rescued."""
    job_id = add_batch_job(db.engine, attempts=2)
    lease(db.engine, job_id, expires_in=-1.0)
    _rescue(db)
    row = existing_job(db.engine, job_id)
    assert (3, queries.RESCUED_ERROR) == (row["attempts"], row["last_error"])


def test_rescue_leaves_a_live_lease(db: Database) -> None:
    """A lease that has not run out stays with its worker."""
    job_id = add_batch_job(db.engine)
    lease(db.engine, job_id, expires_in=30.0)
    before = existing_job(db.engine, job_id)
    assert (0, before) == (_rescue(db), existing_job(db.engine, job_id))


def test_rescue_leaves_a_refused_job(db: Database) -> None:
    """A job held as refused has no expiry to run out."""
    job_id = add_batch_job(db.engine)
    refuse(db.engine, job_id)
    before = existing_job(db.engine, job_id)
    assert (0, before) == (_rescue(db), existing_job(db.engine, job_id))


def test_rescue_leaves_jobs_that_are_not_leased(db: Database) -> None:
    """A waiting job has nothing to rescue."""
    job_id = add_batch_job(db.engine, attempts=1, last_error="failed")
    before = existing_job(db.engine, job_id)
    assert (0, before) == (_rescue(db), existing_job(db.engine, job_id))


def test_a_rescued_job_is_acquired_again(db: Database) -> None:
    """Once rescued, the job is free for the next acquisition, its attempt counted again."""
    job_id = add_batch_job(db.engine)
    lease(db.engine, job_id, expires_in=-1.0)
    _rescue(db)

    def acquire(conn: Connection) -> list[queries.JobRow]:
        return queries.acquire_jobs(
            conn,
            db.dialect,
            handlers=[HANDLER],
            worker_id=WORKER,
            token=uuid.uuid4(),
            limit=10,
            lease_seconds=30.0,
        )

    jobs = db.run(acquire)
    assert [(job_id, 2)] == [(job.id, job.attempts) for job in jobs]


def test_a_lease_expires_once_its_seconds_have_passed(db: Database) -> None:
    """A lease of half a second is not rescued at once, and is rescued once it has run out."""
    job_id = add_batch_job(db.engine)
    started = time.monotonic()
    lease(db.engine, job_id, expires_in=0.5)
    at_once = _rescue(db)
    wait_for(lambda: _rescue(db), "the lease to expire", timeout=5.0)
    # Less 10 ms: SQLite's clock reads to the millisecond, down.
    assert (0, True) == (at_once, time.monotonic() - started >= 0.49)


def test_rescue_skips_a_job_row_locked_by_another_transaction(row_locks: Database) -> None:
    """A job whose row another session holds locked (a completion in progress) is skipped,
    not waited for: the other expired jobs are rescued at once (a wait fails on the short
    lock timeout), and the locked one keeps its lease."""
    db = row_locks
    locked, free = add_batch_job(db.engine), add_batch_job(db.engine)
    for job_id in (locked, free):
        lease(db.engine, job_id, expires_in=-1.0)
    with db.row_locked(schema.jobs, locked):
        rescued = _rescue(db)
    tokens = [
        existing_job(db.engine, job_id)["lease_token"] is not None for job_id in (locked, free)
    ]
    assert (1, [True, False]) == (rescued, tokens)
