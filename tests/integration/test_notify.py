"""Instant wake-ups: buffer triggers NOTIFY on commit, idle workers LISTEN and wake."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from outbox import ConfigurationError, Outbox
from outbox.ops import notify
from outbox.worker import Worker
from tests.models import ActivityEvent

WAIT_SECONDS = 10.0
SLOW_POLL_SECONDS = 120.0


def _listen(url: str) -> psycopg.Connection[tuple[object, ...]]:
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    connection = psycopg.connect(conninfo, autocommit=True)
    connection.execute("LISTEN outbox")
    return connection


@pytest.fixture
def app(postgres_database: str, make_app: Callable[[str], Outbox]) -> Outbox:
    """An app on PostgreSQL whose activity buffer has its notify trigger."""
    app = make_app(postgres_database)
    app.with_settings(poll_interval=SLOW_POLL_SECONDS)
    handled: list[int] = []
    app.handler(ActivityEvent, batch_size=10, name="collect")(
        lambda batch: handled.extend(e.id for e in batch.events)
    )
    app.handled = handled  # type: ignore[attr-defined]
    notify.install(app)
    return app


@pytest.fixture
def listener(postgres_database: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain connection listening on the outbox channel."""
    connection = _listen(postgres_database)
    yield connection
    connection.close()


def test_committed_insert_is_announced(
    app: Outbox, listener: psycopg.Connection[tuple[object, ...]]
) -> None:
    """A committed event sends its buffer's name on the outbox channel."""
    with Session(app.engine) as session:
        session.add(ActivityEvent(activity_id=1))
        session.commit()
    payloads = [n.payload for n in listener.notifies(timeout=WAIT_SECONDS, stop_after=1)]
    assert ["test_activity_events"] == payloads


def test_rolled_back_insert_is_never_announced(
    app: Outbox, listener: psycopg.Connection[tuple[object, ...]]
) -> None:
    """NOTIFY is transactional: a rolled-back event announces nothing."""
    with Session(app.engine) as session:
        session.add(ActivityEvent(activity_id=1))
        session.flush()
        session.rollback()
    assert [] == list(listener.notifies(timeout=0.5))


def test_many_rows_in_one_transaction_are_announced_once(
    app: Outbox, listener: psycopg.Connection[tuple[object, ...]]
) -> None:
    """One transaction of 100 events sends one notification, not 100."""
    with Session(app.engine) as session:
        session.add_all([ActivityEvent(activity_id=n) for n in range(100)])
        session.commit()
    assert 1 == len(list(listener.notifies(timeout=0.5)))


def test_idle_worker_wakes_on_a_notification(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A worker polling every two minutes handles a new event at once, woken by its commit."""
    worker = Worker(app, concurrency=2)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not (worker._listener and worker._listener.listening.is_set() and worker.leading):
            assert time.monotonic() < deadline, "the worker never started listening"
            time.sleep(0.01)
        ids = commit_events(app.engine, 3)
        while sorted(app.handled) != ids and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)
    finally:
        worker.stop()
        thread.join(WAIT_SECONDS)
    assert ids == sorted(app.handled)  # type: ignore[attr-defined]


def test_listening_can_be_turned_off(app: Outbox) -> None:
    """Settings(listen=False) starts no listener: the worker only polls."""
    app.with_settings(listen=False)
    worker = Worker(app, concurrency=1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    worker.stop()
    thread.join(WAIT_SECONDS)
    assert worker._listener is None


def test_triggers_need_postgresql(sqlite_url: str, make_app: Callable[[str], Outbox]) -> None:
    """Installing notify triggers on SQLite is refused with a clear error."""
    app = make_app(sqlite_url)
    app.handler(ActivityEvent, name="h")(lambda b: None)
    with pytest.raises(ConfigurationError, match="notifications need PostgreSQL"):
        notify.install(app)


def test_install_is_idempotent(
    app: Outbox, listener: psycopg.Connection[tuple[object, ...]]
) -> None:
    """Installing twice leaves one trigger: a commit is still announced exactly once."""
    notify.install(app)
    with Session(app.engine) as session:
        session.add(ActivityEvent(activity_id=1))
        session.commit()
    assert 1 == len(list(listener.notifies(timeout=0.5)))
