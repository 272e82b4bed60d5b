"""A buffer table that does not exist: workers, drain() and run_once() say so and lose nothing.

A missing table is a deploy error, not a database outage and not the handler's failure: jobs
that meet it are given back with their attempt uncounted, its handler is set aside (one log
line), and the other handlers go on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped
from structlog.testing import capture_logs

from outbox import (
    Batch,
    BufferMixin,
    BufferTableMissingError,
    Outbox,
    RetryPolicy,
    Settings,
    schema,
)
from outbox._db import missing_buffer_tables
from outbox._engine import claimer, distributor
from outbox.testing import drain
from outbox.worker import Worker
from tests._support import wait_for
from tests.models import ActivityEvent, EmailEvent

FAST = Settings(poll_interval=0.05, rescue_interval=0.05)
MISSING = {"emails": "test_email_events"}
AWAY = "test_email_events_away"


class Recorder:
    """A handler that records the ids of the events it was given."""

    def __init__(self) -> None:
        self.ids: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def __call__(self, batch: Batch[Any]) -> None:
        with self._lock:
            self.ids.setdefault(batch.handler, []).extend(e.id for e in batch.events)

    def handled(self, handler: str) -> list[int]:
        with self._lock:
            return sorted(self.ids.get(handler, []))


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def app(
    make_app: Callable[[str], Outbox], database_url: str, recorder: Recorder
) -> Iterator[Outbox]:
    """Two handlers: ``activities`` and ``emails`` (whose table the tests take away)."""
    app = make_app(database_url)
    app.settings = FAST
    app.handler(ActivityEvent, name="activities", batch_size=5)(recorder)
    app.handler(EmailEvent, name="emails", batch_size=5, retry=RetryPolicy(max_attempts=1))(
        recorder
    )
    yield app
    # A table renamed away keeps its indexes' names, which the next test's tables need.
    with app.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {AWAY}"))


@pytest.fixture
def running() -> Iterator[Callable[[Worker], None]]:
    """Start workers in threads; stop and join them after the test."""
    started: list[tuple[Worker, threading.Thread]] = []

    def start(worker: Worker) -> None:
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        started.append((worker, thread))

    yield start
    for worker, thread in started:
        worker.abort()
        thread.join(timeout=10)


def drop_email_table(app: Outbox) -> None:
    EmailEvent.__table__.drop(app.engine)


def rename(app: Outbox, old: str, new: str) -> None:
    with app.engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))


def jobs(app: Outbox) -> list[tuple[str, str, int, bool]]:
    """(kind, handler, attempts, leased) of every job, by id."""
    j = schema.jobs
    with app.engine.connect() as conn:
        rows = conn.execute(
            select(j.c.kind, j.c.handler, j.c.attempts, j.c.lease_token.is_not(None)).order_by(
                j.c.id
            )
        )
        return [(kind, handler, attempts, bool(leased)) for kind, handler, attempts, leased in rows]


# --- at start -------------------------------------------------------------------------------


def test_drain_with_a_buffer_table_missing_raises_naming_table_and_handler(app: Outbox) -> None:
    """drain() raises BufferTableMissingError naming the handler and its table."""
    drop_email_table(app)

    with pytest.raises(BufferTableMissingError) as raised:
        drain(app)

    assert MISSING == raised.value.missing


def test_worker_with_a_buffer_table_missing_refuses_to_start(app: Outbox) -> None:
    """Worker.run() raises before it registers itself or runs anything."""
    drop_email_table(app)

    with pytest.raises(BufferTableMissingError):
        Worker(app, burst=True).run()

    with app.engine.connect() as conn:
        assert [] == list(conn.execute(select(schema.workers)))


def test_burst_worker_of_the_other_handlers_runs_while_a_table_is_missing(
    app: Outbox, recorder: Recorder, commit_events: Callable[..., list[int]]
) -> None:
    """A worker given only the handlers whose tables exist drains them."""
    ids = commit_events(app.engine, 12)
    drop_email_table(app)

    Worker(app, burst=True, handlers=["activities"]).run()

    assert ids == recorder.handled("activities")


# --- met while running ------------------------------------------------------------------------


def test_run_once_meeting_a_dropped_table_raises_and_gives_claim_jobs_back_uncounted(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Claim jobs whose table went missing are given back unleased, their attempt uncounted."""
    commit_events(app.engine, 12, EmailEvent)
    distributor.run_once(app)
    drop_email_table(app)

    with pytest.raises(BufferTableMissingError) as raised:
        Worker(app, concurrency=10).run_once()

    assert (MISSING, [("claim", "emails", 0, False)] * 3) == (raised.value.missing, jobs(app))


def test_batch_job_whose_table_is_gone_keeps_its_attempts(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A group's batch job that cannot read its table is given back, not dead-lettered."""
    commit_events(app.engine, 3, EmailEvent)
    claimer.run_once(app, app.get_handler("emails"))  # the group's batch job, not leased
    rename(app, "test_email_events", AWAY)
    worker = Worker(app)

    with pytest.raises(BufferTableMissingError):
        worker.run_once()

    assert [("batch", "emails", 0, False)] == jobs(app)


def test_batch_job_whose_table_comes_back_is_handled_on_its_first_attempt(
    app: Outbox, recorder: Recorder, commit_events: Callable[..., list[int]]
) -> None:
    """Renamed away and back, the table's group is handled: nothing lost, nothing dead."""
    ids = commit_events(app.engine, 3, EmailEvent)
    claimer.run_once(app, app.get_handler("emails"))
    rename(app, "test_email_events", AWAY)
    with pytest.raises(BufferTableMissingError):
        Worker(app).run_once()
    rename(app, AWAY, "test_email_events")

    stats = drain(app).stats

    assert (ids, 1, 0) == (recorder.handled("emails"), stats.groups_succeeded, stats.groups_dead)


def test_running_worker_sets_a_dropped_table_aside_and_keeps_the_others_working(
    app: Outbox,
    recorder: Recorder,
    commit_events: Callable[..., list[int]],
    running: Callable[[Worker], None],
) -> None:
    """One error line names the table, no database outage is reported, the others go on."""
    worker = Worker(app, distribute_every=0.05)
    with capture_logs() as logs:
        running(worker)
        wait_for(lambda: worker.leading, "the worker to start and lead distribution")
        drop_email_table(app)
        wait_for(lambda: worker.missing_tables, "the worker to notice the table is gone")
        ids = commit_events(app.engine, 12)
        wait_for(lambda: recorder.handled("activities") == ids, "the other handler's events")
    events = [entry["event"] for entry in logs]

    assert (MISSING, 1, 0) == (
        worker.missing_tables,
        events.count("outbox.worker.buffer_table_missing"),
        events.count("outbox.worker.database_error"),
    )


def test_running_worker_takes_a_handler_back_when_its_table_is_back(
    app: Outbox,
    recorder: Recorder,
    commit_events: Callable[..., list[int]],
    running: Callable[[Worker], None],
) -> None:
    """A table renamed away and back: the handler is served again and handles new events."""
    worker = Worker(app, distribute_every=0.05)
    running(worker)
    wait_for(lambda: worker.leading, "the worker to start and lead distribution")
    rename(app, "test_email_events", AWAY)
    wait_for(lambda: worker.missing_tables, "the worker to notice the table is gone")
    rename(app, AWAY, "test_email_events")
    wait_for(lambda: not worker.missing_tables, "the worker to take the handler back")
    ids = commit_events(app.engine, 12, EmailEvent)

    wait_for(lambda: recorder.handled("emails") == ids, "the events of the table that came back")


# --- schemas --------------------------------------------------------------------------------

SCHEMA = "outbox_elsewhere"


class ElsewhereBase(DeclarativeBase):
    pass


class ElsewhereEvent(BufferMixin, ElsewhereBase):
    __tablename__ = "elsewhere_events"
    __table_args__: ClassVar[dict[str, str]] = {"schema": SCHEMA}
    value: Mapped[int]


@pytest.fixture
def postgres_engine(postgres_database: str) -> Iterator[Engine]:
    """An engine on the session's PostgreSQL database, with the schema of ElsewhereEvent."""
    engine = create_engine(postgres_database)
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    yield engine
    with engine.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
    engine.dispose()


def test_table_in_another_schema_that_exists_is_not_missing(postgres_engine: Engine) -> None:
    """A buffer table with ``schema=`` set, created there, is found."""
    ElsewhereBase.metadata.create_all(postgres_engine)
    tables = {"elsewhere": ElsewhereEvent.__table__, "activities": ActivityEvent.__table__}

    assert {} == missing_buffer_tables(postgres_engine, tables)


def test_table_in_another_schema_that_is_missing_is_named_with_its_schema(
    postgres_engine: Engine,
) -> None:
    """A missing buffer table with ``schema=`` set is named ``schema.table``."""
    tables = {"elsewhere": ElsewhereEvent.__table__, "activities": ActivityEvent.__table__}

    assert {"elsewhere": f"{SCHEMA}.elsewhere_events"} == missing_buffer_tables(
        postgres_engine, tables
    )


def test_table_found_through_the_search_path_is_not_missing(
    postgres_database: str, postgres_engine: Engine
) -> None:
    """A table without ``schema=`` that lives in a schema on the ``search_path`` is found."""
    with postgres_engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE test_email_events SET SCHEMA {SCHEMA}"))
    on_path = create_engine(
        postgres_database, connect_args={"options": f"-c search_path=public,{SCHEMA}"}
    )
    try:
        missing = missing_buffer_tables(on_path, {"emails": EmailEvent.__table__})
    finally:
        on_path.dispose()

    assert {} == missing
