"""outbox_jobs with outbox_workers: the jobs of workers whose heartbeat stopped.

A worker silent longer than the stale age is gone: its jobs are freed before their leases run
out, taking the lease token away so that a finishing write of the original holder, come back
late, changes nothing (the fence). ``silent_holders`` lists what ``outbox status`` shows.
"""

from __future__ import annotations

import uuid

from outbox import schema
from outbox._db import queries
from tests.conformance._database import Database
from tests.conformance._factories import (
    HANDLER,
    OTHER_WORKER,
    WORKER,
    add_batch_job,
    add_claim_job,
    add_worker,
    existing_job,
    job,
    lease,
    refuse,
)

STALE = 20.0


def _rescue(db: Database) -> int:
    return db.run(lambda conn: queries.rescue_jobs_of_gone_workers(conn, db.dialect, STALE))


def _acquire(db: Database, worker_id: str, token: uuid.UUID) -> list[queries.JobRow]:
    return db.run(
        lambda conn: queries.acquire_jobs(
            conn,
            db.dialect,
            handlers=[HANDLER],
            worker_id=worker_id,
            token=token,
            limit=10,
            lease_seconds=30.0,
        )
    )


def test_the_jobs_of_a_gone_worker_are_freed_before_their_lease_runs_out(db: Database) -> None:
    """A live lease of a worker silent past the stale age is freed, due now, the attempt kept."""
    add_worker(db.engine, WORKER, heartbeat_ago=STALE + 5)
    job_id = add_batch_job(db.engine, attempts=1)
    lease(db.engine, job_id, expires_in=300.0)
    rescued = _rescue(db)
    row = existing_job(db.engine, job_id)
    lease_columns = (row["lease_owner"], row["lease_token"], row["lease_expires_at"])
    due_in = db.seconds_from_now(row["run_at"])
    assert (1, (None, None, None), 2, queries.RESCUED_ERROR, True) == (
        rescued,
        lease_columns,
        row["attempts"],
        row["last_error"],
        -5 < due_in <= 0,
    )


def test_the_jobs_of_a_live_worker_stay_with_it(db: Database) -> None:
    """A worker that heartbeated within the stale age keeps its leases."""
    add_worker(db.engine, WORKER, heartbeat_ago=STALE - 10)
    job_id = add_batch_job(db.engine)
    lease(db.engine, job_id, expires_in=300.0)
    before = existing_job(db.engine, job_id)
    assert (0, before) == (_rescue(db), existing_job(db.engine, job_id))


def test_a_job_whose_holder_never_registered_keeps_its_lease(db: Database) -> None:
    """No worker row (a test helper's lease): only the lease's end frees it."""
    job_id = add_batch_job(db.engine)
    lease(db.engine, job_id, owner="unregistered", expires_in=300.0)
    before = existing_job(db.engine, job_id)
    assert (0, before) == (_rescue(db), existing_job(db.engine, job_id))


def test_a_refused_job_of_a_gone_worker_stays_refused(db: Database) -> None:
    """A refused job waits for an operator, whoever held it."""
    add_worker(db.engine, WORKER, heartbeat_ago=STALE + 5)
    job_id = add_batch_job(db.engine)
    refuse(db.engine, job_id)
    with db.engine.begin() as conn:
        conn.execute(
            schema.jobs.update().where(schema.jobs.c.id == job_id).values(lease_owner=WORKER)
        )
    before = existing_job(db.engine, job_id)
    assert (0, before) == (_rescue(db), existing_job(db.engine, job_id))


def test_the_late_original_holders_finishing_write_changes_nothing(db: Database) -> None:
    """Two holders never finish one group: once rescued and leased again, the gone holder's
    delete and release (its old token) change nothing; the new holder's delete works."""
    add_worker(db.engine, WORKER, heartbeat_ago=STALE + 5)
    add_worker(db.engine, OTHER_WORKER)
    job_id = add_batch_job(db.engine)
    old_token = lease(db.engine, job_id, expires_in=300.0)
    _rescue(db)
    new_token = uuid.uuid4()
    (acquired,) = _acquire(db, OTHER_WORKER, new_token)
    late_release = db.run(
        lambda conn: queries.release_job(conn, job_id, old_token, delay_seconds=0, error="late")
    )
    late_delete = db.run(lambda conn: queries.delete_job(conn, job_id, old_token))
    still = existing_job(db.engine, job_id)
    new_delete = db.run(lambda conn: queries.delete_job(conn, job_id, new_token))
    assert (job_id, False, False, OTHER_WORKER, new_token, True, None) == (
        acquired.id,
        late_release,
        late_delete,
        still["lease_owner"],
        still["lease_token"],
        new_delete,
        job(db.engine, job_id),
    )


def test_rescue_of_gone_workers_skips_a_job_row_locked_by_another_transaction(
    row_locks: Database,
) -> None:
    """A job whose row another session holds locked (a completion in progress) is skipped,
    not waited for; the gone worker's other job is freed."""
    db = row_locks
    add_worker(db.engine, WORKER, heartbeat_ago=STALE + 5)
    locked, free = add_batch_job(db.engine), add_batch_job(db.engine)
    for job_id in (locked, free):
        lease(db.engine, job_id, expires_in=300.0)
    with db.row_locked(schema.jobs, locked):
        rescued = _rescue(db)
    tokens = [
        existing_job(db.engine, job_id)["lease_token"] is not None for job_id in (locked, free)
    ]
    assert (1, [True, False]) == (rescued, tokens)


def test_silent_holders_lists_the_jobs_of_silent_workers_with_ages(db: Database) -> None:
    """Each leased job of a worker silent past the given age, with its heartbeat's age and its
    lease's time left; live holders, unleased and refused jobs are left out."""
    add_worker(db.engine, WORKER, heartbeat_ago=12.0)
    add_worker(db.engine, OTHER_WORKER, heartbeat_ago=1.0)
    group = uuid.uuid4()
    silent_batch = add_batch_job(db.engine, group_id=group)
    lease(db.engine, silent_batch, expires_in=40.0)
    silent_claim = add_claim_job(db.engine, 0)
    lease(db.engine, silent_claim, expires_in=40.0)
    live = add_batch_job(db.engine)
    lease(db.engine, live, owner=OTHER_WORKER)
    add_batch_job(db.engine)
    refused = add_batch_job(db.engine)
    refuse(db.engine, refused)
    found = db.run(lambda conn: queries.silent_holders(conn, 5.0))
    shape = [(h.handler, h.kind, h.group_id, h.holder) for h in found]
    ages = [(11 < h.heartbeat_age < 20, 30 < h.lease_left <= 40) for h in found]
    assert (
        [
            (HANDLER, schema.JobKind.BATCH, group, WORKER),
            (HANDLER, schema.JobKind.CLAIM, None, WORKER),
        ],
        [(True, True), (True, True)],
    ) == (shape, ages)


def test_an_older_release_worker_keeps_its_jobs_until_their_leases_run_out(db: Database) -> None:
    """A worker of a release before 0.2 (no generation) heartbeats at its own pace: silent past
    the stale age, its live leases are neither freed nor shown as silent."""
    add_worker(db.engine, WORKER, heartbeat_ago=STALE + 5, older_release=True)
    job_id = add_batch_job(db.engine, attempts=1)
    lease(db.engine, job_id, expires_in=300.0)
    rescued = _rescue(db)
    silent = db.run(lambda conn: queries.silent_holders(conn, STALE))
    assert (0, WORKER, []) == (rescued, existing_job(db.engine, job_id)["lease_owner"], silent)
