"""The inline executor (``outbox.testing.inline``): a committed transaction's events are
handled in the test's own process before ``commit()`` returns, through the real code paths;
a rollback runs nothing; a handler's failure is recorded as in production and raised at the end
of the block."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outbox import Batch, Outbox, RetryPolicy, add_events, schema
from outbox.testing import HandlerFailedError, inline
from tests.conftest import reset_schema
from tests.models import ActivityEvent, EmailEvent, Order

App = Callable[..., Outbox]
IMMEDIATE = RetryPolicy(max_attempts=2, scale=0.0, base_delay=0.0, jitter=0.0)


@pytest.fixture
def sqlite_database(sqlite_url: str) -> str:
    """A migrated, empty SQLite database: what inline does is the session's, on any database."""
    reset_schema(sqlite_url)
    return sqlite_url


def _recorded(app: Outbox) -> list[int]:
    handled: list[int] = []

    @app.handler(ActivityEvent, name="sink")
    def sink(batch: Batch[ActivityEvent]) -> None:
        handled.extend(event.activity_id for event in batch.events)

    return handled


def _failing(app: Outbox, retry: RetryPolicy = IMMEDIATE) -> None:
    @app.handler(EmailEvent, retry=retry, name="mailer")
    def mailer(batch: Batch[EmailEvent]) -> None:
        raise ConnectionError("the mail relay is down")


def _attempts(app: Outbox) -> list[int]:
    with app.engine.connect() as conn:
        return list(conn.execute(select(schema.jobs.c.attempts)).scalars())


def test_a_commit_runs_its_events_before_it_returns(database_url: str, make_app: App) -> None:
    """Events added to a session are handled by the time its commit returns."""
    app = make_app(database_url)
    handled = _recorded(app)
    with inline(app), Session(app.engine) as session:
        session.add_all([Order(id=1, reference="A-1"), ActivityEvent(activity_id=7)])
        session.commit()
        assert [7] == handled


def test_a_rolled_back_transaction_runs_nothing(sqlite_database: str, make_app: App) -> None:
    """Events of a rolled-back transaction never reach the handler, nor a later commit's run."""
    app = make_app(sqlite_database)
    handled = _recorded(app)
    with inline(app) as runner, Session(app.engine) as session:
        session.add(ActivityEvent(activity_id=1))
        session.flush()
        session.rollback()
        session.add(Order(id=1, reference="A-1"))
        session.commit()
        ran = runner.drain()
    assert ([], 0) == (handled, ran.jobs)


def test_a_savepoints_events_wait_for_the_outermost_commit(
    sqlite_database: str, make_app: App
) -> None:
    """Releasing a savepoint commits nothing yet: its events run at the outermost commit."""
    app = make_app(sqlite_database)
    handled = _recorded(app)
    with inline(app), Session(app.engine) as session:
        with session.begin_nested():
            session.add(ActivityEvent(activity_id=1))
        before = list(handled)
        session.commit()
    assert ([], [1]) == (before, handled)


def test_add_events_and_insert_statements_run_at_commit(
    sqlite_database: str, make_app: App
) -> None:
    """Rows written with ``add_events`` or ``session.execute(insert(...))`` run as added ones."""
    app = make_app(sqlite_database)
    handled = _recorded(app)
    with inline(app), Session(app.engine) as session:
        add_events(session, ActivityEvent, [{"activity_id": 1}])
        session.commit()
        session.execute(insert(ActivityEvent), [{"activity_id": 2}])
        session.commit()
    assert [1, 2] == handled


def test_a_core_connections_events_wait_for_drain(sqlite_database: str, make_app: App) -> None:
    """A Core connection's commit is not followed: its events run at ``drain()``."""
    app = make_app(sqlite_database)
    handled = _recorded(app)
    with inline(app) as runner:
        with app.engine.begin() as conn:
            add_events(conn, ActivityEvent, [{"activity_id": 1}])
        before = list(handled)
        result = runner.drain()
    assert ([], [1], 1) == (before, handled, result.stats.events_succeeded)


def test_a_commit_outside_the_block_runs_nothing(sqlite_database: str, make_app: App) -> None:
    """Once the block is over, commits are not followed any more."""
    app = make_app(sqlite_database)
    handled = _recorded(app)
    with inline(app):
        pass
    with Session(app.engine) as session:
        session.add(ActivityEvent(activity_id=1))
        session.commit()
    assert [] == handled


def test_a_handler_failure_is_raised_at_the_end_of_the_block(
    sqlite_database: str, make_app: App
) -> None:
    """The commit returns; the group's attempts are recorded (dead after two); the block's end
    raises HandlerFailedError naming the handler, with its error."""
    app = make_app(sqlite_database)
    _failing(app)
    committed: list[bool] = []

    def commit_in_the_block() -> None:
        with inline(app), Session(app.engine) as session:
            session.add(EmailEvent(address="a@example.com"))
            session.commit()
            committed.append(True)

    with pytest.raises(HandlerFailedError) as raised:
        commit_in_the_block()
    outcomes = [r.outcome for r in raised.value.results]
    assert ([True], ["retrying", "dead"]) == (committed, outcomes)
    assert "handler 'mailer'" in str(raised.value)
    assert "ConnectionError: the mail relay is down" in str(raised.value)


def test_a_failure_is_raised_once(sqlite_database: str, make_app: App) -> None:
    """``check()`` raises the failures not raised yet; the block's end then raises nothing."""
    app = make_app(sqlite_database)
    _failing(app, RetryPolicy(max_attempts=3))
    with inline(app) as runner:
        with Session(app.engine) as session:
            session.add(EmailEvent(address="a@example.com"))
            session.commit()
        with pytest.raises(HandlerFailedError) as raised:
            runner.check()
        runner.check()
    assert (["retrying"], [1]) == ([r.outcome for r in raised.value.results], _attempts(app))


def test_raise_errors_false_keeps_failures_to_read(sqlite_database: str, make_app: App) -> None:
    """With ``raise_errors=False`` nothing is raised; ``failures`` lists the failed attempts."""
    app = make_app(sqlite_database)
    _failing(app)
    with inline(app, raise_errors=False) as runner, Session(app.engine) as session:
        session.add(EmailEvent(address="a@example.com"))
        session.commit()
    assert [1, 2] == [r.attempt for r in runner.failures]


def test_a_retry_due_later_waits(sqlite_database: str, make_app: App) -> None:
    """A failed attempt whose retry is due in seconds is not run again within the commit."""
    app = make_app(sqlite_database)
    _failing(app, RetryPolicy(max_attempts=3))
    with inline(app, raise_errors=False) as runner, Session(app.engine) as session:
        session.add(EmailEvent(address="a@example.com"))
        session.commit()
    assert ([1], [1]) == ([r.attempt for r in runner.results], _attempts(app))


def test_events_a_handler_writes_run_before_the_commit_returns(
    sqlite_database: str, make_app: App
) -> None:
    """A handler that commits events of another handler: those run too, within the first
    commit, and no run starts inside another."""
    app = make_app(sqlite_database)
    mailed: list[str] = []

    @app.handler(ActivityEvent, name="notify")
    def notify(batch: Batch[ActivityEvent]) -> None:
        with Session(app.engine) as session:
            session.add_all(EmailEvent(address=f"{e.activity_id}@example.com") for e in batch)
            session.commit()

    @app.handler(EmailEvent, name="mailer")
    def mailer(batch: Batch[EmailEvent]) -> None:
        mailed.extend(event.address for event in batch.events)

    with inline(app), Session(app.engine) as session:
        session.add(ActivityEvent(activity_id=1))
        session.commit()
        assert ["1@example.com"] == mailed


def test_an_async_sessions_commit_runs_an_async_handler(
    sqlite_database: str, make_app: App
) -> None:
    """Inside a running event loop, an AsyncSession's commit runs an async handler (on outbox's
    own loop) before it returns."""
    app = make_app(sqlite_database)
    handled: list[int] = []

    @app.handler(ActivityEvent, name="sink")
    async def sink(batch: Batch[ActivityEvent]) -> None:
        await asyncio.sleep(0)
        handled.extend(event.activity_id for event in batch.events)

    async_url = make_url(sqlite_database).set(drivername="sqlite+aiosqlite")

    async def write() -> list[int]:
        engine = create_async_engine(async_url)
        try:
            async with AsyncSession(engine) as session:
                session.add(ActivityEvent(activity_id=3))
                await session.commit()
                return list(handled)
        finally:
            await engine.dispose()

    with inline(app):
        seen = asyncio.run(write())
    assert [3] == seen


@pytest.mark.parametrize(
    ("given", "options", "message"),
    [
        ("app", {}, "inline takes an Outbox, got str"),
        (None, {"handlers": "sink"}, "handlers is a list of handler names, got the text 'sink'"),
        (None, {"max_rounds": 0}, "max_rounds must be >= 1, got 0"),
    ],
)
def test_inline_refuses_bad_input(
    given: Any, options: dict[str, Any], message: str, sqlite_database: str, make_app: App
) -> None:
    """What is not an Outbox, handler names given as one text, and no rounds are refused."""
    app = make_app(sqlite_database)
    _recorded(app)
    with pytest.raises((TypeError, ValueError)) as raised:
        inline(app if given is None else given, **options)
    assert message == str(raised.value)


def test_drain_raises_the_failures_it_ran_into(sqlite_database: str, make_app: App) -> None:
    """An explicit ``drain()`` raises HandlerFailedError for the failed attempts it ran."""
    app = make_app(sqlite_database)
    _failing(app, RetryPolicy(max_attempts=3))
    with inline(app) as runner:
        with app.engine.begin() as conn:
            add_events(conn, EmailEvent, [{"address": "a@example.com"}])
        with pytest.raises(HandlerFailedError) as raised:
            runner.drain()
    assert ["mailer"] == [result.handler for result in raised.value.results]


def test_drain_outside_the_block_is_refused(sqlite_database: str, make_app: App) -> None:
    """An inline executor runs nothing outside its block: ``drain()`` there says so."""
    app = make_app(sqlite_database)
    _recorded(app)
    runner = inline(app)
    with pytest.raises(RuntimeError) as raised:
        runner.drain()
    assert "the inline executor runs inside its with block only" == str(raised.value)
