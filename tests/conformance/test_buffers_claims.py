"""Buffer tables: counting what waits, and claiming it into groups.

A claim stamps a fresh group id on up to ``limit`` unclaimed rows, oldest first. Two sessions
claiming at once get disjoint rows without waiting on PostgreSQL and MariaDB (SKIP LOCKED), and
rows of an application transaction not yet committed are neither claimed nor waited for; on
SQLite one writer holds the database at a time. Where the database returns rows from an UPDATE,
the claim hands back the claimed rows itself; on PostgreSQL a claim job's whole claim (its
lease as the fence, the rows, the group's batch job, whether more rows wait) is one statement.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import Connection, insert
from sqlalchemy.exc import OperationalError

from outbox import schema
from outbox._db import queries
from tests.conformance._database import Database
from tests.conformance._factories import (
    ACTIVITY,
    HANDLER,
    TYPED,
    WORKER,
    add_claim_job,
    add_events,
    add_typed_events,
    existing_job,
    group_ids,
    job_ids,
    lease,
    typed_rows,
    unclaimed_ids,
)

BATCH = 3


def _claim(conn: Connection, db: Database, limit: int = BATCH) -> tuple[uuid.UUID, int]:
    group_id = uuid.uuid4()
    return group_id, queries.claim_rows(conn, db.dialect, ACTIVITY, group_id, limit)


def _claimed_ids(db: Database, limit: int = BATCH) -> list[int]:
    group_id, _ = db.run(lambda conn: _claim(conn, db, limit))
    return group_ids(db.engine, group_id)


def test_count_unclaimed_counts_the_rows_no_group_has_claimed(db: Database) -> None:
    """Claimed rows are not counted."""
    add_events(db.engine, 3)
    add_events(db.engine, 2, group_id=uuid.uuid4())
    assert 3 == db.run(lambda conn: queries.count_unclaimed(conn, ACTIVITY, 10))


def test_count_unclaimed_stops_at_the_cap(db: Database) -> None:
    """A capped count counts no further than the cap."""
    add_events(db.engine, 5)
    assert 3 == db.run(lambda conn: queries.count_unclaimed(conn, ACTIVITY, 3))


def test_any_unclaimed_sees_a_waiting_row(db: Database) -> None:
    """One unclaimed row among claimed ones is found."""
    add_events(db.engine, 2, group_id=uuid.uuid4())
    add_events(db.engine, 1)
    assert True is db.run(lambda conn: queries.any_unclaimed(conn, ACTIVITY))


def test_any_unclaimed_is_false_when_every_row_is_claimed(db: Database) -> None:
    """Claimed rows do not wait."""
    add_events(db.engine, 2, group_id=uuid.uuid4())
    assert False is db.run(lambda conn: queries.any_unclaimed(conn, ACTIVITY))


def test_oldest_unclaimed_age_is_none_when_nothing_waits(db: Database) -> None:
    """With only claimed rows, no row waits and there is no age."""
    add_events(db.engine, 1, group_id=uuid.uuid4(), age=60.0)
    assert None is db.run(lambda conn: queries.oldest_unclaimed_age(conn, ACTIVITY))


def test_oldest_unclaimed_age_is_the_seconds_the_oldest_waiting_row_has_waited(
    db: Database,
) -> None:
    """The age of the oldest unclaimed row, on the database clock; older claimed rows do
    not count."""
    add_events(db.engine, 1, group_id=uuid.uuid4(), age=100.0)
    add_events(db.engine, 1, age=30.0)
    add_events(db.engine, 1)
    age = db.run(lambda conn: queries.oldest_unclaimed_age(conn, ACTIVITY))
    assert True is (age is not None and 30.0 <= age < 35.0)


def test_claim_rows_claims_the_oldest_rows_up_to_the_limit(db: Database) -> None:
    """The first rows by id are stamped with the group; the count says how many."""
    ids = add_events(db.engine, 5)
    group_id, claimed = db.run(lambda conn: _claim(conn, db))
    assert (BATCH, ids[:BATCH]) == (claimed, group_ids(db.engine, group_id))


def test_claim_rows_leaves_claimed_rows(db: Database) -> None:
    """Rows of another group are not claimed again."""
    add_events(db.engine, 2, group_id=uuid.uuid4())
    unclaimed = add_events(db.engine, 2)
    assert unclaimed == _claimed_ids(db)


def test_claim_rows_of_an_empty_buffer_claims_nothing(db: Database) -> None:
    """Nothing waits, nothing is claimed."""
    assert 0 == db.run(lambda conn: _claim(conn, db))[1]


def test_claims_in_turn_take_disjoint_rows(db: Database) -> None:
    """A second claim after the first committed takes the next rows."""
    ids = add_events(db.engine, 5)
    assert (ids[:BATCH], ids[BATCH:]) == (_claimed_ids(db), _claimed_ids(db))


def test_concurrent_claims_take_disjoint_rows_without_waiting(row_locks: Database) -> None:
    """While the first claim's transaction is open, a second session claims the next rows at
    once (a wait fails on the short lock timeout)."""
    db = row_locks
    ids = add_events(db.engine, 5)
    with db.engine.connect() as first, db.other_engine().connect() as second:
        first_group, _ = _claim(first, db)
        second_group, _ = _claim(second, db)
        second.commit()
        first.commit()
    claimed = (group_ids(db.engine, first_group), group_ids(db.engine, second_group))
    assert (ids[:BATCH], ids[BATCH:]) == claimed


def test_a_claim_leaves_rows_of_an_uncommitted_insert(row_locks: Database) -> None:
    """Rows an application transaction has written but not committed are neither claimed nor
    waited for; once committed, they wait to be claimed."""
    db = row_locks
    committed = add_events(db.engine, 2)
    with db.application_engine().connect() as application:
        application.execute(insert(ACTIVITY), [{"activity_id": n} for n in range(2)])
        claimed = _claimed_ids(db, limit=10)
        application.commit()
    assert (committed, 2) == (claimed, len(unclaimed_ids(db.engine)))


def test_a_claim_waits_for_the_applications_write_lock(single_writer: Database) -> None:
    """With one write lock, a claim cannot begin while an application transaction writes
    events: it waits for the lock (here: gives up after a short busy timeout)."""
    db = single_writer
    add_events(db.engine, 2)
    claimer = db.other_engine(lock_wait=0.1)
    with db.application_engine().connect() as application:
        application.execute(insert(ACTIVITY).values(activity_id=1))
        with pytest.raises(OperationalError, match="database is locked"), claimer.begin() as conn:
            _claim(conn, db)
        application.commit()
    assert 3 == len(unclaimed_ids(db.engine))


def _claim_returning(conn: Connection, db: Database, table: Any, limit: int) -> list[Any]:
    return queries.claim_rows_returning(conn, db.dialect, table, uuid.uuid4(), limit)


def test_claim_rows_returning_gives_back_the_claimed_rows_by_id(db: Database) -> None:
    """A claim returns the rows it stamped: the oldest, up to the limit, by id, with every
    column of the buffer, as a SELECT of the group gives them."""
    ids = add_events(db.engine, 5)
    rows = db.run(lambda conn: _claim_returning(conn, db, ACTIVITY, BATCH))
    group_id = rows[0].group_id
    expected = db.run(lambda conn: queries.select_group_rows(conn, ACTIVITY, group_id))
    assert (ids[:BATCH], expected) == ([row.id for row in expected], rows)


def test_claimed_rows_are_read_as_a_select_reads_them(typed_buffer: Database) -> None:
    """Every value a claim returns has the type and value a SELECT of the same row gives
    (a whole number in a floating-point column is a float)."""
    db = typed_buffer
    add_typed_events(db.engine, 2)
    returned = db.run(lambda conn: _claim_returning(conn, db, TYPED, 10))
    selected = typed_rows(db.engine)

    def typed(rows: list[dict[str, Any]]) -> list[list[tuple[str, type, Any]]]:
        return [[(name, type(value), value) for name, value in row.items()] for row in rows]

    returned_rows = sorted((dict(row._mapping) for row in returned), key=lambda row: row["id"])
    assert typed(selected) == typed(returned_rows)


# --- PostgreSQL: a claim job's claim in one statement ------------------------------------------


def _requires_one_statement_claim(db: Database) -> None:
    if not db.supports.one_statement_claim:
        pytest.skip(f"{db.dialect} claims in several statements")


def _claim_with_job(
    conn: Connection,
    *,
    limit: int = BATCH,
    held: tuple[int, uuid.UUID, float] | None = None,
    token: uuid.UUID | None = None,
) -> tuple[uuid.UUID, queries.LeasedClaim]:
    group_id = uuid.uuid4()
    claimed = queries.claim_group_with_job(
        conn,
        ACTIVITY,
        group_id=group_id,
        limit=limit,
        held=held,
        handler=HANDLER,
        priority=2,
        lease=(WORKER, token or uuid.uuid4(), 30.0),
    )
    return group_id, claimed


def test_claim_group_with_job_returns_the_oldest_rows_by_id(db: Database) -> None:
    """The rows claimed are the oldest, up to the limit, as a SELECT of the group gives them."""
    _requires_one_statement_claim(db)
    ids = add_events(db.engine, 5)
    group_id, claimed = db.run(lambda conn: _claim_with_job(conn))
    selected = db.run(lambda conn: queries.select_group_rows(conn, ACTIVITY, group_id))
    assert (ids[:BATCH], selected) == ([row.id for row in claimed.rows], claimed.rows)


def test_claim_group_with_job_leases_the_groups_batch_job_to_the_claimer(db: Database) -> None:
    """The group's batch job is created leased to the claiming worker, its first attempt
    counted."""
    _requires_one_statement_claim(db)
    add_events(db.engine, 2)
    token = uuid.uuid4()
    group_id, claimed = db.run(lambda conn: _claim_with_job(conn, token=token))
    row = existing_job(db.engine, claimed.job_id or 0)
    expires_in = db.seconds_from_now(row["lease_expires_at"])
    expected = (schema.JobKind.BATCH, HANDLER, group_id, 2, WORKER, token, 1, True)
    actual = (
        row["kind"],
        row["handler"],
        row["group_id"],
        row["priority"],
        row["lease_owner"],
        row["lease_token"],
        row["attempts"],
        25 < expires_in <= 30,
    )
    assert expected == actual


def test_claim_group_with_job_says_more_rows_wait(db: Database) -> None:
    """A full batch with rows left after it says so."""
    _requires_one_statement_claim(db)
    add_events(db.engine, BATCH + 1)
    assert True is db.run(lambda conn: _claim_with_job(conn))[1].more


def test_claim_group_with_job_says_no_more_when_drained(db: Database) -> None:
    """A claim that took the last rows says nothing more waits."""
    _requires_one_statement_claim(db)
    add_events(db.engine, BATCH)
    assert False is db.run(lambda conn: _claim_with_job(conn))[1].more


def test_claim_group_with_job_of_an_empty_buffer_creates_no_job(db: Database) -> None:
    """Nothing claimed: no rows, no batch job."""
    _requires_one_statement_claim(db)
    claimed = db.run(lambda conn: _claim_with_job(conn))[1]
    assert (queries.LeasedClaim([], None, False), []) == (claimed, job_ids(db.engine))


def test_claim_group_with_job_extends_the_held_claim_jobs_lease(db: Database) -> None:
    """The claim job the claim runs for gets its lease pushed back: the fence held."""
    _requires_one_statement_claim(db)
    add_events(db.engine, 2)
    claim_job = add_claim_job(db.engine, 0)
    token = lease(db.engine, claim_job, expires_in=5.0)
    db.run(lambda conn: _claim_with_job(conn, held=(claim_job, token, 60.0)))
    expires_in = db.seconds_from_now(existing_job(db.engine, claim_job)["lease_expires_at"])
    assert True is (55 < expires_in <= 60)


def test_claim_group_with_job_of_a_lost_claim_job_claims_nothing(db: Database) -> None:
    """When the claim job's lease is no longer ours, no row is claimed and no job made."""
    _requires_one_statement_claim(db)
    ids = add_events(db.engine, 2)
    claim_job = add_claim_job(db.engine, 0)
    lease(db.engine, claim_job)
    claimed = db.run(lambda conn: _claim_with_job(conn, held=(claim_job, uuid.uuid4(), 60.0)))[1]
    assert (queries.LeasedClaim([], None, False), ids, [claim_job]) == (
        claimed,
        unclaimed_ids(db.engine),
        job_ids(db.engine),
    )


def test_concurrent_claims_with_jobs_take_disjoint_rows(db: Database) -> None:
    """While one claim's transaction is open, a second session's claim takes the next rows at
    once."""
    _requires_one_statement_claim(db)
    ids = add_events(db.engine, 5)
    with db.engine.connect() as first, db.other_engine().connect() as second:
        _, first_claim = _claim_with_job(first)
        _, second_claim = _claim_with_job(second)
        second.commit()
        first.commit()
    claimed = ([r.id for r in first_claim.rows], [r.id for r in second_claim.rows])
    assert (ids[:BATCH], ids[BATCH:]) == claimed


# --- keyed claims --------------------------------------------------------------------------


def test_a_claim_with_a_condition_takes_only_the_rows_that_meet_it(db: Database) -> None:
    """Activity ids 0..5; only the odd ones, the oldest two of them."""
    ids = add_events(db.engine, 6)
    odd = ACTIVITY.c.activity_id.in_([1, 3, 5])
    group_id = uuid.uuid4()
    claimed = db.run(lambda conn: queries.claim_rows(conn, db.dialect, ACTIVITY, group_id, 2, odd))
    returned = db.run(
        lambda conn: queries.claim_rows_returning(conn, db.dialect, ACTIVITY, uuid.uuid4(), 5, odd)
    )
    assert (2, [ids[1], ids[3]], [ids[5]]) == (
        claimed,
        group_ids(db.engine, group_id),
        [row.id for row in returned],
    )


def test_next_key_takes_the_keys_in_turn_then_starts_again(db: Database) -> None:
    add_events(db.engine, 3)  # activity ids 0, 1, 2

    def turns(count: int) -> list[Any]:
        last, seen = None, []
        for _ in range(count):
            turn = db.run(
                lambda conn, after=last: queries.next_key(conn, ACTIVITY, "activity_id", after)
            )
            assert turn is not None
            last = turn[0]
            seen.append(last)
        return seen

    assert [0, 1, 2, 0] == turns(4)
