"""outbox's engine through PgBouncer in transaction mode, and directly, side by side."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DBAPIError

from outbox import Outbox, Settings
from outbox._db.dialects import behind_pooler
from outbox.ops import notify
from outbox.worker import Worker
from tests._support import wait_for
from tests.models import ActivityEvent

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]

WAIT_SECONDS = 15.0
EXECUTIONS = 20
"""Well past psycopg's prepare_threshold (5): its statements would be prepared by now."""


@pytest.fixture
def apps() -> Iterator[Callable[..., Outbox]]:
    """Outbox applications on a URL, with settings; their engines are disposed after."""
    made: list[Outbox] = []

    def make(url: str, **settings: Any) -> Outbox:
        app = Outbox(url, settings=Settings(**settings))
        made.append(app)
        return app

    yield make
    for app in made:
        app.engine.dispose()


def _statements(engine: Engine) -> list[str]:
    """Every statement the engine sends from now on, as sent."""
    sent: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: sent.append(args[2]))
    return sent


def test_outbox_connects_through_the_pooler(pooled_url: str, apps: Callable[..., Outbox]) -> None:
    """A query runs through PgBouncer, whether it refuses or ignores the startup options."""
    app = apps(pooled_url)
    with app.engine.connect() as conn:
        assert 1 == conn.execute(text("SELECT 1")).scalar_one()


def test_the_pooler_is_detected(pooled_url: str, apps: Callable[..., Outbox]) -> None:
    """After its first connection, an engine through PgBouncer knows a pooler is in front."""
    app = apps(pooled_url)
    with app.engine.connect():
        pass
    assert behind_pooler(app.engine)


def test_a_direct_connection_is_not_taken_for_a_pooler(
    postgres_database: str, apps: Callable[..., Outbox]
) -> None:
    """Connected to PostgreSQL itself, an engine is not behind a pooler."""
    app = apps(postgres_database)
    with app.engine.connect():
        pass
    assert not behind_pooler(app.engine)


def test_a_direct_transaction_sends_nothing_but_its_own_statements(
    postgres_database: str, apps: Callable[..., Outbox]
) -> None:
    """Directly connected, the timeout is a startup parameter: no statement per transaction."""
    app = apps(postgres_database)
    with app.engine.connect():
        pass  # the connection's one-off check is not part of the transaction below
    sent = _statements(app.engine)
    with app.engine.begin() as conn:
        conn.execute(text("SELECT 1"))
    assert ["SELECT 1"] == sent


def test_a_pooled_transaction_sets_the_timeout_first(
    pooled_url: str, apps: Callable[..., Outbox]
) -> None:
    """Through the pooler, each transaction begins by setting the timeout to the lease."""
    app = apps(pooled_url, lease_seconds=7.5)
    with app.engine.connect():
        pass
    sent = _statements(app.engine)
    with app.engine.begin() as conn:
        conn.execute(text("SELECT 1"))
    assert ["SET LOCAL idle_in_transaction_session_timeout = 7500", "SELECT 1"] == sent


def test_the_idle_transaction_timeout_is_enforced_through_the_pooler(
    pooled_url: str, postgres_database: str, apps: Callable[..., Outbox], connect: Any
) -> None:
    """A transaction left idle past the lease is ended by the server, pooler or not."""
    app = apps(pooled_url, lease_seconds=1.0)
    observer = connect(postgres_database)
    with app.engine.connect() as conn:
        server_pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()

        def ended() -> bool:
            with observer.connect() as look:
                sessions = look.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": server_pid},
                )
                return sessions.scalar_one() == 0

        wait_for(ended, "the server to end the idle transaction")
        with pytest.raises(DBAPIError):  # the server's FATAL, or the closed connection
            conn.execute(text("SELECT 1"))


def test_statements_run_many_times_through_the_pooler(
    pooled_url: str, apps: Callable[..., Outbox]
) -> None:
    """Two connections taking turns run one statement 20 times each: none is prepared."""
    app = apps(pooled_url)
    results = []
    with app.engine.connect() as first, app.engine.connect() as second:
        for n in range(EXECUTIONS):
            for conn in (first, second):
                results.append(conn.execute(text("SELECT CAST(:n AS int)"), {"n": n}).scalar())
                conn.commit()
    assert [n for n in range(EXECUTIONS) for _ in (1, 2)] == results


def test_a_worker_behind_the_pooler_polls_instead_of_listening(
    pooled_url: str, apps: Callable[..., Outbox], commit_events: Any
) -> None:
    """A worker through PgBouncer starts no listener and still handles new events."""
    app = apps(pooled_url, poll_interval=0.2)
    handled: list[int] = []
    app.handler(ActivityEvent, batch_size=10, name="collect")(
        lambda batch: handled.extend(e.id for e in batch.events)
    )
    notify.install(app)
    worker = Worker(app, concurrency=2, distribute_every=0.2)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        ids = commit_events(app.engine, 25)
        wait_for(lambda: sorted(handled) == ids, "the worker to handle every event")
    finally:
        worker.stop()
        thread.join(WAIT_SECONDS)
    assert (None, ids) == (worker._listener, sorted(handled))
