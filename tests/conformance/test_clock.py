"""The database clock: every lease, backoff and age is computed from it, never from a worker's.

``db_now`` is the database's now and ``db_now_plus`` that plus float seconds; stored, the
difference is exact (MariaDB keeps DATETIME(6)). SQLite's clock reads to the millisecond, so
the offsets here are whole milliseconds.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from sqlalchemy import insert, select

from outbox import schema
from outbox._db import queries
from outbox._db.dialects import db_now_plus
from outbox.schema import db_now
from tests._support import wait_for
from tests.conformance._database import Database
from tests.conformance._factories import (
    ACTIVITY,
    HANDLER,
    WORKER,
    add_batch_job,
    add_events,
    existing_job,
)


def _job_stamped(db: Database, **times: object) -> dict[str, Any]:
    """A job whose time columns are written by one statement (one reading of the clock)."""
    values = {"kind": schema.JobKind.BATCH, "handler": HANDLER, "group_id": uuid.uuid4(),
              "priority": 0, **times}  # fmt: skip
    with db.engine.begin() as conn:
        key = conn.execute(insert(schema.jobs).values(values)).inserted_primary_key
    assert key is not None
    return existing_job(db.engine, int(key[0]))


def test_database_now_is_no_earlier_than_a_time_the_database_just_wrote(db: Database) -> None:
    """The clock reads as a point in time, at or after an event the database just dated."""
    add_events(db.engine, 1)
    with db.engine.connect() as conn:
        created_at = conn.execute(select(ACTIVITY.c.created_at)).scalar_one()
        now = queries.database_now(conn)
    assert True is (isinstance(now, dt.datetime) and now >= created_at)


def test_database_now_moves_forward(db: Database) -> None:
    """A later reading of the clock is later."""
    first = db.now()
    assert True is wait_for(lambda: db.now() > first, "the database clock to move", timeout=5.0)


@pytest.mark.parametrize("seconds", [2.0, -1.5, 0.25, 3600.0])
def test_db_now_plus_is_exactly_the_seconds_after_db_now(db: Database, seconds: float) -> None:
    """Written by one statement and read back, the two times are the seconds apart, to the
    microsecond."""
    row = _job_stamped(db, run_at=db_now(), lease_expires_at=db_now_plus(seconds))
    assert dt.timedelta(seconds=seconds) == row["lease_expires_at"] - row["run_at"]


def test_a_stored_time_keeps_its_microseconds(db: Database) -> None:
    """A time written by the application is stored to the microsecond."""
    moment = dt.datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)
    row = _job_stamped(db, run_at=moment)
    assert 123456 == row["run_at"].microsecond


def test_a_lease_of_two_seconds_ends_two_seconds_after_it_was_taken(db: Database) -> None:
    """A job acquired for two seconds has its lease end two seconds after the database's now
    at the acquisition."""
    job_id = add_batch_job(db.engine)
    before = db.now()
    db.run(
        lambda conn: queries.acquire_jobs(
            conn,
            db.dialect,
            handlers=[HANDLER],
            worker_id=WORKER,
            token=uuid.uuid4(),
            limit=1,
            lease_seconds=2.0,
        )
    )
    after = db.now()
    expires_at = existing_job(db.engine, job_id)["lease_expires_at"]
    two_seconds = dt.timedelta(seconds=2)
    assert True is (before + two_seconds <= expires_at <= after + two_seconds)


def test_an_events_age_does_not_depend_on_the_time_zone_of_its_writer(db: Database) -> None:
    """An event just written by an application session in another time zone than outbox's
    has waited no time: its age is measured on one clock."""
    with db.application_engine().connect() as application:
        db.set_session_time_zone(application, "-05:00")
        application.execute(insert(ACTIVITY).values(activity_id=1))
        application.commit()
    age = db.run(lambda conn: queries.oldest_unclaimed_age(conn, ACTIVITY))
    assert True is (age is not None and 0 <= age < 5)
