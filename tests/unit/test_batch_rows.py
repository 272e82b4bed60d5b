"""Batch built from rows: events become model instances only when the handler asks."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid
from collections import namedtuple
from pathlib import Path

from sqlalchemy import inspect

from outbox.batch import Batch
from tests.models import ActivityEvent

ROOT = Path(__file__).resolve().parents[2]
GROUP = uuid.uuid4()
CREATED = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


Row = namedtuple("Row", [c.name for c in ActivityEvent.__table__.columns])  # type: ignore[misc]


def _row(n: int) -> tuple[object, ...]:
    """A row of test_activity_events in table column order, readable by name like a Row."""
    values = {"id": n, "activity_id": 100 + n, "kind": "viewed", "group_id": GROUP,
              "created_at": CREATED}  # fmt: skip
    return Row(**values)  # type: ignore[no-any-return]


def _batch(count: int) -> Batch[ActivityEvent]:
    rows = [_row(n) for n in range(1, count + 1)]
    return Batch(rows=rows, model=ActivityEvent, group_id=GROUP, attempt=1, handler="sync")


def test_events_are_not_built_until_asked_for() -> None:
    """Length and ids come from the rows; no instance exists before `events` is read."""
    batch = _batch(3)
    assert (3, [1, 2, 3], None) == (len(batch), batch.ids, batch._events)


def test_events_carry_the_row_values() -> None:
    """Each instance has its row's column values under the model's attribute names."""
    (event,) = _batch(1).events
    assert (1, 101, "viewed", GROUP, CREATED) == (
        event.id,
        event.activity_id,
        event.kind,
        event.group_id,
        event.created_at,
    )


def test_events_are_detached_not_new() -> None:
    """Built instances look loaded from the database: detached, with their identity."""
    (event,) = _batch(1).events
    state = inspect(event)
    assert (True, False, (1,)) == (state.detached, state.transient, state.identity)


def test_events_build_in_a_process_that_never_queried_the_model() -> None:
    """A fresh process (mappers not yet configured) can build instances from rows."""
    code = (
        "import uuid, datetime as dt\n"
        "from tests.unit.test_batch_rows import _batch\n"
        "print(_batch(2).events[1].activity_id)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert ("102", "") == (out.stdout.strip(), out.stderr.strip())
