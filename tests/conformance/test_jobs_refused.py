"""outbox_jobs: groups held as refused, listed and released by an operator.

A batch job whose group's finishing write the database refused for good is held: its lease
token stays, with no expiry, so that neither acquisition nor rescue takes it. The operator
lists such groups and releases them (all, one handler's, or one group's) to run again.
"""

from __future__ import annotations

import uuid

from outbox._db import queries
from tests.conformance._database import Database
from tests.conformance._factories import (
    HANDLER,
    OTHER_HANDLER,
    add_batch_job,
    add_claim_job,
    existing_job,
    lease,
    refuse,
)


def _refused_batch_job(
    db: Database, *, handler: str = HANDLER, group_id: uuid.UUID | None = None, error: str = "x"
) -> int:
    job_id = add_batch_job(db.engine, handler=handler, group_id=group_id)
    refuse(db.engine, job_id, error)
    return job_id


def test_refused_groups_lists_the_held_batch_jobs_oldest_first(db: Database) -> None:
    """Each held group with its handler, attempts and error, in the order its job was made;
    running and waiting jobs are not listed."""
    first, second = uuid.uuid4(), uuid.uuid4()
    _refused_batch_job(db, group_id=first, error="first")
    lease(db.engine, add_batch_job(db.engine))
    add_batch_job(db.engine)
    _refused_batch_job(db, handler=OTHER_HANDLER, group_id=second, error="second")
    expected = [
        queries.RefusedGroup(HANDLER, first, 1, "first"),
        queries.RefusedGroup(OTHER_HANDLER, second, 1, "second"),
    ]
    assert expected == db.run(queries.refused_groups)


def test_refused_groups_of_one_handler(db: Database) -> None:
    """Asked for one handler, only its held groups are listed."""
    group_id = uuid.uuid4()
    _refused_batch_job(db, group_id=group_id)
    _refused_batch_job(db, handler=OTHER_HANDLER)
    groups = db.run(lambda conn: queries.refused_groups(conn, HANDLER))
    assert [group_id] == [group.group_id for group in groups]


def test_refused_groups_leave_out_claim_jobs(db: Database) -> None:
    """Only batch jobs hold groups."""
    refuse(db.engine, add_claim_job(db.engine, 0))
    assert [] == db.run(queries.refused_groups)


def test_release_refused_jobs_gives_the_held_jobs_back(db: Database) -> None:
    """A released job has no token, is due now, and keeps its attempts and error."""
    job_id = _refused_batch_job(db, error="why")
    released = db.run(queries.release_refused_jobs)
    row = existing_job(db.engine, job_id)
    due_in = db.seconds_from_now(row["run_at"])
    lease_columns = (row["lease_owner"], row["lease_token"], row["lease_expires_at"])
    actual = (released, lease_columns, row["attempts"], row["last_error"], -5 < due_in <= 0)
    assert (1, (None, None, None), 1, "why", True) == actual


def test_release_refused_jobs_leaves_running_jobs(db: Database) -> None:
    """A job leased to a worker now is not refused, and keeps its lease."""
    job_id = add_batch_job(db.engine)
    lease(db.engine, job_id)
    before = existing_job(db.engine, job_id)
    assert (0, before) == (db.run(queries.release_refused_jobs), existing_job(db.engine, job_id))


def test_release_refused_jobs_of_one_handler(db: Database) -> None:
    """Released for one handler, another handler's held groups stay held."""
    mine, others = _refused_batch_job(db), _refused_batch_job(db, handler=OTHER_HANDLER)
    released = db.run(lambda conn: queries.release_refused_jobs(conn, HANDLER))
    tokens = [existing_job(db.engine, job_id)["lease_token"] is None for job_id in (mine, others)]
    assert (1, [True, False]) == (released, tokens)


def test_release_refused_jobs_of_one_group(db: Database) -> None:
    """Released for one group, the handler's other held groups stay held."""
    group_id = uuid.uuid4()
    mine, other = _refused_batch_job(db, group_id=group_id), _refused_batch_job(db)
    released = db.run(lambda conn: queries.release_refused_jobs(conn, group_id=group_id))
    tokens = [existing_job(db.engine, job_id)["lease_token"] is None for job_id in (mine, other)]
    assert (1, [True, False]) == (released, tokens)
