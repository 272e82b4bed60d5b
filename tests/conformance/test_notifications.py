"""Notifications, where the database has LISTEN/NOTIFY (PostgreSQL): a distribution that
enqueued claim jobs wakes idle workers, and a buffer's trigger announces new events, each heard
only once its transaction commits.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import insert, text

from outbox._db import queries
from tests.conformance._database import Database
from tests.conformance._factories import ACTIVITY

HEARD_SECONDS = 5.0
"""How long a test listens for a notification that should come."""
SILENCE_SECONDS = 0.3
"""How long a test listens to be sure a notification did not come."""


@pytest.fixture
def listener(db: Database) -> Iterator[Any]:
    """A psycopg connection of its own that LISTENs on outbox's channel."""
    if not db.supports.listen_notify:
        pytest.skip(f"{db.dialect} has no LISTEN/NOTIFY: workers poll")
    raw = db.other_engine().raw_connection()
    connection = raw.driver_connection
    assert connection is not None
    connection.autocommit = True
    connection.execute(f"LISTEN {queries.NOTIFY_CHANNEL}")
    try:
        yield connection
    finally:
        raw.invalidate()


def _heard(listener: Any, timeout: float, stop_after: int | None = 1) -> list[str]:
    notifications = listener.notifies(timeout=timeout, stop_after=stop_after)
    return [notification.payload for notification in notifications]


def test_notify_jobs_is_heard_once_its_transaction_commits(db: Database, listener: Any) -> None:
    """Nothing is heard while the transaction is open; its commit wakes the listener."""
    with db.engine.connect() as conn:
        queries.notify_jobs(conn)
        before_commit = _heard(listener, SILENCE_SECONDS)
        conn.commit()
    after_commit = _heard(listener, HEARD_SECONDS)
    assert ([], [queries.JOBS_NOTIFICATION]) == (before_commit, after_commit)


def test_notify_jobs_of_a_rolled_back_transaction_is_never_heard(
    db: Database, listener: Any
) -> None:
    """A distribution that rolled back enqueued nothing, and wakes nobody."""
    with db.engine.connect() as conn:
        queries.notify_jobs(conn)
        conn.rollback()
    assert [] == _heard(listener, SILENCE_SECONDS)


@pytest.fixture
def announcing(db: Database, listener: Any) -> Iterator[None]:
    """The buffer of ``ActivityEvent`` with its notify trigger, dropped after the test."""
    with db.engine.begin() as conn:
        conn.execute(text(queries.notify_function_ddl()))
        for statement in queries.notify_trigger_ddl(conn.dialect, ACTIVITY):
            conn.execute(text(statement))
    try:
        yield
    finally:
        with db.engine.begin() as conn:
            conn.execute(text(queries.drop_notify_trigger_ddl(conn.dialect, ACTIVITY)))


@pytest.mark.usefixtures("announcing")
def test_a_buffers_trigger_announces_its_events_once_per_statement(
    db: Database, listener: Any
) -> None:
    """With the notify trigger in place, one INSERT of several events is heard once, naming
    the buffer."""
    with db.engine.begin() as conn:
        conn.execute(insert(ACTIVITY), [{"activity_id": n} for n in range(3)])
    heard = _heard(listener, HEARD_SECONDS) + _heard(listener, SILENCE_SECONDS)
    assert [ACTIVITY.name] == heard


@pytest.mark.usefixtures("announcing")
def test_a_buffers_trigger_is_heard_only_once_the_events_commit(
    db: Database, listener: Any
) -> None:
    """Events of an open transaction are not announced until it commits."""
    with db.engine.connect() as conn:
        conn.execute(insert(ACTIVITY).values(activity_id=1))
        before_commit = _heard(listener, SILENCE_SECONDS)
        conn.commit()
    assert ([], [ACTIVITY.name]) == (before_commit, _heard(listener, HEARD_SECONDS))


def test_a_buffer_without_its_trigger_announces_nothing(db: Database, listener: Any) -> None:
    """Once the trigger is dropped, new events wake nobody."""
    with db.engine.begin() as conn:
        conn.execute(text(queries.notify_function_ddl()))
        for statement in queries.notify_trigger_ddl(conn.dialect, ACTIVITY):
            conn.execute(text(statement))
        conn.execute(text(queries.drop_notify_trigger_ddl(conn.dialect, ACTIVITY)))
    with db.engine.begin() as conn:
        conn.execute(insert(ACTIVITY).values(activity_id=1))
    assert [] == _heard(listener, SILENCE_SECONDS)
