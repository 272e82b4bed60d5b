"""outbox_jobs for an executor that hands jobs out as messages: which due jobs need a message.

``overdue_jobs`` finds the unleased jobs due for longer than a grace (a message lost, or never
sent), the most urgent first, paused handlers' left out; ``newest_due_jobs`` the ones just
enqueued or freed, newest first; ``give_back_jobs_of`` frees every lease of one stopping worker
as a rescue frees a gone worker's, due at once, the attempt kept.
"""

from __future__ import annotations

from typing import Any

from outbox import schema
from outbox._db import queries
from tests.conformance._database import Database
from tests.conformance._factories import (
    HANDLER,
    OTHER_HANDLER,
    OTHER_WORKER,
    WORKER,
    add_batch_job,
    add_claim_job,
    existing_job,
    lease,
    refuse,
)

GRACE = 10.0


def _overdue(db: Database, limit: int = 10, handlers: tuple[str, ...] = (HANDLER,)) -> list[int]:
    return db.run(
        lambda conn: queries.overdue_jobs(conn, list(handlers), overdue_seconds=GRACE, limit=limit)
    )


def _newest(db: Database, limit: int = 10, **options: Any) -> list[int]:
    return db.run(lambda conn: queries.newest_due_jobs(conn, [HANDLER], limit=limit, **options))


def test_overdue_jobs_are_those_due_past_the_grace_with_no_lease(db: Database) -> None:
    """Due 20 s ago: overdue; due 5 s ago, not yet due, or leased: not."""
    overdue = add_batch_job(db.engine, due_in=-20.0)
    add_batch_job(db.engine, due_in=-5.0)
    add_batch_job(db.engine, due_in=30.0)
    lease(db.engine, add_batch_job(db.engine, due_in=-20.0))
    assert [overdue] == _overdue(db)


def test_overdue_jobs_come_most_urgent_first_then_longest_due(db: Database) -> None:
    """Band first, then due time: the order acquisition takes them in."""
    later = add_batch_job(db.engine, due_in=-20.0)
    earlier = add_claim_job(db.engine, 0, due_in=-40.0)
    urgent = add_batch_job(db.engine, due_in=-15.0, priority=-1)
    assert [urgent, earlier, later] == _overdue(db)


def test_overdue_jobs_stop_at_the_limit(db: Database) -> None:
    """At most ``limit`` ids."""
    for _ in range(3):
        add_batch_job(db.engine, due_in=-20.0)
    assert 2 == len(_overdue(db, limit=2))


def test_overdue_jobs_leave_out_other_and_paused_handlers(db: Database) -> None:
    """Only the handlers asked for; none of a handler paused now."""
    add_batch_job(db.engine, due_in=-20.0, handler=OTHER_HANDLER)
    job_id = add_batch_job(db.engine, due_in=-20.0)
    before = _overdue(db)
    db.run(
        lambda conn: queries.pause_handler(
            conn, db.dialect, HANDLER, seconds=None, cause="operator", reason="test"
        )
    )
    assert ([job_id], []) == (before, _overdue(db))


def test_newest_due_jobs_come_newest_first(db: Database) -> None:
    """The jobs due most recently first: those just enqueued or freed."""
    older = add_batch_job(db.engine, due_in=-30.0)
    newer = add_batch_job(db.engine, due_in=-1.0)
    add_batch_job(db.engine, due_in=30.0)
    lease(db.engine, add_batch_job(db.engine, due_in=-1.0))
    assert [newer, older] == _newest(db)


def test_newest_due_jobs_of_a_kind(db: Database) -> None:
    """``kind``: claim jobs only."""
    claim = add_claim_job(db.engine, 0)
    add_batch_job(db.engine)
    assert [claim] == _newest(db, kind=schema.JobKind.CLAIM)


def test_newest_due_jobs_with_a_last_error(db: Database) -> None:
    """``last_error``: the rescue's, the jobs a rescue freed."""
    rescued = add_batch_job(db.engine, last_error=queries.RESCUED_ERROR)
    add_batch_job(db.engine, last_error="failed")
    assert [rescued] == _newest(db, last_error=queries.RESCUED_ERROR)


def test_a_stopping_workers_jobs_are_given_back_due_at_once(db: Database) -> None:
    """Every live lease of the worker is freed, due now, its attempt kept and recorded as the
    rescue's; another worker's lease and a refused job stay."""
    mine = add_batch_job(db.engine, due_in=-30.0)
    lease(db.engine, mine, expires_in=300.0)
    theirs = add_batch_job(db.engine)
    lease(db.engine, theirs, owner=OTHER_WORKER)
    refused = add_batch_job(db.engine)
    refuse(db.engine, refused)
    before = (existing_job(db.engine, theirs), existing_job(db.engine, refused))
    given = db.run(lambda conn: queries.give_back_jobs_of(conn, db.dialect, WORKER))
    row = existing_job(db.engine, mine)
    assert (1, None, None, 1, queries.RESCUED_ERROR, True) == (
        given,
        row["lease_owner"],
        row["lease_token"],
        row["attempts"],
        row["last_error"],
        -5 < db.seconds_from_now(row["run_at"]) <= 0,
    )
    assert before == (existing_job(db.engine, theirs), existing_job(db.engine, refused))
