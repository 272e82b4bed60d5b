"""outbox_jobs: leasing due jobs to a worker, uncapped and under a fleet-wide cap.

Acquisition takes the most urgent due jobs (priority, then due time, then id) with no lease,
stamps them with the worker's lease and counts the attempt. Two sessions acquiring at once
take disjoint jobs: PostgreSQL and MariaDB skip the rows the other holds locked, without
waiting; SQLite lets one writer in at a time. A capped acquisition never leases more than the
cap of a handler's batch jobs, also when a second session runs the same acquisition at once.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from outbox import schema
from outbox._db import queries
from tests.conformance._database import (
    EXPECTED_LOCK_WAIT_SECONDS,
    THREAD_SECONDS,
    Database,
)
from tests.conformance._factories import (
    HANDLER,
    OTHER_HANDLER,
    WORKER,
    add_batch_job,
    add_batch_jobs_due_together,
    add_claim_job,
    existing_job,
    lease,
    refuse,
)

LEASE = 30.0


def _acquire(
    conn: Connection,
    db: Database,
    limit: int = 10,
    *,
    handlers: tuple[str, ...] = (HANDLER,),
    token: uuid.UUID | None = None,
    **options: Any,
) -> list[queries.JobRow]:
    return queries.acquire_jobs(
        conn,
        db.dialect,
        handlers=list(handlers),
        worker_id=WORKER,
        token=token or uuid.uuid4(),
        limit=limit,
        lease_seconds=LEASE,
        **options,
    )


def _acquire_ids(db: Database, limit: int = 10, **options: Any) -> list[int]:
    return [job.id for job in db.run(lambda conn: _acquire(conn, db, limit, **options))]


def _acquire_capped(conn: Connection, db: Database, cap: int, limit: int = 10) -> list[int]:
    jobs = queries.acquire_capped_batch_jobs(
        conn,
        db.dialect,
        handler=HANDLER,
        cap=cap,
        worker_id=WORKER,
        token=uuid.uuid4(),
        limit=limit,
        lease_seconds=LEASE,
    )
    return [job.id for job in jobs]


def test_acquire_jobs_leases_a_due_job_to_the_worker(db: Database) -> None:
    """The job gets the worker as owner, the token, a lease of the given seconds, and its
    attempt counted."""
    job_id = add_batch_job(db.engine, attempts=1)
    token = uuid.uuid4()
    db.run(lambda conn: _acquire(conn, db, token=token))
    row = existing_job(db.engine, job_id)
    expires_in = db.seconds_from_now(row["lease_expires_at"])
    actual = (row["lease_owner"], row["lease_token"], row["attempts"], LEASE - 5 < expires_in)
    assert (WORKER, token, 2, True) == actual


def test_acquire_jobs_returns_the_jobs_as_leased(db: Database) -> None:
    """What acquisition returns is the job as the table now holds it."""
    group_id = uuid.uuid4()
    job_id = add_batch_job(db.engine, group_id=group_id, priority=4, last_error="before")
    token = uuid.uuid4()
    jobs = db.run(lambda conn: _acquire(conn, db, token=token))
    expected = [
        queries.JobRow(
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
    ]
    assert expected == jobs


def test_acquire_jobs_takes_the_most_urgent_priority_first(db: Database) -> None:
    """A lower priority number wins over a longer wait."""
    add_batch_job(db.engine, priority=1, due_in=-60)
    urgent = add_batch_job(db.engine, priority=0, due_in=-1)
    assert [urgent] == _acquire_ids(db, limit=1)


def test_acquire_jobs_takes_the_longest_due_first_within_a_priority(db: Database) -> None:
    """Within a priority, the job due earliest goes first, whatever its id."""
    add_batch_job(db.engine, due_in=-1)
    longest_due = add_batch_job(db.engine, due_in=-60)
    assert [longest_due] == _acquire_ids(db, limit=1)


def test_acquire_jobs_takes_the_lowest_id_among_jobs_due_together(db: Database) -> None:
    """Jobs of one priority due at the same moment go in the order they were written."""
    first, *_ = add_batch_jobs_due_together(db.engine, 3)
    assert [first] == _acquire_ids(db, limit=1)


def test_acquire_jobs_skips_jobs_not_yet_due(db: Database) -> None:
    """A job scheduled in the future waits for its time."""
    add_batch_job(db.engine, due_in=60)
    due = add_batch_job(db.engine, due_in=-1)
    assert [due] == _acquire_ids(db)


def test_acquire_jobs_skips_leased_jobs(db: Database) -> None:
    """A job leased to a worker, even past its expiry, is not leased again (rescue frees it)."""
    lease(db.engine, add_batch_job(db.engine))
    lease(db.engine, add_batch_job(db.engine), expires_in=-5)
    free = add_batch_job(db.engine)
    assert [free] == _acquire_ids(db)


def test_acquire_jobs_skips_refused_jobs(db: Database) -> None:
    """A job held as refused runs nowhere until it is released."""
    refuse(db.engine, add_batch_job(db.engine))
    free = add_batch_job(db.engine)
    assert [free] == _acquire_ids(db)


def test_acquire_jobs_takes_at_most_the_limit(db: Database) -> None:
    """No more jobs than the limit are leased, the most urgent ones."""
    ids = add_batch_jobs_due_together(db.engine, 5)
    assert ids[:2] == _acquire_ids(db, limit=2)


def test_acquire_jobs_takes_only_the_handlers_named(db: Database) -> None:
    """Jobs of handlers the worker does not serve stay."""
    add_batch_job(db.engine, handler=OTHER_HANDLER)
    mine = add_batch_job(db.engine)
    assert [mine] == _acquire_ids(db)


def test_acquire_jobs_of_one_kind_takes_only_that_kind(db: Database) -> None:
    """Asked for batch jobs, acquisition leaves claim jobs."""
    add_claim_job(db.engine, 0)
    batch = add_batch_job(db.engine)
    assert [batch] == _acquire_ids(db, kind=schema.JobKind.BATCH)


def test_acquire_jobs_with_batch_handlers_takes_their_batch_jobs_and_every_claim_job(
    db: Database,
) -> None:
    """``batch_handlers`` limits batch jobs to those handlers; claim jobs of every handler
    named are taken."""
    claims = [add_claim_job(db.engine, 0), add_claim_job(db.engine, 0, handler=OTHER_HANDLER)]
    batch = add_batch_job(db.engine)
    add_batch_job(db.engine, handler=OTHER_HANDLER)
    acquired = _acquire_ids(db, handlers=(HANDLER, OTHER_HANDLER), batch_handlers=[HANDLER])
    assert sorted([*claims, batch]) == sorted(acquired)


def test_acquire_jobs_finds_nothing_when_nothing_is_due(db: Database) -> None:
    """An empty job table leases nothing."""
    assert [] == _acquire_ids(db)


def test_acquisitions_in_turn_take_disjoint_jobs(db: Database) -> None:
    """A second acquisition after the first committed takes the jobs the first left."""
    ids = add_batch_jobs_due_together(db.engine, 4)
    first, second = _acquire_ids(db, limit=2), _acquire_ids(db, limit=10)
    assert (ids[:2], ids[2:]) == (first, second)


def test_concurrent_acquisitions_take_disjoint_jobs_without_waiting(row_locks: Database) -> None:
    """While the first acquisition's transaction is open, a second session's acquisition
    skips the jobs the first holds, without waiting (a wait fails on the short lock timeout)."""
    db = row_locks
    add_batch_jobs_due_together(db.engine, 4)
    first, second = _acquire_concurrently(db)
    assert (2, set()) == (len(first), set(first) & set(second))


def test_a_concurrent_acquisition_takes_the_jobs_the_first_left(row_locks: Database) -> None:
    """While the first acquisition's transaction is open, a second session leases the due jobs
    the first did not take: workers acquire side by side."""
    db = row_locks
    ids = add_batch_jobs_due_together(db.engine, 4)
    assert (ids[:2], ids[2:]) == _acquire_concurrently(db)


def _acquire_concurrently(db: Database) -> tuple[list[int], list[int]]:
    """Acquire two jobs in one session and, while its transaction is open, up to ten in
    another; both commit."""
    with db.engine.connect() as first, db.other_engine().connect() as second:
        taken_first = [job.id for job in _acquire(first, db, limit=2)]
        taken_second = [job.id for job in _acquire(second, db, limit=10)]
        second.commit()
        first.commit()
    return taken_first, taken_second


def test_a_second_acquisition_waits_for_the_write_lock(single_writer: Database) -> None:
    """With one write lock, a second session cannot begin acquiring while the first is open."""
    db = single_writer
    add_batch_jobs_due_together(db.engine, 2)
    second = db.other_engine(lock_wait=0.1)
    with db.engine.connect() as first:
        _acquire(first, db, limit=1)
        with pytest.raises(OperationalError, match="database is locked"), second.begin() as conn:
            _acquire(conn, db)
        first.commit()


def test_acquire_capped_leases_no_more_than_the_cap(db: Database) -> None:
    """With one group running and a cap of two, one more is leased, whatever the limit."""
    lease(db.engine, add_batch_job(db.engine))
    waiting = add_batch_jobs_due_together(db.engine, 3)
    assert waiting[:1] == db.run(lambda conn: _acquire_capped(conn, db, cap=2, limit=10))


def test_acquire_capped_with_the_cap_reached_leases_nothing(db: Database) -> None:
    """A handler at its cap gets nothing more."""
    lease(db.engine, add_batch_job(db.engine))
    add_batch_job(db.engine)
    assert [] == db.run(lambda conn: _acquire_capped(conn, db, cap=1))


def test_acquire_capped_leases_at_most_the_limit(db: Database) -> None:
    """Room under the cap is filled no further than the limit."""
    waiting = add_batch_jobs_due_together(db.engine, 3)
    assert waiting[:1] == db.run(lambda conn: _acquire_capped(conn, db, cap=5, limit=1))


def test_acquire_capped_does_not_count_refused_jobs(db: Database) -> None:
    """A group held as refused runs nowhere, so it takes no room under the cap."""
    held = add_batch_job(db.engine)
    token = lease(db.engine, held)
    db.run(lambda conn: queries.hold_refused_job(conn, held, token, "refused for good"))
    waiting = add_batch_job(db.engine)
    assert [waiting] == db.run(lambda conn: _acquire_capped(conn, db, cap=1))


def test_acquire_capped_counts_an_expired_lease_not_yet_rescued(db: Database) -> None:
    """A lease past its expiry still counts until rescue frees it: its worker may be running."""
    lease(db.engine, add_batch_job(db.engine), expires_in=-5)
    add_batch_job(db.engine)
    assert [] == db.run(lambda conn: _acquire_capped(conn, db, cap=1))


def test_acquire_capped_takes_only_the_handlers_batch_jobs(db: Database) -> None:
    """Claim jobs and other handlers' batch jobs are neither leased nor counted."""
    add_claim_job(db.engine, 0)
    lease(db.engine, add_batch_job(db.engine, handler=OTHER_HANDLER))
    add_batch_job(db.engine, handler=OTHER_HANDLER)
    mine = add_batch_job(db.engine)
    assert [mine] == db.run(lambda conn: _acquire_capped(conn, db, cap=1))


def test_capped_acquisitions_in_turn_respect_the_cap(db: Database) -> None:
    """A second capped acquisition after the first committed counts the first one's lease."""
    waiting = add_batch_jobs_due_together(db.engine, 3)
    first = db.run(lambda conn: _acquire_capped(conn, db, cap=1))
    second = db.run(lambda conn: _acquire_capped(conn, db, cap=1))
    assert (waiting[:1], []) == (first, second)


def test_concurrent_capped_acquisitions_respect_the_cap(row_locks: Database) -> None:
    """A second session's capped acquisition waits for the first one's open transaction, then
    counts its lease: the cap holds across the fleet."""
    db = row_locks
    waiting = add_batch_jobs_due_together(db.engine, 3)
    second = db.other_engine(EXPECTED_LOCK_WAIT_SECONDS)
    with db.engine.connect() as first:
        taken_first = _acquire_capped(first, db, cap=1)

        def acquire_again() -> list[int]:
            with second.begin() as conn:
                return _acquire_capped(conn, db, cap=1)

        taken_second = db.in_thread(acquire_again)
        db.wait_for_lock_waiter()
        first.commit()
    assert (waiting[:1], []) == (taken_first, taken_second.result(THREAD_SECONDS))
