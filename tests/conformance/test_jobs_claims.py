"""outbox_jobs: enqueueing claim jobs in slots and batch jobs per group.

Claim jobs live in numbered slots under a unique index, so that overlapping distributors never
enqueue a slot twice, also when they insert it at the same moment from two sessions. Batch jobs
are one per group.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from outbox import schema
from outbox._db import queries
from tests.conformance._database import EXPECTED_LOCK_WAIT_SECONDS, THREAD_SECONDS, Database
from tests.conformance._factories import (
    HANDLER,
    OTHER_HANDLER,
    WORKER,
    add_batch_job,
    add_claim_job,
    claim_slots,
    existing_job,
    job_ids,
    lease,
)


def _insert_slots(db: Database, slots: list[int], handler: str = HANDLER) -> int:
    return db.run(lambda conn: queries.insert_claim_jobs(conn, db.dialect, handler, slots, 3))


def test_insert_claim_jobs_enqueues_one_job_per_slot(db: Database) -> None:
    """Each slot given becomes one claim job of the handler; the count says how many."""
    inserted = _insert_slots(db, [0, 1, 2])
    assert (3, [0, 1, 2]) == (inserted, claim_slots(db.engine))


def test_insert_claim_jobs_writes_waiting_claim_jobs(db: Database) -> None:
    """A new claim job is due now, with the priority given, never attempted, not leased."""
    _insert_slots(db, [0])
    row = existing_job(db.engine, job_ids(db.engine)[0])
    due_in = db.seconds_from_now(row["run_at"])
    expected = (schema.JobKind.CLAIM, HANDLER, 3, 0, None, None, None, True)
    actual = (
        row["kind"],
        row["handler"],
        row["priority"],
        row["attempts"],
        row["group_id"],
        row["lease_token"],
        row["lease_expires_at"],
        -5 < due_in <= 0,
    )
    assert expected == actual


def test_insert_claim_jobs_skips_a_slot_already_taken(db: Database) -> None:
    """A slot that already has a claim job is skipped, not duplicated, and not counted."""
    add_claim_job(db.engine, 1)
    inserted = _insert_slots(db, [0, 1, 2])
    assert (2, [0, 1, 2]) == (inserted, claim_slots(db.engine))


def test_insert_claim_jobs_skips_a_slot_taken_by_a_leased_claim_job(db: Database) -> None:
    """A slot stays taken while its claim job runs."""
    lease(db.engine, add_claim_job(db.engine, 0))
    inserted = _insert_slots(db, [0])
    assert (0, [0]) == (inserted, claim_slots(db.engine))


def test_insert_claim_jobs_of_no_slots_enqueues_nothing(db: Database) -> None:
    """No slots, no statement and no job."""
    assert (0, []) == (_insert_slots(db, []), job_ids(db.engine))


def test_slots_belong_to_one_handler(db: Database) -> None:
    """The same slot number is free for another handler."""
    add_claim_job(db.engine, 0)
    inserted = _insert_slots(db, [0], handler=OTHER_HANDLER)
    assert (1, [0], [0]) == (
        inserted,
        claim_slots(db.engine),
        claim_slots(db.engine, OTHER_HANDLER),
    )


def test_concurrent_inserts_of_a_slot_enqueue_it_once(row_locks: Database) -> None:
    """A second session inserting a slot the first has inserted but not committed waits for
    it, then skips the slot: one claim job per slot, and each session counts its own."""
    db = row_locks
    second = db.other_engine(EXPECTED_LOCK_WAIT_SECONDS)
    with db.engine.connect() as first:
        queries.insert_claim_jobs(first, db.dialect, HANDLER, [0, 1], 0)

        def insert_again() -> int:
            with second.begin() as conn:
                return queries.insert_claim_jobs(conn, db.dialect, HANDLER, [0, 1, 2], 0)

        inserted = db.in_thread(insert_again)
        db.wait_for_lock_waiter()
        first.commit()
    assert (1, [0, 1, 2]) == (inserted.result(THREAD_SECONDS), claim_slots(db.engine))


def test_a_slot_whose_first_insert_rolls_back_is_enqueued_by_the_second(
    row_locks: Database,
) -> None:
    """When the session that inserted a slot first rolls back, the waiting one enqueues it."""
    db = row_locks
    second = db.other_engine(EXPECTED_LOCK_WAIT_SECONDS)
    with db.engine.connect() as first:
        queries.insert_claim_jobs(first, db.dialect, HANDLER, [0], 0)

        def insert_again() -> int:
            with second.begin() as conn:
                return queries.insert_claim_jobs(conn, db.dialect, HANDLER, [0], 0)

        inserted = db.in_thread(insert_again)
        db.wait_for_lock_waiter()
        first.rollback()
    assert (1, [0]) == (inserted.result(THREAD_SECONDS), claim_slots(db.engine))


def test_a_second_distribution_waits_for_the_write_lock(single_writer: Database) -> None:
    """With one write lock, a second session cannot even begin while the first inserts slots:
    it waits for the lock (here: gives up after a short busy timeout)."""
    db = single_writer
    second = db.other_engine(lock_wait=0.1)
    with db.engine.connect() as first:
        queries.insert_claim_jobs(first, db.dialect, HANDLER, [0], 0)
        with pytest.raises(OperationalError, match="database is locked"), second.begin() as conn:
            queries.insert_claim_jobs(conn, db.dialect, HANDLER, [0], 0)
        first.commit()
    assert [0] == claim_slots(db.engine)


def test_claim_job_slots_are_those_of_pending_and_running_claim_jobs(db: Database) -> None:
    """The slots taken: claim jobs waiting or leased, of this handler only."""
    add_claim_job(db.engine, 0)
    lease(db.engine, add_claim_job(db.engine, 2))
    add_claim_job(db.engine, 1, handler=OTHER_HANDLER)
    add_batch_job(db.engine)
    assert {0, 2} == db.run(lambda conn: queries.claim_job_slots(conn, HANDLER))


def test_delete_pending_claim_jobs_keeps_leased_ones(db: Database) -> None:
    """Only the handler's claim jobs waiting to run are deleted; a leased one is its worker's."""
    add_claim_job(db.engine, 0)
    leased = add_claim_job(db.engine, 1)
    lease(db.engine, leased)
    others = [add_claim_job(db.engine, 0, handler=OTHER_HANDLER), add_batch_job(db.engine)]
    deleted = db.run(lambda conn: queries.delete_pending_claim_jobs(conn, HANDLER))
    assert (1, sorted([leased, *others])) == (deleted, job_ids(db.engine))


def test_insert_batch_job_enqueues_a_due_job_for_the_group(db: Database) -> None:
    """A new batch job handles its group, is due now, and is neither attempted nor leased."""
    group_id = uuid.uuid4()
    job_id = db.run(
        lambda conn: queries.insert_batch_job(conn, handler=HANDLER, group_id=group_id, priority=2)
    )
    row = existing_job(db.engine, job_id)
    expected = (schema.JobKind.BATCH, HANDLER, None, group_id, 2, 0, None, None, True)
    actual = (
        row["kind"],
        row["handler"],
        row["slot"],
        row["group_id"],
        row["priority"],
        row["attempts"],
        row["lease_token"],
        row["last_error"],
        -5 < db.seconds_from_now(row["run_at"]) <= 0,
    )
    assert expected == actual


def test_insert_batch_job_with_a_lease_counts_its_first_attempt(db: Database) -> None:
    """A batch job created leased belongs to the claiming worker, its attempt counted."""
    token = uuid.uuid4()
    job_id = db.run(
        lambda conn: queries.insert_batch_job(
            conn, handler=HANDLER, group_id=uuid.uuid4(), priority=0, lease=(WORKER, token, 30.0)
        )
    )
    row = existing_job(db.engine, job_id)
    expires_in = db.seconds_from_now(row["lease_expires_at"])
    actual = (row["lease_owner"], row["lease_token"], row["attempts"], 25 < expires_in <= 30)
    assert (WORKER, token, 1, True) == actual


def test_insert_batch_job_with_a_delay_is_due_later(db: Database) -> None:
    """A group split off for a retry keeps its attempts and error, and is due after the delay."""
    job_id = db.run(
        lambda conn: queries.insert_batch_job(
            conn,
            handler=HANDLER,
            group_id=uuid.uuid4(),
            priority=0,
            attempts=2,
            delay_seconds=60.0,
            error="try again",
        )
    )
    row = existing_job(db.engine, job_id)
    due_in = db.seconds_from_now(row["run_at"])
    assert (2, "try again", True) == (row["attempts"], row["last_error"], 55 < due_in <= 60)


def test_a_group_has_one_batch_job(db: Database) -> None:
    """A second batch job for the same group is refused by the unique index."""
    group_id = uuid.uuid4()
    add_batch_job(db.engine, group_id=group_id)
    with pytest.raises(IntegrityError):
        db.run(
            lambda conn: queries.insert_batch_job(
                conn, handler=HANDLER, group_id=group_id, priority=0
            )
        )


def test_batch_job_of_group_is_the_groups_job(db: Database) -> None:
    """A group's batch job is found by the group's id."""
    group_id = uuid.uuid4()
    job_id = add_batch_job(db.engine, group_id=group_id)
    add_batch_job(db.engine)
    assert job_id == db.run(lambda conn: queries.batch_job_of_group(conn, group_id))


def test_batch_job_of_a_group_without_one_is_none(db: Database) -> None:
    """A group with no batch job has none to find."""
    add_batch_job(db.engine)
    assert None is db.run(lambda conn: queries.batch_job_of_group(conn, uuid.uuid4()))
