"""The worker: drains in burst mode, takes work by urgency, rescues, heartbeats, drain()."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, event, select, update

from outbox import Batch, Outbox, RetryPolicy, Settings, Urgency, add_events, schema
from outbox._db import run_in_transaction
from outbox._db.dialects import db_now_plus
from outbox._db.queries import acquire_jobs
from outbox._engine import claimer
from outbox.testing import drain
from outbox.worker import Worker
from tests._support import wait_for
from tests.models import ActivityEvent, EmailEvent

FAST = Settings(poll_interval=0.05, rescue_interval=0.05)


class Recorder:
    """A handler that records the events it was given, in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self._lock = threading.Lock()

    def __call__(self, batch: Batch[Any]) -> None:
        with self._lock:
            self.calls.append((batch.handler, [e.id for e in batch.events]))

    @property
    def handled(self) -> list[int]:
        return sorted(i for _, ids in self.calls for i in ids)


@pytest.fixture
def app(make_app: Callable[[str], Outbox], database_url: str) -> Outbox:
    app = make_app(database_url)
    app.settings = FAST
    return app


@pytest.fixture
def running() -> Iterator[Callable[[Worker], threading.Thread]]:
    """Start workers in threads; stop and join them after the test."""
    started: list[tuple[Worker, threading.Thread]] = []

    def start(worker: Worker) -> threading.Thread:
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        started.append((worker, thread))
        return thread

    yield start
    for worker, thread in started:
        worker.abort()
        thread.join(timeout=10)


def buffer_count(app: Outbox, model: type[Any] = ActivityEvent) -> int:
    with app.engine.connect() as conn:
        return len(list(conn.execute(select(model.id))))


def worker_rows(app: Outbox) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(select(schema.workers)))


# --- burst mode -----------------------------------------------------------------------------


def test_burst_run_drains_everything_and_returns(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A burst worker distributes, claims and handles every event, then returns."""
    recorder = Recorder()
    app.handler(ActivityEvent, batch_size=7, name="sync")(recorder)
    ids = commit_events(app.engine, 40)
    clean = Worker(app, concurrency=3, burst=True).run()
    assert (True, ids, 0) == (clean, recorder.handled, buffer_count(app))


def test_burst_run_leaves_no_jobs_behind(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """After a burst run over succeeding handlers, the job table is empty."""
    app.handler(ActivityEvent, batch_size=7, name="sync")(Recorder())
    commit_events(app.engine, 20)
    Worker(app, concurrency=2, burst=True).run()
    with app.engine.connect() as conn:
        assert [] == list(conn.execute(select(schema.jobs)))


def test_burst_run_counts_what_it_did(app: Outbox, commit_events: Callable[..., list[int]]) -> None:
    """The worker's stats count claims, groups and events."""
    app.handler(ActivityEvent, batch_size=10, name="sync")(Recorder())
    commit_events(app.engine, 25)
    worker = Worker(app, concurrency=2, burst=True)
    worker.run()
    stats = worker.stats
    assert (3, 3, 25) == (stats.claims, stats.groups_succeeded, stats.events_succeeded)


def test_burst_run_on_empty_buffers_returns_at_once(app: Outbox) -> None:
    """Nothing to do is not a reason to wait."""
    app.handler(ActivityEvent, name="sync")(Recorder())
    started = time.monotonic()
    Worker(app, burst=True).run()
    assert time.monotonic() - started < 5.0


def test_burst_run_serves_only_the_named_handlers(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A worker for some handlers leaves the buffers of the others alone."""
    recorder = Recorder()
    app.handler(ActivityEvent, name="activities")(recorder)
    app.handler(EmailEvent, name="emails")(recorder)
    commit_events(app.engine, 3, ActivityEvent)
    commit_events(app.engine, 3, EmailEvent)
    Worker(app, handlers=["emails"], burst=True).run()
    assert ({"emails"}, 3) == ({h for h, _ in recorder.calls}, buffer_count(app))


def test_burst_run_leaves_retries_that_are_not_due(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A failed group waiting for its backoff does not keep a burst worker busy."""

    def fail(batch: Batch[Any]) -> None:
        raise RuntimeError("down")

    app.handler(ActivityEvent, name="sync", retry=RetryPolicy(base_delay=60.0))(fail)
    commit_events(app.engine, 3)
    worker = Worker(app, burst=True)
    worker.run()
    assert (1, 3) == (worker.stats.groups_retried, buffer_count(app))


# --- ordering ------------------------------------------------------------------------------


def test_higher_urgency_groups_run_first(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A REALTIME handler's groups run before a WEEK handler's, even if claimed later."""
    recorder = Recorder()
    app.handler(EmailEvent, name="weekly", batch_size=2, urgency=Urgency.WEEK)(recorder)
    app.handler(ActivityEvent, name="realtime", batch_size=2, urgency=Urgency.REALTIME)(recorder)
    commit_events(app.engine, 4, EmailEvent)
    commit_events(app.engine, 4, ActivityEvent)
    for name in ("weekly", "weekly", "realtime", "realtime"):
        claimer.run_once(app, app.get_handler(name))
    drain(app)
    assert ["realtime", "realtime", "weekly", "weekly"] == [h for h, _ in recorder.calls]


def test_within_a_band_the_longest_due_runs_first(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Among jobs of one priority, the one due earliest is taken first."""
    recorder = Recorder()
    app.handler(ActivityEvent, batch_size=2, name="sync")(recorder)
    ids = commit_events(app.engine, 4)
    handler = app.get_handler("sync")
    claimer.run_once(app, handler)
    second = claimer.run_once(app, handler)
    assert second is not None
    with app.engine.begin() as conn:
        conn.execute(
            update(schema.jobs)
            .where(schema.jobs.c.group_id == second.group_id)
            .values(run_at=db_now_plus(-60.0))
        )
    drain(app)
    assert [ids[2:], ids[:2]] == [event_ids for _, event_ids in recorder.calls]


# --- rescue --------------------------------------------------------------------------------


def lease_and_abandon(app: Outbox) -> None:
    """Lease every due job for a worker that then dies without a trace."""
    run_in_transaction(
        app.engine,
        lambda conn: acquire_jobs(
            conn,
            app.dialect,
            handlers=list(app.handlers),
            worker_id="dead-worker",
            token=uuid.uuid4(),
            limit=100,
            lease_seconds=60.0,
        ),
    )


def expire_leases(app: Outbox) -> None:
    with app.engine.begin() as conn:
        conn.execute(
            update(schema.jobs)
            .where(schema.jobs.c.lease_token.is_not(None))
            .values(lease_expires_at=db_now_plus(-1.0))
        )


def test_expired_lease_is_rescued_and_handled_by_another_worker(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A job whose lease ran out is freed and handled by the next worker."""
    recorder = Recorder()
    app.handler(ActivityEvent, name="sync")(recorder)
    ids = commit_events(app.engine, 3)
    claimer.run_once(app, app.get_handler("sync"))
    lease_and_abandon(app)
    expire_leases(app)
    Worker(app, burst=True).run()
    assert (ids, 0) == (recorder.handled, buffer_count(app))


def test_live_lease_is_not_rescued(app: Outbox, commit_events: Callable[..., list[int]]) -> None:
    """A job leased by a live worker is left alone."""
    recorder = Recorder()
    app.handler(ActivityEvent, name="sync")(recorder)
    commit_events(app.engine, 3)
    claimer.run_once(app, app.get_handler("sync"))
    lease_and_abandon(app)
    worker = Worker(app, burst=True)
    rescued = worker.rescue()
    worker.run()
    assert (0, [], 3) == (rescued, recorder.handled, buffer_count(app))


def test_rescue_keeps_the_attempt_and_says_why(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """The rescued job keeps the attempt the dead worker started and records the reason."""
    app.handler(ActivityEvent, name="sync")(Recorder())
    commit_events(app.engine, 1)
    claimer.run_once(app, app.get_handler("sync"))
    lease_and_abandon(app)
    expire_leases(app)
    rescued = Worker(app).rescue()
    with app.engine.connect() as conn:
        job = conn.execute(select(schema.jobs)).one()
    assert (1, 1, None, None, "lease expired") == (
        rescued,
        job.attempts,
        job.lease_token,
        job.lease_owner,
        job.last_error[: len("lease expired")],
    )


def test_rescued_job_on_its_last_attempt_is_dead_lettered(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A group whose worker died during the last allowed attempt is archived as dead."""
    recorder = Recorder()
    app.handler(ActivityEvent, name="sync", retry=RetryPolicy(max_attempts=1))(recorder)
    ids = commit_events(app.engine, 2)
    claimer.run_once(app, app.get_handler("sync"))
    lease_and_abandon(app)
    expire_leases(app)
    drain(app)
    with app.engine.connect() as conn:
        archived = list(conn.execute(select(schema.archive).order_by(schema.archive.c.event_id)))
    assert ([], [(i, "dead") for i in ids], 0) == (
        recorder.calls,
        [(r.event_id, r.status) for r in archived],
        buffer_count(app),
    )


# --- heartbeats and stopping -----------------------------------------------------------------


def test_running_worker_registers_itself(
    app: Outbox, running: Callable[[Worker], threading.Thread]
) -> None:
    """A running worker has a row in outbox_workers with its concurrency."""
    app.handler(ActivityEvent, name="sync")(Recorder())
    worker = Worker(app, concurrency=3)
    running(worker)
    rows = wait_for(lambda: worker_rows(app), what="the worker row")
    assert [(worker.id, 3)] == [(r.id, r.concurrency) for r in rows]


def test_running_worker_heartbeats(
    make_app: Callable[[str], Outbox],
    database_url: str,
    running: Callable[[Worker], threading.Thread],
) -> None:
    """A running worker keeps moving its heartbeat forward."""
    app = make_app(database_url)
    app.settings = Settings(poll_interval=0.05, lease_seconds=0.3)
    app.handler(ActivityEvent, name="sync")(Recorder())
    worker = Worker(app)
    running(worker)
    (first,) = wait_for(lambda: worker_rows(app), what="the worker row")
    later = wait_for(
        lambda: [r for r in worker_rows(app) if r.heartbeat_at > first.heartbeat_at],
        what="a later heartbeat",
    )
    assert [worker.id] == [r.id for r in later]


def first_heartbeat(app: Outbox) -> threading.Event:
    """An event set once a heartbeat transaction of the application's workers has committed."""
    committed = threading.Event()
    in_heartbeat = threading.local()

    @event.listens_for(app.engine, "after_cursor_execute")
    def seen(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("UPDATE outbox_workers SET heartbeat_at"):
            in_heartbeat.value = True

    @event.listens_for(app.engine, "commit")
    def done(conn: Connection) -> None:
        if getattr(in_heartbeat, "value", False):
            committed.set()

    return committed


def test_stopped_worker_removes_its_row(
    app: Outbox, running: Callable[[Worker], threading.Thread]
) -> None:
    """stop() ends run() cleanly and unregisters the worker."""
    app.handler(ActivityEvent, name="sync")(Recorder())
    worker = Worker(app)
    heartbeat = first_heartbeat(app)
    thread = running(worker)
    # Stop between heartbeats (the next is lease_seconds / 3 away): a heartbeat racing the stop
    # is the subject of the next test.
    wait_for(heartbeat.is_set, what="the first heartbeat")
    worker.stop()
    thread.join(timeout=10)
    assert (False, []) == (thread.is_alive(), worker_rows(app))


def test_heartbeat_racing_a_stop_does_not_bring_the_row_back(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    running: Callable[[Worker], threading.Thread],
) -> None:
    """A heartbeat that was under way when the worker stopped leaves no row behind."""
    app = make_app(postgres_database)
    app.settings = Settings(poll_interval=0.05, lease_seconds=0.3)
    app.handler(ActivityEvent, name="sync")(Recorder())
    worker = Worker(app)
    armed, paused = threading.Event(), threading.Event()

    @event.listens_for(app.engine, "before_cursor_execute")
    def hold_heartbeat(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        # Hold one heartbeat just before its UPDATE until the stopping worker has unregistered.
        if armed.is_set() and statement.startswith("UPDATE outbox_workers SET heartbeat_at"):
            armed.clear()
            paused.set()
            deadline = time.monotonic() + 2.0
            while worker_rows(app) and time.monotonic() < deadline:
                time.sleep(0.02)

    thread = running(worker)
    wait_for(lambda: worker_rows(app), what="the worker row")
    armed.set()
    wait_for(paused.is_set, what="a heartbeat")
    worker.stop()
    thread.join(timeout=10)
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.name == "outbox-maintenance"],
        what="the maintenance thread to end",
    )
    assert [] == worker_rows(app)


def test_running_worker_handles_new_events(
    app: Outbox,
    commit_events: Callable[..., list[int]],
    running: Callable[[Worker], threading.Thread],
) -> None:
    """A long-running worker with periodic distribution handles events committed later."""
    recorder = Recorder()
    app.handler(ActivityEvent, batch_size=5, name="sync")(recorder)
    running(Worker(app, distribute_every=0.05))
    ids = commit_events(app.engine, 12)
    wait_for(lambda: len(recorder.handled) >= len(ids), what="every event to be handled")
    assert ids == recorder.handled


def test_the_leader_starts_on_what_it_distributed_without_waiting_to_poll(
    app: Outbox,
    commit_events: Callable[..., list[int]],
    running: Callable[[Worker], threading.Thread],
) -> None:
    """No notifications and a poll a minute away: the claim jobs the leader enqueues wake it,
    and the events are handled at once rather than at its next poll."""
    app.settings = Settings(poll_interval=60.0, listen=False)
    recorder = Recorder()
    app.handler(ActivityEvent, batch_size=5, name="sync")(recorder)
    running(Worker(app, distribute_every=0.05))
    ids = commit_events(app.engine, 12)
    wait_for(lambda: len(recorder.handled) >= len(ids), what="every event", timeout=10)
    assert ids == recorder.handled


# --- outbox.testing.drain --------------------------------------------------------------------


def test_drain_handles_everything_due(app: Outbox, commit_events: Callable[..., list[int]]) -> None:
    """drain() runs distribution, claims and batch jobs until nothing is due."""
    recorder = Recorder()
    app.handler(ActivityEvent, name="activities", batch_size=4)(recorder)
    app.handler(EmailEvent, name="emails", batch_size=4)(recorder)
    activity_ids = commit_events(app.engine, 10, ActivityEvent)
    email_ids = commit_events(app.engine, 5, EmailEvent)
    drain(app)
    handled = {
        name: sorted(i for h, ids in recorder.calls if h == name for i in ids)
        for name in ("activities", "emails")
    }
    assert {"activities": activity_ids, "emails": email_ids} == handled


def test_drain_reports_what_it_did(app: Outbox, commit_events: Callable[..., list[int]]) -> None:
    """drain() returns the worker's stats: groups claimed, groups and events handled."""
    app.handler(ActivityEvent, batch_size=4, name="sync")(Recorder())
    commit_events(app.engine, 10)
    stats = drain(app).stats
    assert (3, 3, 10) == (stats.claims, stats.groups_succeeded, stats.events_succeeded)


def test_drain_of_nothing_runs_nothing(app: Outbox) -> None:
    """drain() on empty buffers returns at once with no jobs run."""
    app.handler(ActivityEvent, name="sync")(Recorder())
    assert 0 == drain(app).jobs


def test_drain_gives_up_on_endless_work(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A handler that keeps producing work makes drain() raise instead of spinning forever."""

    def produce_more(batch: Batch[Any]) -> None:
        with app.engine.begin() as conn:
            add_events(conn, ActivityEvent, [{"activity_id": 0}])

    app.handler(ActivityEvent, name="sync")(produce_more)
    commit_events(app.engine, 1)
    with pytest.raises(RuntimeError, match="did not finish within 5 rounds"):
        drain(app, max_rounds=5)


def test_a_worker_whose_counts_cannot_be_written_still_leaves_the_fleet(
    app: Outbox, commit_events: Callable[..., list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database refusing the throughput write at shutdown: the worker's row is deleted all
    the same, and the events it handled stay handled."""
    from sqlalchemy.exc import OperationalError

    from outbox._services.throughput import Throughput

    def refuse(self: Throughput) -> int:
        raise OperationalError("INSERT INTO outbox_throughput", {}, Exception("refused"))

    monkeypatch.setattr(Throughput, "run_once", refuse)
    app.handler(ActivityEvent, name="sync")(Recorder())
    commit_events(app.engine, 3)
    Worker(app, burst=True).run()
    assert ([], 0) == (worker_rows(app), buffer_count(app))
