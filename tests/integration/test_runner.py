"""The runner: one leased job run to its end, whoever leased it, and what became of it as a
value; ``lease_job``, which leases one job by its id for an executor handed the id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from outbox import Batch, Outbox, Settings, schema
from outbox._engine import distributor
from outbox._engine.runner import JobRun, Runner, RunOutcome, lease_job, new_worker_id
from outbox.ops import flow
from outbox.results import SUCCEEDED
from tests.models import ActivityEvent, EmailEvent

FAST = Settings(poll_interval=0.05, rescue_interval=0.05)


def _handled(seen: list[int]) -> Callable[[Batch[Any]], None]:
    def handle(batch: Batch[Any]) -> None:
        seen.extend(e.id for e in batch.events)

    return handle


@pytest.fixture
def app(make_app: Callable[..., Outbox], database_url: str) -> Outbox:
    return make_app(database_url, FAST)


def _claim_job_id(app: Outbox) -> int:
    """Distribute once and the id of the claim job it enqueued."""
    distributor.run_once(app, list(app.handlers))
    with app.engine.connect() as conn:
        return int(
            conn.execute(
                select(schema.jobs.c.id).where(schema.jobs.c.kind == schema.JobKind.CLAIM)
            ).scalar_one()
        )


def _job_count(app: Outbox) -> int:
    with app.engine.connect() as conn:
        return len(conn.execute(select(schema.jobs.c.id)).all())


def test_a_claim_job_leased_by_id_runs_its_group_and_says_so(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """The claim job claims the waiting events and hands them to the handler at once: the run
    ended RAN, one group claimed, its result SUCCEEDED, and no job is left."""
    seen: list[int] = []
    app.handler(ActivityEvent, name="activities")(_handled(seen))
    ids = commit_events(app.engine, 3)
    worker_id = new_worker_id()
    job = lease_job(app, _claim_job_id(app), worker_id)
    assert job is not None
    run = Runner(app, worker_id=worker_id).run(job)
    actual = (run.outcome, run.claimed, [r.outcome for r in run.results], seen, _job_count(app))
    assert (RunOutcome.RAN, 1, [SUCCEEDED], ids, 0) == actual


def test_lease_job_of_a_job_already_leased_returns_none(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A second delivery of the same job's id finds it leased, and gets nothing."""
    app.handler(ActivityEvent, name="activities")(_handled([]))
    commit_events(app.engine, 1)
    job_id = _claim_job_id(app)
    first = lease_job(app, job_id, new_worker_id())
    assert (job_id, None) == (first and first.id, lease_job(app, job_id, new_worker_id()))


def test_lease_job_of_a_handler_not_registered_here_returns_none(
    app: Outbox, commit_events: Callable[..., list[int]], make_app: Callable[..., Outbox]
) -> None:
    """An app that does not register the job's handler does not lease its job."""
    app.handler(ActivityEvent, name="activities")(_handled([]))
    commit_events(app.engine, 1)
    job_id = _claim_job_id(app)
    other = make_app(app.url, FAST)
    other.handler(EmailEvent, name="emails")(_handled([]))
    assert None is lease_job(other, job_id, new_worker_id())


def test_lease_job_refuses_a_lease_of_no_seconds(app: Outbox) -> None:
    """A lease that would end at once is refused where it is passed, naming it."""
    with pytest.raises(ValueError, match="lease_seconds"):
        lease_job(app, 1, new_worker_id(), lease_seconds=0)


def test_a_job_of_a_handler_paused_since_its_lease_is_given_back_unattempted(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Paused after the job was leased: the run ends PAUSED, the handler is not called and the
    job waits, unleased, its attempt uncounted."""
    seen: list[int] = []
    app.handler(ActivityEvent, name="activities")(_handled(seen))
    commit_events(app.engine, 2)
    job = lease_job(app, _claim_job_id(app), new_worker_id())
    assert job is not None
    flow.pause(app, "activities")
    run = Runner(app, worker_id=job.lease_owner or "").run(job)
    with app.engine.connect() as conn:
        left = conn.execute(select(schema.jobs.c.attempts, schema.jobs.c.lease_token)).all()
    assert (RunOutcome.PAUSED, [], [(0, None)]) == (run.outcome, seen, [tuple(r) for r in left])


def test_a_job_whose_buffer_table_is_missing_is_given_back_and_set_aside(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """The table dropped after the lease: the run ends TABLE_MISSING naming the table, and the
    runner's ``set_aside`` hears of it."""
    app.handler(EmailEvent, name="emails")(_handled([]))
    commit_events(app.engine, 1, EmailEvent)
    job = lease_job(app, _claim_job_id(app), new_worker_id())
    assert job is not None
    EmailEvent.__table__.drop(app.engine)
    told: list[dict[str, str]] = []
    run = Runner(app, worker_id=job.lease_owner or "", set_aside=lambda m: told.append(dict(m)))
    ran = run.run(job)
    missing = {"emails": "test_email_events"}
    assert (RunOutcome.TABLE_MISSING, missing, [missing]) == (ran.outcome, ran.missing, told)


def test_each_result_reaches_on_result_and_the_stats(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """What the run returns, ``on_result`` hears and the stats count: the same results."""
    app.handler(ActivityEvent, name="activities")(_handled([]))
    commit_events(app.engine, 4)
    heard: list[Any] = []
    worker_id = new_worker_id()
    runner = Runner(app, worker_id=worker_id, on_result=heard.append)
    job = lease_job(app, _claim_job_id(app), worker_id)
    assert job is not None
    run: JobRun = runner.run(job)
    assert (list(run.results), 1, 4) == (
        heard,
        runner.stats.groups_succeeded,
        runner.stats.events_succeeded,
    )
