"""A long operation tells its Progress what it is about to do and each batch it commits, and
stops between two batches when asked (outbox.ops.progress)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import func, insert, select

from outbox import Outbox, schema
from outbox._db.dialects import db_now_plus
from outbox.exceptions import ConfigurationError
from outbox.ops import group_operations
from outbox.ops.archive import prune
from outbox.ops.operators import history
from outbox.ops.progress import Progress, StoppedError
from outbox.ops.replay import replay
from outbox.ops.selection import Selection
from tests.models import ActivityEvent


class Recorded(Progress):
    """Records what it is told; asks to stop once ``stop_after`` batches are done."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.told: list[tuple[str, ...]] = []
        self.stop_after = stop_after
        self.batches = 0

    def begin(self, verb: str, noun: str, total: int | None) -> None:
        self.told.append(("begin", verb, noun, str(total)))

    def advance(self, done: int) -> None:
        self.batches += 1
        self.told.append(("advance", str(done)))

    def should_stop(self) -> bool:
        return self.stop_after is not None and self.batches >= self.stop_after


def _archive(app: Outbox, status: str, count: int) -> None:
    rows = [
        {
            "handler": "record_activity",
            "buffer": "test_activity_events",
            "event_id": n + 1,
            "group_id": uuid.uuid4(),
            "status": status,
            "attempts": 1,
            "payload": {"activity_id": n, "kind": "viewed"},
        }
        for n in range(count)
    ]
    with app.engine.begin() as conn:
        conn.execute(insert(schema.archive).values(archived_at=db_now_plus(-3600)), rows)


def _archived(app: Outbox, status: str) -> int:
    with app.engine.connect() as conn:
        return int(
            conn.execute(select(func.count()).where(schema.archive.c.status == status)).scalar_one()
        )


def test_prune_tells_its_progress_the_rows_counted_and_each_chunk(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """prune tells its progress the archive rows it is about to delete, then each chunk."""
    app = make_app(database_url)
    _archive(app, "succeeded", 7)
    progress = Recorded()

    deleted = prune(app, older_than=60.0, chunk=3, progress=progress)

    expected = [
        ("begin", "pruned", "archive rows", "7"),
        ("advance", "3"),
        ("advance", "3"),
        ("advance", "1"),
    ]
    assert (7, expected) == (deleted, progress.told)


def test_prune_asked_to_stop_raises_between_two_chunks(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Asked to stop after its first chunk, prune raises StoppedError saying how far it got;
    the rows of the chunk after are still there."""
    app = make_app(database_url)
    _archive(app, "succeeded", 7)

    with pytest.raises(StoppedError) as stopped:
        prune(app, older_than=60.0, chunk=3, progress=Recorded(stop_after=1))

    assert ("pruned 3 of 7 archive rows; stopped before the rest", 4) == (
        str(stopped.value),
        _archived(app, "succeeded"),
    )


def test_replay_asked_to_stop_names_its_operation_which_counts_what_it_did(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Asked to stop after its first chunk, replay raises StoppedError naming the operation,
    whose record counts the events of that chunk."""
    app = make_app(database_url)
    app.handler(ActivityEvent, name="record_activity")(lambda batch: None)
    _archive(app, "dead", 5)

    with pytest.raises(StoppedError) as stopped:
        replay(app, status="dead", chunk=2, progress=Recorded(stop_after=1))

    (operation,) = history(app)
    assert (f"replayed 2 of 5 events (operation {operation.id})", 2, 2) == (
        stopped.value.summary,
        operation.events,
        _archived(app, "replayed"),
    )


def test_discard_page_size_out_of_range_is_refused(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """discard(page_size=0): a ConfigurationError naming page_size; nothing discarded."""
    app = make_app(database_url)
    _archive(app, "dead", 2)
    selection = Selection(statuses=("dead",))

    with pytest.raises(ConfigurationError, match="page_size: expected 1 to 1000 groups, got 0"):
        group_operations.discard(app, selection, page_size=0)
    assert 2 == _archived(app, "dead")
