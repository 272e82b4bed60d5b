"""A worker on a schema it may not work on: refused at start, and stopped while it runs.

The database says in ``outbox_schema`` which worker generations may work on it. A worker too
old for it, or newer than a schema downgraded under it, takes no new work, finishes what it
holds, and says why in one log line.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from alembic import command
from sqlalchemy import delete, func, select, update
from structlog.testing import capture_logs

from outbox import Batch, Outbox, SchemaIncompatibleError, Settings, schema
from outbox._core import log as _log
from outbox._core.version import VERSION
from outbox.ops.migrate import alembic_config, migrate
from outbox.worker import Worker
from tests._support import wait_for
from tests.models import ActivityEvent

# Heartbeats, and so looks at the schema, every half second.
FAST = Settings(poll_interval=0.05, rescue_interval=0.2, lease_seconds=1.5, worker_stale_after=1.5)
BATCH = 5


class Gate:
    """A handler that records what it was given, and holds its first batch until opened."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.entered = threading.Event()
        self.opened = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, batch: Batch[Any]) -> None:
        self.entered.set()
        self.opened.wait(timeout=30)
        with self._lock:
            self.ids.extend(e.id for e in batch.events)

    def handled(self) -> list[int]:
        with self._lock:
            return sorted(self.ids)


@pytest.fixture
def gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.opened.set()


@pytest.fixture
def app(make_app: Callable[..., Outbox], database_url: str, gate: Gate) -> Outbox:
    app = make_app(database_url, FAST)
    app.handler(ActivityEvent, name="activities", batch_size=BATCH)(gate)
    return app


def _set_schema(app: Outbox, **values: int) -> None:
    with app.engine.begin() as conn:
        conn.execute(update(schema.schema_state).values(**values))


def _unclaimed(app: Outbox) -> int:
    with app.engine.connect() as conn:
        query = select(func.count()).where(ActivityEvent.__table__.c.group_id.is_(None))
        return int(conn.execute(query).scalar_one())


class Run:
    """A worker running in a thread, and what its run() returned."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.clean: bool | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        self.clean = self.worker.run()

    def ended(self) -> bool:
        return not self.thread.is_alive()


@pytest.fixture
def run() -> Iterator[Callable[[Worker], Run]]:
    """Start workers in threads; abort and join those still running after the test."""
    runs: list[Run] = []

    def start(worker: Worker) -> Run:
        runs.append(Run(worker))
        return runs[-1]

    yield start
    for started in runs:
        started.worker.abort()
        started.thread.join(timeout=10)


def test_a_worker_refuses_to_start_on_a_schema_that_needs_newer_workers(app: Outbox) -> None:
    """Worker.run() raises naming both generations, before it registers itself."""
    _set_schema(app, generation=schema.GENERATION + 2, workers_from=schema.GENERATION + 1)
    with pytest.raises(SchemaIncompatibleError) as raised:
        Worker(app, burst=True).run()
    with app.engine.connect() as conn:
        workers = conn.execute(select(func.count()).select_from(schema.workers)).scalar_one()
    error = raised.value
    assert (schema.GENERATION + 2, schema.GENERATION + 1, schema.GENERATION, 0) == (
        error.generation,
        error.workers_from,
        error.worker_generation,
        workers,
    )


def test_a_worker_refuses_to_start_on_a_schema_downgraded_below_its_generation(
    app: Outbox,
) -> None:
    """A schema older than the worker's generation: refused, in one line that says so."""
    _set_schema(app, generation=schema.GENERATION - 1)
    with pytest.raises(SchemaIncompatibleError) as raised:
        Worker(app, burst=True).run()
    message = str(raised.value)
    needs = f"at generation {schema.GENERATION - 1} and outbox {VERSION} needs generation "
    assert (True, 1) == (needs in message, len(message.splitlines()))


def test_a_running_worker_stops_taking_work_once_the_schema_needs_newer_workers(
    app: Outbox, gate: Gate, commit_events: Callable[..., list[int]], run: Callable[..., Run]
) -> None:
    """The group it holds is handled; the events written after are left; run() ends clean."""
    first = commit_events(app.engine, BATCH)
    running = run(Worker(app, concurrency=1))
    wait_for(gate.entered.is_set, "the worker to hold the first group")
    with capture_logs() as logs:
        _set_schema(app, generation=schema.GENERATION + 1, workers_from=schema.GENERATION + 1)
        wait_for(lambda: running.worker.schema_incompatible, "the worker to see the schema")
        commit_events(app.engine, BATCH)
        gate.opened.set()
        wait_for(running.ended, "the worker to stop")
    said = [e for e in logs if e["event"] == _log.WORKER_SCHEMA_INCOMPATIBLE]
    assert (True, first, BATCH) == (running.clean, gate.handled(), _unclaimed(app))
    assert [(schema.GENERATION + 1, schema.GENERATION)] == [
        (e["workers_from"], e["worker_generation"]) for e in said
    ]


def test_a_running_worker_stops_when_the_schema_is_downgraded_under_it(
    app: Outbox, gate: Gate, run: Callable[..., Run]
) -> None:
    """outbox_schema gone (a downgrade below generation 5): the worker stops and says so."""
    gate.opened.set()
    running = run(Worker(app, concurrency=1))
    wait_for(lambda: running.worker.leading, "the worker to heartbeat")
    schema.schema_state.drop(app.engine)
    wait_for(running.ended, "the worker to stop")
    problem = running.worker.schema_incompatible
    assert (None, True) == (
        None if problem is None else problem.generation,
        "outbox_schema is gone" in str(problem),
    )


def test_a_running_worker_stops_on_a_downgraded_schema_though_its_heartbeat_fails_first(
    app: Outbox, gate: Gate, run: Callable[..., Run]
) -> None:
    """Tables taken back to 0004 and the worker's row gone (pruned): the heartbeat's insert
    fails (no generation column) before the schema is looked at; the worker stops all the same,
    and says why once."""
    gate.opened.set()
    command.stamp(alembic_config(app.engine), "head")
    running = run(Worker(app, concurrency=1))
    wait_for(lambda: running.worker.leading, "the worker to heartbeat")
    with capture_logs() as logs:
        migrate(app.engine, "0004", accept_losses=True)
        with app.engine.begin() as conn:
            conn.execute(delete(schema.workers))
        wait_for(running.ended, "the worker to stop")
    said = [e["reason"] for e in logs if e["event"] == _log.WORKER_SCHEMA_INCOMPATIBLE]
    assert [str(running.worker.schema_incompatible)] == said
