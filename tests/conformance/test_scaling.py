"""The scaling read: what waits, what runs and what was handled, per handler, from index ends
and short ranges in one statement; on every database."""

from __future__ import annotations

import datetime as dt
import uuid

from outbox import schema
from outbox._db import queries
from outbox._db.types import ScalingRow
from tests.conformance._database import Database
from tests.conformance._factories import (
    ACTIVITY,
    HANDLER,
    OTHER_HANDLER,
    add_batch_job,
    add_claim_job,
    add_events,
    add_worker,
    lease,
)
from tests.models import EmailEvent

EMAILS = EmailEvent.__table__


def _read(db: Database, rate: float = 300.0, apdex: float = 3600.0) -> dict[str, ScalingRow]:
    with db.engine.connect() as conn:
        rows = queries.scaling_rows(
            conn,
            [(HANDLER, ACTIVITY), (OTHER_HANDLER, EMAILS)],  # type: ignore[list-item]
            rate_seconds=rate,
            apdex_seconds=apdex,
            stale_seconds=20.0,
        )
    return {r.handler: r for r in rows}


def _minute(ago: int = 0) -> dt.datetime:
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    return now - dt.timedelta(minutes=ago)


def test_ends_of_unclaimed_and_of_all_ids_are_read(db: Database) -> None:
    """Three claimed rows then five unclaimed: the unclaimed ends, all ends, and the ages of
    the newest unclaimed row and of the oldest row; an empty buffer reads as None."""
    claimed = add_events(db.engine, 3, group_id=uuid.uuid4(), age=50.0)
    waiting = add_events(db.engine, 5, age=10.0)
    row = _read(db)[HANDLER]
    empty = _read(db)[OTHER_HANDLER]
    assert (
        (waiting[0], waiting[-1], claimed[0], waiting[-1], True, True),
        (None, None, None, None, None),
    ) == (
        (
            row.first_unclaimed,
            row.last_unclaimed,
            row.first_id,
            row.last_id,
            9.0 <= (row.newest_unclaimed_age or 0) < 30.0,
            49.0 <= (row.oldest_age or 0) < 70.0,
        ),
        (
            empty.first_unclaimed,
            empty.last_unclaimed,
            empty.first_id,
            empty.oldest_age,
            empty.newest_unclaimed_age,
        ),
    )


def test_only_due_unleased_batch_jobs_are_runnable(db: Database) -> None:
    """A due batch job is runnable; one due later (deferred, throttled, backing off), a leased
    one and a claim job are not; a leased job counts as a live lease, one whose lease ran out
    does not."""
    add_batch_job(db.engine)
    add_batch_job(db.engine, due_in=60.0)
    lease(db.engine, add_batch_job(db.engine))
    lease(db.engine, add_batch_job(db.engine), expires_in=-5.0)
    add_claim_job(db.engine, 0)
    add_batch_job(db.engine, handler=OTHER_HANDLER)
    found = _read(db)
    assert ((1, 1), (1, 0)) == (
        (found[HANDLER].runnable_groups, found[HANDLER].live_leases),
        (found[OTHER_HANDLER].runnable_groups, found[OTHER_HANDLER].live_leases),
    )


def test_a_paused_handler_reads_as_paused(db: Database) -> None:
    """A handler paused until resumed is paused; the other is not."""
    db.run(
        lambda conn: queries.pause_handler(
            conn,
            db.dialect,
            HANDLER,
            seconds=None,
            cause=schema.PauseCause.OPERATOR,
            reason=None,
        )
    )
    found = _read(db)
    assert (True, False) == (found[HANDLER].paused, found[OTHER_HANDLER].paused)


def test_handled_events_are_summed_over_each_window(db: Database) -> None:
    """Events delivered and dead count as handled; the rate window sums the minutes within it
    and the seconds they cover (60 for a past minute), the Apdex window its own minutes with
    the satisfied and tolerating counts; another handler's minutes stay apart."""

    def row(handler: str, ago: int, succeeded: int, **more: int) -> dict[str, object]:
        values = {"succeeded": succeeded, "dead": 0, "failed": 0, "satisfied": 0, "tolerating": 0}
        return {"handler": handler, "minute": _minute(ago), **values, **more}

    rows = [
        row(HANDLER, 2, 100, dead=20, satisfied=90, tolerating=5),
        row(HANDLER, 30, 1000, satisfied=10, tolerating=500),
        row(HANDLER, 120, 7, satisfied=7),
        row(OTHER_HANDLER, 2, 3, satisfied=3),
    ]
    db.run(lambda conn: queries.add_throughput(conn, db.dialect, rows))
    found = _read(db, rate=300.0, apdex=3600.0)
    mine = found[HANDLER]
    assert ((120, 60.0, 1120, 100, 505), (3, 3)) == (
        (mine.recent_handled, mine.recent_seconds, mine.handled, mine.satisfied, mine.tolerating),
        (found[OTHER_HANDLER].handled, found[OTHER_HANDLER].satisfied),
    )


def test_the_slots_of_live_workers_are_summed(db: Database) -> None:
    """Two live workers of one slot each count; one silent past the stale age does not."""
    add_worker(db.engine, "a")
    add_worker(db.engine, "b")
    add_worker(db.engine, "c", heartbeat_ago=120.0)
    assert 2 == _read(db)[HANDLER].fleet_slots
