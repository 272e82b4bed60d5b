"""No handler call on a lease that may be lost: a claim whose commit comes back after half its
lease, or a worker the fleet has not heard from for two and a half heartbeat intervals, gives
its group back unhandled (fenced by the lease), on SQLite, PostgreSQL and MariaDB.

The danger it closes: a claim's commit acknowledged late (a slow link, a stalled process), while
the lease ran out and another worker rescued and handled the group; calling the handler then
sends the group a second time.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select
from structlog.testing import capture_logs

from outbox import Batch, Outbox, Settings, schema
from outbox._core import log as _log
from outbox._db import queries
from outbox._engine import claimer
from outbox._engine.runner import Runner, RunOutcome, lease_job
from outbox._services.heartbeat import Heartbeat
from outbox._services.rescuer import Rescuer
from outbox.testing import drain
from outbox.worker import Worker
from tests.models import ActivityEvent

LEASE_SECONDS = 2.0

Commit = Callable[..., list[int]]


def assert_buffer_empty(app: Outbox) -> None:
    with app.engine.connect() as conn:
        assert 0 == conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one()


def _recording(app: Outbox) -> list[tuple[uuid.UUID, list[int]]]:
    calls: list[tuple[uuid.UUID, list[int]]] = []

    @app.handler(ActivityEvent, batch_size=10)
    def record(batch: Batch[ActivityEvent]) -> None:
        calls.append((batch.group_id, sorted(batch.ids)))

    return calls


def test_a_claim_back_after_its_lease_ran_out_is_not_handled_where_another_worker_handled_it(
    database_url: str,
    make_app: Callable[..., Outbox],
    commit_events: Commit,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim's commit comes back after the lease ran out, by which time another worker
    has rescued the group and handled it: the late claimer calls no handler, and its give-back
    is refused by the fence. The group was sent once."""
    app = make_app(database_url, Settings(lease_seconds=LEASE_SECONDS))
    calls = _recording(app)
    ids = commit_events(app.engine, 5)
    claims: list[uuid.UUID] = []
    claimed = claimer.claimed

    def back_late(claim: claimer.Claim | None) -> None:
        claimed(claim)
        if claim is None or claims:
            return
        claims.append(claim.group_id)
        time.sleep(LEASE_SECONDS * 1.2)  # the commit's answer is on its way all this time
        assert 1 == Rescuer(app, "another-worker").run_once()
        drain(app)  # another worker handles the rescued group

    monkeypatch.setattr(claimer, "claimed", back_late)
    with capture_logs() as logs:
        Worker(app, concurrency=1, burst=True).run()
    assert [(claims[0], ids)] == calls
    too_old = [e for e in logs if e["event"] == _log.LEASE_TOO_OLD]
    assert [str(claims[0])] == [e["group_id"] for e in too_old]
    assert_buffer_empty(app)


def test_a_claim_back_after_half_its_lease_goes_back_unattempted_and_is_handled_later(
    database_url: str,
    make_app: Callable[..., Outbox],
    commit_events: Commit,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Half the lease gone before the handler could be called: the group goes back with no
    attempt counted, and the worker handles it on its first attempt under a lease of its own."""
    app = make_app(database_url, Settings(lease_seconds=LEASE_SECONDS))
    attempts: list[int] = []

    @app.handler(ActivityEvent, batch_size=10)
    def record(batch: Batch[ActivityEvent]) -> None:
        attempts.append(batch.attempt)

    commit_events(app.engine, 5)
    late: list[bool] = []
    claimed = claimer.claimed

    def back_late(claim: claimer.Claim | None) -> None:
        claimed(claim)
        if claim is not None and not late:
            late.append(True)
            time.sleep(LEASE_SECONDS * 0.6)

    monkeypatch.setattr(claimer, "claimed", back_late)
    with capture_logs() as logs:
        Worker(app, concurrency=1, burst=True).run()
    too_old = [e for e in logs if e["event"] == _log.LEASE_TOO_OLD]
    assert [True] == [e["claim_seconds"] >= LEASE_SECONDS / 2 for e in too_old]
    assert [1] == attempts
    assert_buffer_empty(app)


def test_a_worker_the_fleet_has_not_heard_from_takes_no_job_and_hands_none_over(
    database_url: str, make_app: Callable[..., Outbox], commit_events: Commit
) -> None:
    """The worker's own heartbeat, late by two and a half intervals: it leases nothing (no
    spinning through leases it would only give back), and a job already leased goes back
    unattempted; once a heartbeat gets through, it works again."""
    app = make_app(database_url, Settings(lease_seconds=30.0, worker_stale_after=3.0))
    calls = _recording(app)
    commit_events(app.engine, 5)
    assert claimer.run_once(app, app.get_handler("record")) is not None  # a due batch job
    now = [100.0]
    worker = Worker(app, concurrency=1)
    heartbeat = worker._maintenance.heartbeat_service
    heartbeat.clock = lambda: now[0]
    worker._maintenance.heartbeat()
    now[0] += 2.6  # two and a half heartbeat intervals (a second each) and more
    assert 0 == worker._fill()
    worker.run_once()  # leases the job all the same, and gives it back unhandled
    assert [] == calls
    worker._maintenance.heartbeat()
    assert 1 == worker.run_once()
    assert 1 == len(calls)


def test_a_worker_the_fleet_has_not_heard_from_for_a_while_handles_nothing(
    database_url: str, make_app: Callable[..., Outbox], commit_events: Commit
) -> None:
    """The fleet takes a worker for gone a stale age after its last heartbeat: half an
    interval before that, a group it claims goes back unhandled."""
    app = make_app(database_url, Settings(lease_seconds=30.0, worker_stale_after=3.0))
    calls = _recording(app)
    commit_events(app.engine, 5)
    now = [100.0]
    heartbeat = Heartbeat(app, "w", 1, running=list, stopping=lambda: False, clock=lambda: now[0])
    heartbeat.run_once()
    assert heartbeat.heard()
    now[0] += 2.6  # two and a half heartbeat intervals (a second each) without one
    assert not heartbeat.heard()
    runner: Any = Worker(app, concurrency=1)._runner
    runner._heard = heartbeat.heard
    claim = claimer.run_once(app, app.get_handler("record"), lease_to="w")
    assert claim is not None
    with capture_logs() as logs:
        assert runner.handle_claim(claim) is None
    assert [] == calls
    assert [False] == [e["heard_recently"] for e in logs if e["event"] == _log.LEASE_TOO_OLD]
    drain(app)
    assert 1 == len(calls)


def test_jobs_whose_leasing_came_back_after_half_the_lease_go_back_unrun(
    database_url: str,
    make_app: Callable[..., Outbox],
    commit_events: Commit,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's acquisition whose commit came back after half the lease: the jobs are given
    back unattempted and none is run; the next acquisition takes them."""
    app = make_app(database_url, Settings(lease_seconds=LEASE_SECONDS))
    calls = _recording(app)
    commit_events(app.engine, 5)
    assert claimer.run_once(app, app.get_handler("record")) is not None
    leased = queries.acquire_jobs

    def back_late(*args: Any, **kwargs: Any) -> Any:
        jobs = leased(*args, **kwargs)
        time.sleep(LEASE_SECONDS * 0.6)
        return jobs

    worker = Worker(app, concurrency=1)
    monkeypatch.setattr(queries, "acquire_jobs", back_late)
    with capture_logs() as logs:
        assert 0 == worker.run_once()
    monkeypatch.undo()
    assert [_log.LEASE_TOO_OLD] == [e["event"] for e in logs if e["log_level"] == "warning"]
    with app.engine.connect() as conn:
        (job,) = conn.execute(select(schema.jobs)).all()
    assert (0, None) == (job.attempts, job.lease_owner)
    assert 1 == worker.run_once()
    assert 1 == len(calls)


def test_a_job_an_executor_leased_late_goes_back_unrun(
    database_url: str, make_app: Callable[..., Outbox], commit_events: Commit
) -> None:
    """An executor's ``lease_job`` (the Celery executor's path) that came back after half the
    lease: the runner gives the job back unattempted, said as returned, for the executor to
    send again; its next lease runs it."""
    app = make_app(database_url, Settings(lease_seconds=LEASE_SECONDS))
    calls = _recording(app)
    commit_events(app.engine, 5)
    assert claimer.run_once(app, app.get_handler("record")) is not None
    with app.engine.connect() as conn:
        job_id = conn.execute(select(schema.jobs.c.id)).scalar_one()
    runner = Runner(app, worker_id="executor-1")
    leased_at = time.monotonic()
    job = lease_job(app, job_id, "executor-1")
    assert job is not None
    late = runner.run(job, leased_at - LEASE_SECONDS * 0.6)
    called_late = len(calls)
    with app.engine.connect() as conn:
        back = conn.execute(select(schema.jobs.c.attempts, schema.jobs.c.lease_owner)).one()
    again = lease_job(app, job_id, "executor-1")
    assert again is not None
    on_time = runner.run(again, time.monotonic())
    assert (RunOutcome.LEASE_TOO_OLD, (job_id,), (0, None), 0) == (
        late.outcome,
        late.returned,
        tuple(back),
        called_late,
    )
    assert (RunOutcome.RAN, 1) == (on_time.outcome, len(calls))
