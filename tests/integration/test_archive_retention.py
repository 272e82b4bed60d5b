"""The archive's retention run by the fleet's leader: a worker whose application sets
``archive_retention_days`` takes the history past that age out of the archive by itself, and
keeps dead letters. (The partitioned archive's passes: tests/migration/test_archive_by_day.py.)
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import insert, select

from outbox import Batch, Outbox, Settings, schema
from outbox.worker import Worker
from tests._support import wait_for
from tests.models import ActivityEvent


def _archive(app: Outbox, status: str, days_ago: float) -> int:
    at = dt.datetime.now(dt.UTC) - dt.timedelta(days=days_ago)
    with app.engine.begin() as conn:
        conn.execute(
            insert(schema.archive).values(
                handler="sync",
                buffer="activity_events",
                event_id=1,
                status=status,
                attempts=1,
                payload={"id": 1},
                archived_at=at,
            )
        )
        newest = select(schema.archive.c.id).order_by(schema.archive.c.id.desc()).limit(1)
        return int(conn.execute(newest).scalar_one())


def _ids(app: Outbox) -> set[int]:
    with app.engine.connect() as conn:
        return set(conn.execute(select(schema.archive.c.id)).scalars())


def _without(app: Outbox, row_id: int) -> set[int] | None:
    ids = _ids(app)
    return None if row_id in ids else ids


def test_the_leader_takes_old_history_out_and_keeps_dead_letters(
    make_app: Callable[..., Outbox], database_url: str
) -> None:
    """A worker alone (it leads) with a retention of one day: the rows archived three days
    ago go, but the dead letter; the rows of today stay."""
    settings = Settings(poll_interval=0.05, rescue_interval=0.05, archive_retention_days=1)
    app = make_app(database_url, settings)

    def handle(batch: Batch[Any]) -> None:
        pass

    app.handler(ActivityEvent, name="sync")(handle)
    old = _archive(app, schema.ArchiveStatus.SUCCEEDED, 3)
    dead = _archive(app, schema.ArchiveStatus.DEAD, 3)
    recent = _archive(app, schema.ArchiveStatus.SUCCEEDED, 0)
    worker = Worker(app)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        left = wait_for(lambda: _without(app, old), "the pass that takes the old row out")
    finally:
        worker.abort()
        thread.join(timeout=10)
    assert {dead, recent} == left
