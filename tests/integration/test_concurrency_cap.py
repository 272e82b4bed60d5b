"""Fleet-wide concurrency caps: the most groups of a handler in flight across all workers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from outbox import Batch, Outbox
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
