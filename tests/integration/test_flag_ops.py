"""A flag handler's reading (``outbox.ops.flags``): the rows flagged on its business table, those
not taken into its buffer yet, the keys in its buffer and the keys held by dead rows, each
counted up to a cap, one handler's unreadable table said without hiding the others. On SQLite,
PostgreSQL and MariaDB."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import Batch, FlaggedRowsMixin, Outbox, RetryPolicy, distribute_once
from outbox.ops import flags
from outbox.ops.flags import FlagStatus
from outbox.testing import drain
from tests.models import ActivityEvent, Employee, EmployeeChanges, EmployeeWork

IMMEDIATE = RetryPolicy(max_attempts=2, scale=0.0, base_delay=0.0, jitter=0.0)
# One distribution takes batch_size x 50 flagged rows: 50 with groups of one.
TAKEN_AT_ONCE = 50


class _Unmigrated(DeclarativeBase):
    """Tables no test creates: a flag handler deployed before its migration."""


class Contractor(_Unmigrated):
    __tablename__ = "test_contractors_not_created"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    needs_work_done: Mapped[bool] = mapped_column(default=False)
    version: Mapped[int] = mapped_column(default=1)


class ContractorWork(FlaggedRowsMixin, _Unmigrated):
    __tablename__ = "test_contractor_work_not_created"


def _hire(engine: Any, flagged: range, calm: range = range(0)) -> None:
    with Session(engine) as session, session.begin():
        session.add_all(Employee(id=n, name=f"e{n}", needs_work_done=True) for n in flagged)
        session.add_all(Employee(id=n, name=f"e{n}", needs_work_done=False) for n in calm)


def _employees(app: Outbox, **options: Any) -> None:
    """A flag handler ``sync_employees`` on ``needs_work_done``, that does nothing."""
    app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork,
                name="sync_employees", **options)(lambda batch: None)  # fmt: skip


def _counts(status: FlagStatus) -> tuple[int | None, ...]:
    return (status.flagged, status.waiting, status.taken, status.keys, status.held)


def test_the_reading_names_each_flag_handlers_table_flag_version_and_buffer(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Two flag handlers, by name, each with its columns (a time flag is its own version), and
    no other handler; nothing flagged yet."""
    app = make_app(database_url)
    _employees(app)
    app.flagged(Employee, flag="changed_at", buffer=EmployeeChanges,
                name="audit_changes")(lambda batch: None)  # fmt: skip
    app.handler(ActivityEvent, name="activity")(lambda batch: None)
    assert [
        FlagStatus("audit_changes", "test_employees", "changed_at", "changed_at",
                   "test_employee_changes", 0, 0, 0, 0, 0, flags.COUNT_CAP),
        FlagStatus("sync_employees", "test_employees", "needs_work_done", "version",
                   "test_employee_work", 0, 0, 0, 0, 0, flags.COUNT_CAP),
    ] == flags.flag_tables(app)  # fmt: skip


def test_rows_flagged_and_not_taken_yet_wait_beside_those_the_buffer_holds(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """60 rows flagged of 64: all waiting before a distribution; after one, 50 taken (a
    distribution's worth of groups of one), their keys in the buffer, 10 waiting."""
    app = make_app(database_url)
    _employees(app, batch_size=1)
    _hire(app.engine, range(1, 61), calm=range(61, 65))

    [before] = flags.flag_tables(app)
    distribute_once(app)
    [after] = flags.flag_tables(app)

    assert ((60, 60, 0, 0, 0), (60, 10, TAKEN_AT_ONCE, TAKEN_AT_ONCE, 0)) == (
        _counts(before),
        _counts(after),
    )


def test_counts_stop_at_the_cap_and_the_waiting_rows_are_counted_first(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """60 flagged, the 50 lowest taken: capped at 20, at least 20 flagged and, walked from the
    highest key, at least 10 waiting; at least 20 keys in the buffer."""
    app = make_app(database_url)
    _employees(app, batch_size=1)
    _hire(app.engine, range(1, 61))
    distribute_once(app)

    [found] = flags.flag_tables(app, count_cap=20)

    assert ((20, 10, 10, 20, 0), 20) == (_counts(found), found.capped_at)


def test_a_dead_row_keeps_its_flag_and_its_key_is_held(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Employee 2 is retried until its attempts run out: once the others are handled, one row
    is flagged, its key taken again and held by the dead row."""
    app = make_app(database_url)

    def handle(batch: Batch[Employee]) -> None:
        batch.retry([e for e in batch.events if e.id == 2], "the partner refused it")

    app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork,
                name="sync_employees", retry=IMMEDIATE)(handle)  # fmt: skip
    _hire(app.engine, range(1, 5))
    drain(app)
    drain(app)

    [found] = flags.flag_tables(app)

    assert (1, 0, 1, 1, 1) == _counts(found)


def test_a_handler_whose_tables_cannot_be_read_is_said_and_the_others_are_read(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A flag handler whose tables were not created is read first (by name): its reading says
    the database's error and has no counts, and the next handler's is read all the same."""
    app = make_app(database_url)
    _employees(app)
    app.flagged(Contractor, flag="needs_work_done", version="version", buffer=ContractorWork,
                name="contractors")(lambda batch: None)  # fmt: skip
    _hire(app.engine, range(1, 4))

    unread, read = flags.flag_tables(app)

    assert (
        ("contractors", (None,) * 5, True),
        ("sync_employees", (3, 3, 0, 0, 0), None),
    ) == (
        (unread.handler, _counts(unread), "test_contractor" in str(unread.error)),
        (read.handler, _counts(read), read.error),
    )


def test_only_the_flag_handlers_named_are_read(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Narrowed to a handler that is no flag handler, nothing; to the flag handler, it; an
    application without flag handlers reads nothing."""
    app = make_app(database_url)
    _employees(app)
    app.handler(ActivityEvent, name="activity")(lambda batch: None)
    assert ([], ["sync_employees"], []) == (
        flags.flag_tables(app, handlers=["activity"]),
        [f.handler for f in flags.flag_tables(app, handlers=["sync_employees"])],
        flags.flag_tables(make_app(database_url)),
    )


@pytest.mark.parametrize("cap", [0, -1, True, 1.5])
def test_a_cap_that_is_no_whole_number_above_0_is_refused(
    make_app: Callable[..., Outbox], cap: Any
) -> None:
    """Refused before anything is read."""
    app = make_app("sqlite://")
    _employees(app)
    with pytest.raises(ValueError, match="count_cap must be a whole number >= 1"):
        flags.flag_tables(app, count_cap=cap)
