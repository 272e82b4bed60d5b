"""One suite of executor behaviour: whoever runs outbox's jobs (its own worker, inline in a
test, a Celery worker), a job runs under its lease and only then, a lost lease changes nothing,
attempts are counted with backoff until the group is dead, a pause and the limits hold, an
ordering key's events go in order and a dead group holds its key, and dead letters keep their
events. On SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import select, update

from outbox import Batch, Outbox, RateLimit, RetryPolicy, schema
from outbox._db import queries
from outbox._engine import claimer
from outbox.ops import flow
from tests.executors._executors import ELSEWHERE, Executor, idle
from tests.models import ActivityEvent, EmailEvent

App = Callable[..., Outbox]
IMMEDIATE = RetryPolicy(max_attempts=3, scale=0.0, base_delay=0.0, jitter=0.0)
"""Three attempts, each due at once: a failing group is dead within one run."""


def _rows(*activity_ids: int) -> list[dict[str, Any]]:
    return [{"activity_id": n} for n in activity_ids]


def _buffered(app: Outbox) -> list[int]:
    with app.engine.connect() as conn:
        return list(conn.execute(select(ActivityEvent.id).order_by(ActivityEvent.id)).scalars())


def _jobs(app: Outbox) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(select(schema.jobs).order_by(schema.jobs.c.id)).mappings())


def _archived(app: Outbox) -> list[Any]:
    archive = schema.archive
    with app.engine.connect() as conn:
        return list(conn.execute(select(archive).order_by(archive.c.event_id)).mappings())


class Recorder:
    """A handler that records the activity ids of each call, and fails while told to."""

    def __init__(self, failing: set[int] | None = None) -> None:
        self.calls: list[list[int]] = []
        self.attempts: list[int] = []
        self.failing = failing if failing is not None else set()
        self.lock = threading.Lock()

    @property
    def handled(self) -> list[int]:
        return [n for call in self.calls for n in call]

    def __call__(self, batch: Batch[ActivityEvent]) -> None:
        ids = [event.activity_id for event in batch.events]
        with self.lock:
            self.calls.append(ids)
            self.attempts.append(batch.attempt)
        if self.failing.intersection(ids):
            raise RuntimeError(f"the downstream refused {sorted(self.failing)}")


def _lease_elsewhere(app: Outbox, name: str) -> uuid.UUID:
    """Claim a group of ``name`` with its batch job leased to another worker (alive: its lease
    runs for the settings' lease); its group id."""
    claim = claimer.run_once(app, app.get_handler(name), lease_to=ELSEWHERE)
    assert claim is not None
    assert claim.job is not None
    return claim.job.group_id


def test_committed_events_are_handled_once(executor: Executor, outbox_app: App) -> None:
    """Events committed by the application are handed to the handler once each; the buffer and
    the job table are empty after."""
    app = outbox_app()
    sink = Recorder()
    app.handler(ActivityEvent, batch_size=10, name="sink")(sink)
    executor.start(app)
    executor.write(app, ActivityEvent, _rows(1, 2, 3))
    executor.run_due()
    assert ([1, 2, 3], [], []) == (sorted(sink.handled), _buffered(app), _jobs(app))


def test_a_run_ends_holding_no_lease_with_nothing_due(executor: Executor, outbox_app: App) -> None:
    """After a run, with groups succeeded, one failed and due later and one waiting for its
    rate limit's turn, no job is due now and none is leased."""
    app = outbox_app()
    app.handler(ActivityEvent, batch_size=1, name="sink")(Recorder(failing={2}))
    limit = RateLimit(calls=1, per=60.0)
    app.handler(EmailEvent, batch_size=1, rate_limit=limit, name="mailer")(lambda batch: None)
    executor.start(app)
    executor.write(app, ActivityEvent, _rows(1, 2))
    executor.write(app, EmailEvent, [{"address": f"{n}@example.com"} for n in range(2)])
    executor.run_due()
    assert (True, 1) == (idle(app), len(_buffered(app)))


def test_a_group_leased_to_another_worker_is_not_run(executor: Executor, outbox_app: App) -> None:
    """A group whose batch job another live worker leased is left to it; the rest run."""
    app = outbox_app()
    sink = Recorder()
    app.handler(ActivityEvent, batch_size=2, name="sink")(sink)
    executor.start(app)
    with app.engine.begin() as conn:  # written past the executor: nothing runs at commit
        conn.execute(ActivityEvent.__table__.insert(), _rows(1, 2))
    leased = _lease_elsewhere(app, "sink")
    executor.write(app, ActivityEvent, _rows(3, 4))
    executor.run_due()
    (job,) = _jobs(app)
    assert ([3, 4], 2, leased, ELSEWHERE) == (
        sorted(sink.handled),
        len(_buffered(app)),
        job["group_id"],
        job["lease_owner"],
    )


def test_a_job_whose_lease_was_taken_changes_nothing(executor: Executor, outbox_app: App) -> None:
    """The lease is taken from the job while its handler runs (another worker rescued it): the
    completion is fenced off, the events stay and the job stays with its new holder."""
    app = outbox_app()
    calls: list[int] = []

    @app.handler(ActivityEvent, batch_size=10, name="sink")
    def sink(batch: Batch[ActivityEvent]) -> None:
        calls.append(len(batch))
        with app.engine.begin() as conn:
            conn.execute(
                update(schema.jobs)
                .where(schema.jobs.c.group_id == batch.group_id)
                .values(lease_owner=ELSEWHERE, lease_token=uuid.uuid4())
            )

    executor.start(app)
    executor.write(app, ActivityEvent, _rows(1, 2))
    executor.run_due()
    owners = [job["lease_owner"] for job in _jobs(app)]
    assert ([2], 2, [ELSEWHERE], []) == (calls, len(_buffered(app)), owners, _archived(app))


def test_a_failed_attempt_is_counted_and_retried_after_a_backoff(
    executor: Executor, outbox_app: App
) -> None:
    """A failing group is attempted once now; its job counts the attempt, keeps the error and
    is due again after the policy's backoff (6 s here), not at once."""
    app = outbox_app()
    sink = Recorder(failing={1})
    app.handler(ActivityEvent, retry=RetryPolicy(max_attempts=5, jitter=0.0), name="sink")(sink)
    executor.start(app)
    executor.write(app, ActivityEvent, _rows(1))
    executor.run_due()
    (job,) = _jobs(app)
    with app.engine.connect() as conn:
        due_in = (job["run_at"] - queries.database_now(conn)).total_seconds()
    assert ([1], 1, True) == (sink.attempts, job["attempts"], 4.0 < due_in <= 6.0)
    assert "the downstream refused [1]" in job["last_error"]


def test_a_group_is_dead_after_its_last_attempt(executor: Executor, outbox_app: App) -> None:
    """A group failing every attempt is attempted ``max_attempts`` times, then is dead: its
    events leave the buffer and its job is gone."""
    app = outbox_app()
    sink = Recorder(failing={1})
    app.handler(ActivityEvent, retry=IMMEDIATE, name="sink")(sink)
    executor.start(app)
    executor.write(app, ActivityEvent, _rows(1))
    executor.run_due()
    assert ([1, 2, 3], [], []) == (sink.attempts, _buffered(app), _jobs(app))


def test_a_dead_groups_events_are_dead_letters_with_their_error(
    executor: Executor, outbox_app: App
) -> None:
    """Each event of a dead group is in the archive as dead, with its attempts, the last
    error and its columns."""
    app = outbox_app()
    app.handler(ActivityEvent, retry=IMMEDIATE, name="sink")(Recorder(failing={1}))
    executor.start(app)
    executor.write(app, ActivityEvent, _rows(1, 2))
    executor.run_due()
    archived = _archived(app)
    assert [("dead", 3, "sink")] * 2 == [
        (a["status"], a["attempts"], a["handler"]) for a in archived
    ]
    assert [1, 2] == [a["payload"]["activity_id"] for a in archived]
    assert all("the downstream refused [1]" in a["error"] for a in archived)


def test_a_paused_handlers_groups_are_not_attempted(executor: Executor, outbox_app: App) -> None:
    """While its handler is paused, a group waits unattempted; once resumed, it runs."""
    app = outbox_app()
    sink = Recorder()
    app.handler(ActivityEvent, name="sink")(sink)
    flow.pause(app, "sink", reason="maintenance")
    executor.start(app)
    executor.write(app, ActivityEvent, _rows(1, 2))
    executor.run_due()
    waiting = (list(sink.handled), len(_buffered(app)), [j["attempts"] for j in _jobs(app)])
    flow.resume(app, "sink")
    executor.run_due()
    assert (([], 2), [1, 2]) == (waiting[:2], sorted(sink.handled))
    assert all(attempts == 0 for attempts in waiting[2])


def test_a_rate_limit_is_kept(executor: Executor, outbox_app: App) -> None:
    """A limit of two calls a minute: of four groups, no more than two are handed over now
    (one, when a call that started late had to reserve its turn again), and the others wait
    for their turn, unattempted."""
    app = outbox_app()
    sink = Recorder()
    limit = RateLimit(calls=2, per=60.0, burst=2)
    app.handler(ActivityEvent, batch_size=1, rate_limit=limit, name="sink")(sink)
    executor.start(app)
    executor.write(app, ActivityEvent, _rows(1, 2, 3, 4))
    executor.run_due()
    calls = len(sink.calls)
    attempts = [job["attempts"] for job in _jobs(app) if job["kind"] == schema.JobKind.BATCH]
    assert (True, 4 - calls) == (1 <= calls <= 2, len(_buffered(app)))
    assert all(n == 0 for n in attempts)


def test_a_concurrency_cap_counts_groups_in_flight_elsewhere(
    executor: Executor, outbox_app: App
) -> None:
    """A handler capped at one group in flight runs nothing while another worker holds one of
    its groups, and runs the rest once that group is finished."""
    app = outbox_app()
    sink = Recorder()
    app.handler(ActivityEvent, batch_size=1, concurrency=1, name="sink")(sink)
    executor.start(app)
    with app.engine.begin() as conn:
        conn.execute(ActivityEvent.__table__.insert(), _rows(1))
    leased = _lease_elsewhere(app, "sink")
    executor.write(app, ActivityEvent, _rows(2, 3))
    executor.run_due()
    held_back = list(sink.handled)
    with app.engine.begin() as conn:  # the other worker finishes its group
        conn.execute(ActivityEvent.__table__.delete().where(ActivityEvent.group_id == leased))
        conn.execute(schema.jobs.delete().where(schema.jobs.c.group_id == leased))
    executor.run_due()
    assert ([], [2, 3]) == (held_back, sorted(sink.handled))


def test_an_ordering_keys_events_are_handled_in_order(executor: Executor, outbox_app: App) -> None:
    """Groups of one, two keys interleaved: each key's events reach the handler in id order."""
    app = outbox_app()
    order: list[tuple[int, int]] = []

    @app.handler(ActivityEvent, batch_size=1, ordering_key="activity_id", name="ordered")
    def ordered(batch: Batch[ActivityEvent]) -> None:
        order.extend((event.activity_id, event.id) for event in batch.events)

    executor.start(app)
    executor.write(app, ActivityEvent, _rows(1, 2, 1, 2, 1, 2))
    executor.run_due()
    by_key = {key: [i for k, i in order if k == key] for key in (1, 2)}
    assert (6, sorted(by_key[1]), sorted(by_key[2])) == (len(order), by_key[1], by_key[2])


def test_a_dead_group_holds_its_keys_later_events(executor: Executor, outbox_app: App) -> None:
    """A key's first group dies after its attempts: that key's later event waits unattempted,
    held by the dead group, while the other key's events go through."""
    app = outbox_app()
    sink = Recorder(failing={1})
    options: dict[str, Any] = {"batch_size": 1, "ordering_key": "activity_id"}
    app.handler(ActivityEvent, retry=IMMEDIATE, name="ordered", **options)(sink)
    executor.start(app)
    executor.write(app, ActivityEvent, _rows(1, 2, 1, 2))
    executor.run_due()
    dead = [a for a in _archived(app) if a["status"] == "dead"]
    with app.engine.connect() as conn:
        waiting = conn.execute(select(ActivityEvent.id, ActivityEvent.activity_id)).all()
    assert ([[1]] * 3, [[2]] * 2) == (
        [call for call in sink.calls if call == [1]],
        [call for call in sink.calls if call == [2]],
    )
    assert ([1], [1], True) == (
        [a["payload"]["activity_id"] for a in dead],
        [row.activity_id for row in waiting],
        dead[0]["event_id"] < waiting[0].id,
    )
