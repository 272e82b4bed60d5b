"""``assert_enqueued`` / ``assert_not_enqueued``: assertions on the events waiting in a buffer
(unclaimed, or claimed and not yet handled), through an Outbox, an engine, a connection or a
session, sync or async; a failure shows how many wait and the first rows."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outbox import Batch, Outbox
from outbox._engine import claimer
from outbox.testing import assert_enqueued, assert_not_enqueued, drain
from tests.conftest import reset_schema
from tests.models import ActivityEvent, EmailEvent

App = Callable[..., Outbox]
Commit = Callable[..., list[int]]


@pytest.fixture
def app(sqlite_url: str, make_app: App) -> Outbox:
    """An application with a handler of ActivityEvent, on an empty SQLite database."""
    reset_schema(sqlite_url)
    outbox = make_app(sqlite_url)

    @outbox.handler(ActivityEvent, batch_size=2, name="sink")
    def sink(batch: Batch[ActivityEvent]) -> None:
        pass

    return outbox


def _failure(check: Callable[[], object]) -> str:
    with pytest.raises(AssertionError) as raised:
        check()
    return str(raised.value)


def test_committed_events_are_enqueued(
    database_url: str, make_app: App, commit_events: Commit
) -> None:
    """Events committed wait in the buffer: found by model, handler name and Handler."""
    app = make_app(database_url)
    app.handler(ActivityEvent, name="sink")(lambda batch: None)
    commit_events(app.engine, 3)
    assert_enqueued(app, ActivityEvent, count=3)
    assert_enqueued(app, "sink", count=3)
    assert_enqueued(app.engine, app.get_handler("sink"), count=3)


def test_claimed_events_not_yet_handled_are_enqueued(app: Outbox, commit_events: Commit) -> None:
    """Events claimed into a group whose handler has not run yet still count."""
    commit_events(app.engine, 2)
    claimer.run_once(app, app.get_handler("sink"))
    assert_enqueued(app, ActivityEvent, count=2)


def test_handled_events_are_not_enqueued(app: Outbox, commit_events: Commit) -> None:
    """Once drained, nothing waits."""
    commit_events(app.engine, 2)
    drain(app)
    assert_not_enqueued(app, ActivityEvent)


def test_a_session_sees_its_own_uncommitted_events(sqlite_url: str, app: Outbox) -> None:
    """Through a session, its own pending events count before any commit; another
    connection does not see them."""
    elsewhere = create_engine(sqlite_url)
    with Session(app.engine) as session:
        session.add(ActivityEvent(activity_id=1))
        assert_enqueued(session, ActivityEvent, count=1)
        assert_not_enqueued(elsewhere, ActivityEvent)
    elsewhere.dispose()


def test_a_connection_sees_its_own_transaction(app: Outbox) -> None:
    """Through a connection, its transaction's events count."""
    with app.engine.connect() as conn:
        conn.execute(ActivityEvent.__table__.insert(), [{"activity_id": 1}])
        assert_enqueued(conn, ActivityEvent, where={"activity_id": 1})


def test_where_keeps_to_column_values(app: Outbox, commit_events: Commit) -> None:
    """A mapping of column values selects the events counted; None matches NULL."""
    commit_events(app.engine, 3, activity_id=5)
    commit_events(app.engine, 1, activity_id=6)
    assert_enqueued(app, ActivityEvent, count=3, where={"activity_id": 5, "group_id": None})
    assert_not_enqueued(app, ActivityEvent, where={"activity_id": 7})


def test_where_takes_a_condition(app: Outbox, commit_events: Commit) -> None:
    """A SQLAlchemy condition on the model selects the events counted."""
    commit_events(app.engine, 2, activity_id=5)
    commit_events(app.engine, 1, activity_id=9)
    assert_enqueued(app, ActivityEvent, count=1, where=ActivityEvent.activity_id > 6)


def test_a_wrong_count_shows_what_waits(app: Outbox, commit_events: Commit) -> None:
    """The message says how many were expected and found, and shows the first rows."""
    commit_events(app.engine, 2, activity_id=5)
    message = _failure(lambda: assert_enqueued(app, "sink", count=3))
    assert message.startswith(
        "expected 3 event(s) waiting in test_activity_events (handler 'sink'), found 2; the first:"
    )
    assert 2 == message.count("activity_id=5")


def test_none_matching_shows_what_else_waits(app: Outbox, commit_events: Commit) -> None:
    """No event matches ``where``: the message says how many wait in all, and shows them."""
    commit_events(app.engine, 1, activity_id=5)
    message = _failure(lambda: assert_enqueued(app, ActivityEvent, where={"activity_id": 6}))
    assert message.startswith(
        "expected at least 1 event waiting in test_activity_events where activity_id = 6, "
        "found 0; 1 waiting in all; the first:\n  id="
    )


def test_an_empty_buffer_says_so(app: Outbox) -> None:
    """Nothing at all waits: the message says 0 and shows no rows."""
    message = _failure(lambda: assert_enqueued(app, ActivityEvent))
    assert (
        "expected at least 1 event waiting in test_activity_events, found 0; 0 waiting in all"
        == message
    )


def test_assert_not_enqueued_shows_what_waits(app: Outbox, commit_events: Commit) -> None:
    """Events that should not wait are counted and shown."""
    commit_events(app.engine, 7, activity_id=5)
    message = _failure(lambda: assert_not_enqueued(app, ActivityEvent, where={"activity_id": 5}))
    lines = message.splitlines()
    expected = "expected no event waiting in test_activity_events where activity_id = 5, found 7"
    assert (f"{expected}; the first:", 5) == (lines[0], len(lines) - 1)


def test_an_async_session_is_awaited(sqlite_url: str, app: Outbox) -> None:
    """With an AsyncSession the assertion is awaited, and sees the session's own events."""
    async_url = make_url(sqlite_url).set(drivername="sqlite+aiosqlite")

    async def check() -> str:
        engine = create_async_engine(async_url)
        try:
            async with AsyncSession(engine) as session:
                session.add(ActivityEvent(activity_id=1))
                await assert_enqueued(session, ActivityEvent, count=1)
                await assert_not_enqueued(engine, ActivityEvent)
                with pytest.raises(AssertionError) as raised:
                    await assert_not_enqueued(session, ActivityEvent)
                return str(raised.value)
        finally:
            await engine.dispose()

    assert "found 1" in asyncio.run(check())


@pytest.mark.parametrize(
    ("target", "subject", "options", "message"),
    [
        ("app", "sink", {"count": -1}, "count must be >= 0, got -1"),
        ("app", "sink", {"count": True}, "count must be an int or None, got True"),
        ("app", EmailEvent, {"where": {"nope": 1}}, "test_email_events has no column 'nope'; "
         "its columns: address, data, id, group_id, created_at"),
        ("app", "sink", {"where": [1]}, "where must be a mapping of column values or a "
         "SQLAlchemy condition, got [1]"),
        ("engine", "sink", {}, "a handler's name ('sink') needs the Outbox as the target; "
         "pass the buffer model or the Handler"),
        ("app", int, {}, "subject must be a buffer model, a Handler or a handler's name, "
         "got <class 'int'>"),
        ("url", ActivityEvent, {}, "the target must be an Outbox, an Engine, a Connection, a "
         "Session or their async kinds, got str"),
    ],
)  # fmt: skip
def test_bad_input_is_refused(
    target: str, subject: Any, options: dict[str, Any], message: str, app: Outbox
) -> None:
    """A bad count, column, condition, target or subject is refused, named, in one line."""
    given = {"app": app, "engine": app.engine, "url": str(app.url)}[target]
    with pytest.raises((TypeError, ValueError)) as raised:
        assert_enqueued(given, subject, **options)
    assert message == str(raised.value)
