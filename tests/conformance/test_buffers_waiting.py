"""What waits in a buffer, for the assertions of users' tests: the rows still in it, unclaimed
or in a group, that meet a condition; how many, and the first few by id."""

from __future__ import annotations

import uuid

from sqlalchemy import Connection

from outbox._db import queries
from tests.conformance._database import Database
from tests.conformance._factories import ACTIVITY, add_events


def test_waiting_rows_counts_unclaimed_and_claimed_rows_and_returns_the_first_by_id(
    db: Database,
) -> None:
    """Unclaimed and claimed rows both wait; the first ``limit`` come back in id order."""
    unclaimed = add_events(db.engine, 2)
    claimed = add_events(db.engine, 2, group_id=uuid.uuid4())
    count, rows = db.run(lambda conn: queries.waiting_rows(conn, ACTIVITY, None, 3))
    assert (4, [*unclaimed, *claimed][:3]) == (count, [row.id for row in rows])


def test_waiting_rows_keeps_to_the_condition(db: Database) -> None:
    """Only rows that meet the condition are counted and returned."""
    ids = add_events(db.engine, 4)
    condition = ACTIVITY.c.activity_id >= 2
    count, rows = db.run(lambda conn: queries.waiting_rows(conn, ACTIVITY, condition, 10))
    assert (2, ids[2:]) == (count, [row.id for row in rows])


def test_waiting_rows_sees_the_callers_own_uncommitted_rows(db: Database) -> None:
    """Run in the caller's transaction, it counts the rows that transaction wrote."""

    def write_and_count(conn: Connection) -> int:
        conn.execute(ACTIVITY.insert(), [{"activity_id": 1}])
        count, _ = queries.waiting_rows(conn, ACTIVITY, None, 1)
        return count

    with db.engine.connect() as conn, conn.begin() as transaction:
        count = write_and_count(conn)
        transaction.rollback()
    assert 1 == count
