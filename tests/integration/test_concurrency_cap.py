"""Fleet-wide concurrency caps: the most groups of a handler in flight across all workers."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from sqlalchemy import select

from outbox import Batch, Outbox, schema
from outbox._db import queries
from outbox._engine import claimer
from outbox.testing import drain
from outbox.worker import Worker
from tests.models import ActivityEvent, EmailEvent

HANDLER_SECONDS = 0.2
WORKERS = 2


class InFlight:
    """Counts calls running at once, and remembers the most seen."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.done = 0
        self.lock = threading.Lock()

    def __call__(self, batch: Batch[ActivityEvent]) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(HANDLER_SECONDS)
        with self.lock:
            self.now -= 1
            self.done += len(batch.events)


def test_cap_holds_across_workers(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """Two workers with 4 slots each never run more than 2 groups of a handler capped at 2."""
    counter = InFlight()
    apps = []
    for _ in range(WORKERS):
        app = make_app(database_url)
        app.with_settings(poll_interval=0.05)
        app.handler(ActivityEvent, batch_size=1, concurrency=2, name="capped")(counter)
        apps.append(app)
    commit_events(apps[0].engine, 12)
    workers = [Worker(app, concurrency=4, burst=True) for app in apps]
    threads = [threading.Thread(target=w.run) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert (12, 2) == (counter.done, counter.most)


def test_capped_handler_leaves_slots_to_others(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """While a capped handler is at its cap, an uncapped one still gets the free slots."""
    capped, free = InFlight(), InFlight()
    app = make_app(database_url)
    app.with_settings(poll_interval=0.05)
    app.handler(ActivityEvent, batch_size=1, concurrency=1, name="capped")(capped)
    app.handler(EmailEvent, batch_size=1, name="free")(free)
    commit_events(app.engine, 4)
    commit_events(app.engine, 4, model=EmailEvent)
    Worker(app, concurrency=4, burst=True).run()
    assert (4, 1, 4, True) == (capped.done, capped.most, free.done, free.most >= 2)


def test_a_group_claimed_at_the_cap_waits_unattempted_until_there_is_room(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """A claim leases its group to its worker, which handles it only once the handler's groups
    in flight, that one among them, are within the cap. While another worker holds the one
    group a cap of one allows, every group claimed is given back unattempted, unleased, and
    runs once the other group is done."""
    app = make_app(database_url)
    handled: list[int] = []

    @app.handler(ActivityEvent, batch_size=1, concurrency=1, name="capped")
    def capped(batch: Batch[ActivityEvent]) -> None:
        handled.extend(event.id for event in batch.events)

    commit_events(app.engine, 3)
    claimer.run_once(app, app.handlers["capped"])
    with app.engine.begin() as conn:
        [elsewhere] = queries.acquire_capped_batch_jobs(
            conn,
            app.dialect,
            handler="capped",
            cap=1,
            worker_id="elsewhere",
            token=uuid.uuid4(),
            limit=1,
            lease_seconds=60,
        )
    assert 0 == drain(app).stats.groups_succeeded
    jobs = schema.jobs
    with app.engine.connect() as conn:
        waiting = conn.execute(
            select(jobs.c.attempts, jobs.c.lease_token.is_(None)).where(
                jobs.c.kind == schema.JobKind.BATCH, jobs.c.id != elsewhere.id
            )
        ).all()
    assert ([], [(0, True), (0, True)]) == (handled, sorted(tuple(row) for row in waiting))
    with app.engine.begin() as conn:
        queries.return_job(conn, elsewhere.id, elsewhere.lease_token)
    assert 3 == drain(app).stats.groups_succeeded
    assert 3 == len(set(handled))
