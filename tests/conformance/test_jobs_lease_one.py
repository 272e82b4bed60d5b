"""outbox_jobs: leasing one job by its id, for an executor handed the id in a message.

The job is leased only when it is due, unleased and its handler not paused; otherwise nothing
happens and nothing is returned, so that a message delivered twice runs its job once. Two
sessions leasing the same job at once: one gets it, the other gets nothing without waiting
(PostgreSQL and MariaDB skip the row the first holds locked; SQLite lets one writer in at a
time). A batch job of a capped handler is leased only while the cap has room.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from outbox import schema
from outbox._db import queries
from tests.conformance._database import EXPECTED_LOCK_WAIT_SECONDS, THREAD_SECONDS, Database
from tests.conformance._factories import (
    HANDLER,
    OTHER_HANDLER,
    WORKER,
    add_batch_job,
    add_claim_job,
    existing_job,
    lease,
    refuse,
)

LEASE = 30.0


def _lease_job(
    conn: Connection,
    db: Database,
    job_id: int,
    *,
    token: uuid.UUID | None = None,
    handlers: list[str] | None = None,
    caps: dict[str, int] | None = None,
) -> queries.JobRow | None:
    return queries.lease_job(
        conn,
        db.dialect,
        job_id=job_id,
        worker_id=WORKER,
        token=token or uuid.uuid4(),
        lease_seconds=LEASE,
        handlers=handlers,
        caps=caps,
    )


def _leased_id(db: Database, job_id: int, caps: dict[str, int] | None = None) -> int | None:
    job = db.run(lambda conn: _lease_job(conn, db, job_id, caps=caps))
    return None if job is None else job.id


def test_lease_job_leases_the_due_job_to_the_worker(db: Database) -> None:
    """The job gets the worker as owner, the token, a lease of the given seconds, and its
    attempt counted."""
    job_id = add_batch_job(db.engine, attempts=1)
    token = uuid.uuid4()
    db.run(lambda conn: _lease_job(conn, db, job_id, token=token))
    row = existing_job(db.engine, job_id)
    expires_in = db.seconds_from_now(row["lease_expires_at"])
    actual = (row["lease_owner"], row["lease_token"], row["attempts"], LEASE - 5 < expires_in)
    assert (WORKER, token, 2, True) == actual


def test_lease_job_returns_the_job_as_leased(db: Database) -> None:
    """What it returns is the job as the table now holds it."""
    group_id = uuid.uuid4()
    job_id = add_batch_job(db.engine, group_id=group_id, priority=4, last_error="before")
    token = uuid.uuid4()
    job = db.run(lambda conn: _lease_job(conn, db, job_id, token=token))
    expected = queries.JobRow(
        job_id,
        schema.JobKind.BATCH,
        HANDLER,
        None,
        group_id,
        4,
        1,
        token,
        "before",
        lease_owner=WORKER,
    )
    assert expected == job


def test_lease_job_leases_a_claim_job(db: Database) -> None:
    """A claim job is leased by its id as a batch job is."""
    job_id = add_claim_job(db.engine, 0)
    assert job_id == _leased_id(db, job_id)


def test_lease_job_leaves_the_other_jobs(db: Database) -> None:
    """Only the job named is leased, not the most urgent one."""
    other = add_batch_job(db.engine, priority=0, due_in=-60)
    named = add_batch_job(db.engine, priority=5)
    _leased_id(db, named)
    assert None is existing_job(db.engine, other)["lease_token"]


def test_lease_job_of_a_leased_job_leases_nothing(db: Database) -> None:
    """A job another holds (a second delivery of its message) stays theirs."""
    job_id = add_batch_job(db.engine)
    token = lease(db.engine, job_id)
    actual = (_leased_id(db, job_id), existing_job(db.engine, job_id)["lease_token"])
    assert (None, token) == actual


def test_lease_job_of_a_job_leased_past_its_expiry_leases_nothing(db: Database) -> None:
    """An expired lease is the rescuer's to free, not a second leaser's to take over."""
    job_id = add_batch_job(db.engine)
    lease(db.engine, job_id, expires_in=-5)
    assert None is _leased_id(db, job_id)


def test_lease_job_twice_leases_once(db: Database) -> None:
    """The second of two leases in turn finds the job leased by the first."""
    job_id = add_batch_job(db.engine)
    assert (job_id, None) == (_leased_id(db, job_id), _leased_id(db, job_id))


def test_lease_job_of_a_job_not_yet_due_leases_nothing(db: Database) -> None:
    """A job scheduled in the future waits for its time."""
    job_id = add_batch_job(db.engine, due_in=60)
    assert None is _leased_id(db, job_id)


def test_lease_job_of_a_job_gone_leases_nothing(db: Database) -> None:
    """A finished job (deleted) is found by nobody."""
    job_id = add_batch_job(db.engine)
    token = lease(db.engine, job_id)
    db.run(lambda conn: queries.delete_job(conn, job_id, token))
    assert None is _leased_id(db, job_id)


def test_lease_job_of_a_refused_job_leases_nothing(db: Database) -> None:
    """A job held as refused runs nowhere until it is released."""
    job_id = add_batch_job(db.engine)
    refuse(db.engine, job_id)
    assert None is _leased_id(db, job_id)


def test_lease_job_of_a_paused_handler_leases_nothing(db: Database) -> None:
    """No job of a paused handler is leased, by id no more than by acquisition."""
    job_id = add_batch_job(db.engine)
    db.run(
        lambda conn: queries.pause_handler(
            conn, db.dialect, HANDLER, seconds=None, cause="operator", reason="test"
        )
    )
    assert None is _leased_id(db, job_id)


def test_lease_job_of_a_handler_not_named_leases_nothing(db: Database) -> None:
    """A job of a handler the caller does not serve stays for those that do."""
    job_id = add_batch_job(db.engine, handler=OTHER_HANDLER)
    assert None is db.run(lambda conn: _lease_job(conn, db, job_id, handlers=[HANDLER]))


def test_lease_job_of_a_handler_named_leases_the_job(db: Database) -> None:
    """A job of one of the handlers named is leased."""
    job_id = add_batch_job(db.engine)
    job = db.run(lambda conn: _lease_job(conn, db, job_id, handlers=[OTHER_HANDLER, HANDLER]))
    assert job_id == (job and job.id)


def test_lease_job_under_a_cap_with_room_leases_the_batch_job(db: Database) -> None:
    """One group running and a cap of two: the job is leased."""
    lease(db.engine, add_batch_job(db.engine))
    job_id = add_batch_job(db.engine)
    assert job_id == _leased_id(db, job_id, caps={HANDLER: 2})


def test_lease_job_under_a_cap_reached_leases_nothing(db: Database) -> None:
    """A handler at its cap gets no batch job more."""
    lease(db.engine, add_batch_job(db.engine))
    job_id = add_batch_job(db.engine)
    assert None is _leased_id(db, job_id, caps={HANDLER: 1})


def test_lease_job_under_a_cap_leases_a_claim_job(db: Database) -> None:
    """The cap counts groups in flight: a claim job is leased however many run."""
    lease(db.engine, add_batch_job(db.engine))
    job_id = add_claim_job(db.engine, 0)
    assert job_id == _leased_id(db, job_id, caps={HANDLER: 1})


def test_lease_job_under_another_handlers_cap_leases_the_batch_job(db: Database) -> None:
    """Only the job's own handler's cap counts."""
    lease(db.engine, add_batch_job(db.engine, handler=OTHER_HANDLER))
    job_id = add_batch_job(db.engine)
    assert job_id == _leased_id(db, job_id, caps={OTHER_HANDLER: 1})


def test_concurrent_leases_of_one_job_lease_it_once_without_waiting(
    row_locks: Database,
) -> None:
    """While the first session's transaction is open, a second session's lease of the same job
    skips it at once (a wait fails on the short lock timeout) and gets nothing."""
    db = row_locks
    job_id = add_batch_job(db.engine)
    with db.engine.connect() as first, db.other_engine().connect() as second:
        taken_first = _lease_job(first, db, job_id)
        taken_second = _lease_job(second, db, job_id)
        second.commit()
        first.commit()
    assert (job_id, None) == (taken_first and taken_first.id, taken_second)


def test_concurrent_capped_leases_respect_the_cap(row_locks: Database) -> None:
    """A second session's capped lease waits for the first one's open transaction, then counts
    its lease: the cap holds across executors."""
    db = row_locks
    one, two = add_batch_job(db.engine), add_batch_job(db.engine)
    second = db.other_engine(EXPECTED_LOCK_WAIT_SECONDS)
    with db.engine.connect() as first:
        taken_first = _lease_job(first, db, one, caps={HANDLER: 1})

        def lease_again() -> queries.JobRow | None:
            with second.begin() as conn:
                return _lease_job(conn, db, two, caps={HANDLER: 1})

        taken_second = db.in_thread(lease_again)
        db.wait_for_lock_waiter()
        first.commit()
    actual = (taken_first and taken_first.id, taken_second.result(THREAD_SECONDS))
    assert (one, None) == actual


def test_a_second_lease_waits_for_the_write_lock(single_writer: Database) -> None:
    """With one write lock, a second session cannot begin leasing while the first is open."""
    db = single_writer
    job_id = add_batch_job(db.engine)
    second = db.other_engine(lock_wait=0.1)
    with db.engine.connect() as first:
        _lease_job(first, db, job_id)
        with pytest.raises(OperationalError, match="database is locked"), second.begin() as conn:
            _lease_job(conn, db, job_id)
        first.commit()
