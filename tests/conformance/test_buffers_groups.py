"""Buffer tables: writing events, and reading, moving and deleting a claimed group's rows.

Events are written in the caller's transaction with one executemany; replayed rows are written
as the database stores them, past any type's conversion. A group's rows are read by id, rows a
handler retries move to a new group, and a finished group's rows are deleted (all, some, or
those older than an age). On PostgreSQL a group whose events all succeeded is finished in one
statement, fenced by its batch job's lease.
"""

from __future__ import annotations

import uuid
from typing import cast

import pytest
from sqlalchemy import Connection, Table, delete, select

from outbox import schema
from outbox._db import queries
from tests.conformance._database import Database
from tests.conformance._factories import (
    ACTIVITY,
    HANDLER,
    TYPED,
    TYPED_VALUES,
    add_batch_job,
    add_events,
    archived,
    buffer_ids,
    date_back,
    existing_job,
    group_ids,
    job,
    lease,
    typed_rows,
    unclaimed_ids,
)
from tests.models import EmailEvent

EMAIL = cast(Table, EmailEvent.__table__)


def test_select_group_rows_returns_the_groups_rows_by_id(db: Database) -> None:
    """Every column of the group's rows, in id order; other groups' rows are not included."""
    group_id = uuid.uuid4()
    ids = add_events(db.engine, 3, group_id=group_id)
    add_events(db.engine, 2, group_id=uuid.uuid4())
    add_events(db.engine, 1)
    rows = db.run(lambda conn: queries.select_group_rows(conn, ACTIVITY, group_id))
    columns = [column.name for column in ACTIVITY.c]
    assert (ids, [columns] * 3) == ([row.id for row in rows], [list(row._fields) for row in rows])


def test_select_claimed_rows_returns_the_groups_rows_by_id(db: Database) -> None:
    """A group being claimed reads as a SELECT of the group does."""
    group_id = uuid.uuid4()
    add_events(db.engine, 3, group_id=group_id)
    selected = db.run(lambda conn: queries.select_group_rows(conn, ACTIVITY, group_id))
    assert selected == db.run(lambda conn: queries.select_claimed_rows(conn, ACTIVITY, group_id))


def test_count_group_rows_counts_the_groups_rows(db: Database) -> None:
    """Only the group's own rows are counted."""
    group_id = uuid.uuid4()
    add_events(db.engine, 3, group_id=group_id)
    add_events(db.engine, 2, group_id=uuid.uuid4())
    assert 3 == db.run(lambda conn: queries.count_group_rows(conn, ACTIVITY, group_id))


def test_move_rows_to_group_moves_only_the_named_rows_of_the_group(db: Database) -> None:
    """The named rows of the group move to the new group; a named row of another group stays
    where it is."""
    group_id, other_group, new_group = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    ids = add_events(db.engine, 3, group_id=group_id)
    (other,) = add_events(db.engine, 1, group_id=other_group)
    moved = db.run(
        lambda conn: queries.move_rows_to_group(
            conn, ACTIVITY, group_id, new_group, [ids[1], other]
        )
    )
    groups = [group_ids(db.engine, g) for g in (group_id, new_group, other_group)]
    assert (1, [[ids[0], ids[2]], [ids[1]], [other]]) == (moved, groups)


def test_delete_group_rows_deletes_the_whole_group(db: Database) -> None:
    """Every row of the group goes; other rows stay."""
    group_id = uuid.uuid4()
    add_events(db.engine, 3, group_id=group_id)
    others = add_events(db.engine, 2, group_id=uuid.uuid4()) + add_events(db.engine, 1)
    deleted = db.run(lambda conn: queries.delete_group_rows(conn, ACTIVITY, group_id))
    assert (3, others) == (deleted, buffer_ids(db.engine))


def test_delete_group_rows_deletes_only_the_named_events(db: Database) -> None:
    """Given event ids, only those rows of the group go."""
    group_id = uuid.uuid4()
    ids = add_events(db.engine, 3, group_id=group_id)
    deleted = db.run(lambda conn: queries.delete_group_rows(conn, ACTIVITY, group_id, [ids[1]]))
    assert (1, [ids[0], ids[2]]) == (deleted, group_ids(db.engine, group_id))


def test_delete_group_rows_deletes_only_rows_older_than_the_age(db: Database) -> None:
    """Given an age, only the group's rows written longer ago than that go."""
    group_id = uuid.uuid4()
    old, new = add_events(db.engine, 2, group_id=group_id)
    date_back(db.engine, [old], 120.0)
    deleted = db.run(
        lambda conn: queries.delete_group_rows(conn, ACTIVITY, group_id, older_than=60.0)
    )
    assert (1, [new]) == (deleted, group_ids(db.engine, group_id))


def test_insert_events_writes_every_row_unclaimed(db: Database) -> None:
    """Each row becomes an unclaimed event; the count says how many."""
    rows = [{"activity_id": n, "kind": "clicked"} for n in range(3)]
    written = db.run(lambda conn: queries.insert_events(conn, ACTIVITY, rows))
    with db.engine.connect() as conn:
        stored = conn.execute(select(ACTIVITY.c.activity_id, ACTIVITY.c.kind)).all()
    assert (3, [(n, "clicked") for n in range(3)], 3) == (
        written,
        sorted(stored),
        len(unclaimed_ids(db.engine)),
    )


def test_insert_events_dates_events_on_the_database_clock(db: Database) -> None:
    """A new event's ``created_at`` is the database's now."""
    db.run(lambda conn: queries.insert_events(conn, ACTIVITY, [{"activity_id": 1}]))
    with db.engine.connect() as conn:
        created_at = conn.execute(select(ACTIVITY.c.created_at)).scalar_one()
    assert True is (-5 < db.seconds_from_now(created_at) <= 0)


def test_insert_events_of_no_rows_writes_nothing(db: Database) -> None:
    """No rows, no statement."""
    assert (0, []) == (
        db.run(lambda conn: queries.insert_events(conn, ACTIVITY, [])),
        buffer_ids(db.engine),
    )


def test_insert_events_joins_the_callers_transaction(db: Database) -> None:
    """Events written in a transaction that rolls back are gone with it."""
    with db.engine.connect() as conn:
        queries.insert_events(conn, ACTIVITY, [{"activity_id": 1}])
        conn.rollback()
    assert [] == buffer_ids(db.engine)


def test_a_buffer_never_gives_an_id_twice(db: Database) -> None:
    """Once every row is deleted, the next event's id is past theirs (SQLite: AUTOINCREMENT):
    an id, and the message id sinks derive from it, names one event."""
    first = add_events(db.engine, 3)
    with db.engine.begin() as conn:
        conn.execute(ACTIVITY.delete())
    [after] = add_events(db.engine, 1)
    assert after > max(first), (first, after)


def test_existing_ids_names_the_ids_a_row_holds(db: Database) -> None:
    """Of the ids asked, those a row of the buffer holds; none asked, none."""
    held = add_events(db.engine, 2)
    free = max(held) + 1000
    assert ({held[1]}, set()) == (
        db.run(lambda conn: queries.existing_ids(conn, ACTIVITY, [held[1], free])),
        db.run(lambda conn: queries.existing_ids(conn, ACTIVITY, [])),
    )


def test_insert_stored_rows_keeps_given_ids_and_the_next_event_comes_after_them(
    db: Database,
) -> None:
    """A replayed row keeps the id it is given, and the buffer's next event gets an id past
    it (PostgreSQL: its sequence is moved; the others move their counters themselves)."""
    given = max(add_events(db.engine, 1)) + 10_000
    written = db.run(
        lambda conn: queries.insert_stored_rows(conn, ACTIVITY, [{"id": given, "activity_id": 1}])
    )
    [after] = add_events(db.engine, 1)
    assert ([given], True) == (written, after > given), after


def test_insert_stored_rows_writes_rows_of_different_columns(db: Database) -> None:
    """Rows that lack a column (archived before it was added) are written with the others, and
    their ids come back in the order of the rows."""
    rows: list[dict[str, object]] = [
        {"address": "a@example.com", "data": {"n": 1}},
        {"address": "b@example.com"},
        {"address": "c@example.com", "data": None},
    ]
    written = db.run(lambda conn: queries.insert_stored_rows(conn, EMAIL, rows))
    with db.engine.connect() as conn:
        stored = conn.execute(
            select(EMAIL.c.id, EMAIL.c.address, EMAIL.c.data).order_by(EMAIL.c.address)
        )
        values = [tuple(row) for row in stored]
    expected = [("a@example.com", {"n": 1}), ("b@example.com", None), ("c@example.com", None)]
    assert (expected, written) == ([v[1:] for v in values], [v[0] for v in values])


def test_insert_stored_rows_writes_values_as_stored(typed_buffer: Database) -> None:
    """A value is written as the database stores it, not converted by its column's type once
    more: a stored ``tag:value`` reads back as ``value``."""
    db = typed_buffer
    row = {**TYPED_VALUES, "tagged": "tag:value"}
    db.run(lambda conn: queries.insert_stored_rows(conn, TYPED, [row]))
    assert ["value"] == [stored["tagged"] for stored in typed_rows(db.engine)]


# --- PostgreSQL: a group whose events all succeeded, finished in one statement -----------------


def _requires_one_statement_completion(db: Database) -> None:
    if not db.supports.one_statement_completion:
        pytest.skip(f"{db.dialect} finishes a group in several statements")


def _held_group(db: Database, size: int = 3) -> tuple[uuid.UUID, int, uuid.UUID, list[int]]:
    """A group of ``size`` rows and its batch job, leased: (group, job, token, row ids)."""
    group_id = uuid.uuid4()
    ids = add_events(db.engine, size, group_id=group_id)
    job_id = add_batch_job(db.engine, group_id=group_id)
    return group_id, job_id, lease(db.engine, job_id), ids


def _finish(
    conn: Connection,
    group_id: uuid.UUID,
    job_id: int,
    token: uuid.UUID,
    archive: tuple[str, int] | None = None,
    size: int = 3,
) -> int | None:
    return queries.finish_succeeded_group(
        conn, ACTIVITY, job_id=job_id, token=token, group_id=group_id, size=size, archive=archive
    )


def test_finish_succeeded_group_deletes_the_job_and_the_groups_rows(db: Database) -> None:
    """The batch job and every row of the group go; the count says how many rows."""
    _requires_one_statement_completion(db)
    group_id, job_id, token, _ = _held_group(db)
    others = add_events(db.engine, 1)
    finished = db.run(lambda conn: _finish(conn, group_id, job_id, token))
    assert (3, None, others) == (finished, job(db.engine, job_id), buffer_ids(db.engine))


def test_finish_succeeded_group_archives_the_rows_as_succeeded(db: Database) -> None:
    """Asked to archive, each row of the group is archived as succeeded with the attempt."""
    _requires_one_statement_completion(db)
    group_id, job_id, token, ids = _held_group(db)
    finished = db.run(lambda conn: _finish(conn, group_id, job_id, token, (HANDLER, 2)))
    rows = [
        (row["handler"], row["event_id"], row["group_id"], row["status"], row["attempts"])
        for row in archived(db.engine)
    ]
    succeeded = schema.ArchiveStatus.SUCCEEDED
    assert (3, [(HANDLER, i, group_id, succeeded, 2) for i in ids]) == (finished, rows)


def test_finish_succeeded_group_of_no_rows_deletes_its_job(db: Database) -> None:
    """A group with no rows left (its rows vanished between claim and finish) is finished, not
    taken for a lost lease: its job goes and the count is 0. Without archive the statement
    returns no rows, so "no row deleted" alone cannot tell the two apart."""
    _requires_one_statement_completion(db)
    group_id, job_id, token, _ = _held_group(db, size=0)
    finished = db.run(lambda conn: _finish(conn, group_id, job_id, token, size=0))
    assert (0, None) == (finished, job(db.engine, job_id))


def test_finish_succeeded_group_of_no_rows_with_a_lost_lease_changes_nothing(db: Database) -> None:
    """No row deleted and a token that is no longer the job's: None, the job left as it was."""
    _requires_one_statement_completion(db)
    group_id, job_id, _, _ = _held_group(db, size=0)
    before = existing_job(db.engine, job_id)
    finished = db.run(lambda conn: _finish(conn, group_id, job_id, uuid.uuid4(), size=0))
    assert (None, before) == (finished, job(db.engine, job_id))


def test_finish_succeeded_group_finished_by_another_meanwhile_is_a_lost_lease(
    db: Database,
) -> None:
    """The lease ran out while the group was handled, and a rescue ran it again and finished it:
    its job and rows are gone. The late finish finds nothing of its own: a lost lease, not a
    success of no events."""
    _requires_one_statement_completion(db)
    group_id, job_id, token, _ = _held_group(db)
    with db.engine.begin() as conn:
        conn.execute(delete(schema.jobs).where(schema.jobs.c.id == job_id))
        conn.execute(delete(ACTIVITY).where(ACTIVITY.c.group_id == group_id))
    assert None is db.run(lambda conn: _finish(conn, group_id, job_id, token))


def test_finish_succeeded_group_with_a_lost_lease_changes_nothing(db: Database) -> None:
    """With a token that is no longer the job's, nothing is deleted or archived: None."""
    _requires_one_statement_completion(db)
    group_id, job_id, _, ids = _held_group(db)
    before = existing_job(db.engine, job_id)
    finished = db.run(lambda conn: _finish(conn, group_id, job_id, uuid.uuid4(), (HANDLER, 1)))
    assert (None, before, ids, []) == (
        finished,
        job(db.engine, job_id),
        group_ids(db.engine, group_id),
        archived(db.engine),
    )
