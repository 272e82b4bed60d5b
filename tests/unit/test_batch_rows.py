"""Batch built from rows: events become model instances only when the handler asks."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid
from collections import namedtuple
from pathlib import Path

import pytest
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


def test_rows_of_another_length_than_the_columns_are_refused() -> None:
    """Rows that do not carry every column of the table build no events."""
    short = [(1, 101, "viewed", GROUP)]
    batch = Batch(rows=short, model=ActivityEvent, group_id=GROUP, attempt=1, handler="sync")
    with pytest.raises(ValueError, match="rows of 4 values for the 5 columns"):
        len(batch.events)


def test_events_of_a_class_with_instrumentation_of_its_own_are_detached() -> None:
    """A model whose class brings its own instrumentation manager gets events built by it.

    In a process of its own: custom instrumentation changes how SQLAlchemy finds every
    instance's state, for the rest of the process.
    """
    code = (
        "import uuid\n"
        "from sqlalchemy import String, inspect\n"
        "from sqlalchemy.ext.instrumentation import InstrumentationManager\n"
        "from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column\n"
        "from outbox import BufferMixin\n"
        "from outbox.batch import Batch\n"
        "class Base(DeclarativeBase): pass\n"
        "class Custom(BufferMixin, Base):\n"
        "    __tablename__ = 'custom_events'\n"
        "    __sa_instrumentation_manager__ = InstrumentationManager\n"
        "    kind: Mapped[str] = mapped_column(String(10))\n"
        "row = ('viewed', 7, None, None)\n"
        "(event,) = Batch(rows=[row], model=Custom, group_id=uuid.uuid4(), attempt=1,\n"
        "                 handler='h').events\n"
        "state = inspect(event)\n"
        "print(event.kind, event.id, state.detached, state.identity)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert ("viewed 7 True (7,)", "") == (out.stdout.strip(), out.stderr.strip())
