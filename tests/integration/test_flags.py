"""Flags on a business table (``Outbox.flagged``): rows the application flags are handed to the
handler as business rows, and their flags cleared when it succeeds, only where the row was not
changed meanwhile. On SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from sqlalchemy import Engine, String, func, select, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.types import UserDefinedType

from outbox import Batch, FlaggedRowsMixin, Outbox, RetryPolicy, distribute_once
from outbox._engine import claimer, distributor
from outbox.exceptions import BufferTableMissingError, ConfigurationError, ReplayError
from outbox.ops import group_operations, holds, replay
from outbox.ops.selection import Selection
from outbox.testing import drain
from tests.models import ActivityEvent, Employee, EmployeeChanges, EmployeeWork

IMMEDIATE = RetryPolicy(max_attempts=2, scale=0.0, base_delay=0.0, jitter=0.0)


def _hire(engine: Engine, count: int, flagged: bool = True) -> None:
    with Session(engine) as session, session.begin():
        session.add_all(
            Employee(id=n, name=f"employee {n}", needs_work_done=flagged)
            for n in range(1, count + 1)
        )


def _flag(engine: Engine, ids: list[int], name: str) -> None:
    """The application's change: the row, its flag and its version, in one update."""
    with engine.begin() as conn:
        conn.execute(
            update(Employee)
            .where(Employee.id.in_(ids))
            .values(name=name, needs_work_done=True, version=Employee.version + 1)
        )


def _flagged(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(Employee.id).where(Employee.needs_work_done).order_by(Employee.id)
            ).scalars()
        )


def _waiting(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(EmployeeWork)).scalar_one())


def test_flagged_rows_are_handed_over_as_business_rows_and_unflagged(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """25 flagged employees of 30: the handler is handed those 25, as ``Employee`` rows in
    groups of 10; their flags are cleared, the others untouched, and the buffer is empty."""
    app = make_app(database_url)
    seen: list[tuple[int, str]] = []
    sizes: list[int] = []

    @app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork,
                 batch_size=10)  # fmt: skip
    def sync_employees(batch: Batch[Employee]) -> None:
        sizes.append(len(batch))
        seen.extend((e.id, e.name) for e in batch.events)
        assert all(isinstance(e, Employee) for e in batch.events)

    _hire(app.engine, 25)
    with Session(app.engine) as session, session.begin():
        session.add_all(Employee(id=n, name="calm") for n in range(26, 31))
    drain(app)
    assert [(n, f"employee {n}") for n in range(1, 26)] == sorted(seen)
    assert [10, 10, 5] == sorted(sizes, reverse=True)
    assert [] == _flagged(app.engine)
    assert 0 == _waiting(app.engine)


def test_a_row_changed_while_its_handler_runs_stays_flagged_and_is_handled_again(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Employee 1 changes (a new version) while its group is handled: its flag is not
    cleared by that group, and the next drain hands its new state over."""
    app = make_app(database_url)
    seen: list[tuple[int, str]] = []

    @app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork)
    def sync_employees(batch: Batch[Employee]) -> None:
        seen.extend((e.id, e.name) for e in batch.events)
        if len(seen) == 3:
            _flag(app.engine, [1], "renamed while handled")

    _hire(app.engine, 3)
    drain(app)
    assert [(1, "employee 1"), (1, "renamed while handled"), (2, "employee 2"),
            (3, "employee 3")] == sorted(seen)  # fmt: skip
    assert [] == _flagged(app.engine)


def test_a_failed_group_keeps_its_flags_and_a_dead_row_waits_until_released(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """The handler retries employee 2 every time: the others are unflagged; employee 2's
    attempts run out, it stays flagged, its key is held and taken again by no claim, until an
    operator releases it (a replay is refused and a discard skips it: the row's state is the
    business table's, and it stays flagged)."""
    app = make_app(database_url)
    fail = {2}
    handled: list[int] = []

    @app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork,
                 retry=IMMEDIATE)  # fmt: skip
    def sync_employees(batch: Batch[Employee]) -> None:
        batch.retry([e for e in batch.events if e.id in fail], "partner refused it")
        handled.extend(e.id for e in batch.events if e.id not in fail)

    _hire(app.engine, 4)
    drain(app)
    drain(app)
    assert [1, 3, 4] == sorted(handled)
    assert [2] == _flagged(app.engine)
    assert ["2"] == [held.key for held in holds.held_keys(app, "sync_employees")]
    assert 1 == _waiting(app.engine)  # taken again, and held back
    with pytest.raises(ReplayError, match=r"release its held keys \(outbox held release"):
        replay.replay(app, handler="sync_employees")
    # A discard would leave the row flagged, to be taken again: it is skipped, saying so.
    discarded = group_operations.discard(app, Selection(handlers=("sync_employees",)))
    assert [] == discarded.groups
    assert [("sync_employees", True)] == [
        (group.handler, "outbox held release --handler sync_employees" in why)
        for group, why in discarded.skipped
    ]
    assert ["2"] == [held.key for held in holds.held_keys(app, "sync_employees")]
    fail.clear()
    holds.release_keys(app, "sync_employees", actor="test")
    drain(app)
    assert [1, 2, 3, 4] == sorted(handled)
    assert [] == _flagged(app.engine)
    assert 0 == _waiting(app.engine)


def test_a_handler_that_raises_clears_no_flag(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A group that fails is retried; no flag is cleared until its attempt succeeds."""
    app = make_app(database_url)
    calls: list[int] = []

    @app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork,
                 retry=IMMEDIATE)  # fmt: skip
    def sync_employees(batch: Batch[Employee]) -> None:
        calls.append(len(batch))
        if len(calls) == 1:
            assert [1, 2, 3] == _flagged(app.engine)
            raise ConnectionError("the HR system is down")

    _hire(app.engine, 3)
    drain(app)
    assert [3, 3] == calls
    assert [] == _flagged(app.engine)


def test_a_row_deleted_since_it_was_flagged_is_not_handed_over(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    app = make_app(database_url)
    seen: list[int] = []

    @app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork)
    def sync_employees(batch: Batch[Employee]) -> None:
        seen.extend(batch.ids)

    _hire(app.engine, 3)
    distribute_once(app)
    with app.engine.begin() as conn:
        conn.execute(Employee.__table__.delete().where(Employee.id == 2))  # type: ignore[attr-defined]
    drain(app)
    assert [1, 3] == sorted(seen)
    assert 0 == _waiting(app.engine)


def _claimed_rows(engine: Engine, group_id: Any) -> list[int]:
    with engine.connect() as conn:
        return sorted(
            conn.execute(
                select(EmployeeWork.row_id).where(EmployeeWork.group_id == group_id)
            ).scalars()
        )


def test_claims_of_a_flag_handler_do_not_take_turns_across_workers(
    server_database: str, make_app: Callable[..., Outbox]
) -> None:
    """A claim whose transaction is still open holds no other claim back: a flag's buffer has
    one row per business row, so two claims cannot take rows of one key, and each skips the
    rows the other locked. (Claims of an ordered handler whose keys repeat take turns.)"""
    app = make_app(server_database)

    @app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork,
                 batch_size=10)  # fmt: skip
    def sync_employees(batch: Batch[Employee]) -> None:
        pass

    handler = app.get_handler("sync_employees")
    _hire(app.engine, 20)
    distribute_once(app)
    outcome: list[claimer.Claim | None] = []
    with app.engine.connect() as first:
        first.begin()
        mine = claimer._claim(first, app, handler)
        other = threading.Thread(target=lambda: outcome.append(claimer.run_once(app, handler)))
        other.start()
        other.join(5.0)
        blocked = other.is_alive()
        first.rollback()
    other.join(10.0)
    assert mine is not None
    (claim,) = outcome
    assert claim is not None
    assert (False, list(range(11, 21))) == (blocked, _claimed_rows(app.engine, claim.group_id))


def test_a_flag_is_refused_where_it_is_given_in_one_line(make_app: Callable[..., Outbox]) -> None:
    app = make_app("sqlite://")

    def handle(batch: Batch[Any]) -> None:
        pass

    with pytest.raises(ConfigurationError, match="needs_work_done is a boolean, so version"):
        app.flagged(Employee, flag="needs_work_done", buffer=EmployeeWork)(handle)
    with pytest.raises(ConfigurationError, match="flag must name a column"):
        app.flagged(Employee, flag="missing", version="version", buffer=EmployeeWork)(handle)
    with pytest.raises(ConfigurationError, match="must be a boolean, or a nullable column"):
        app.flagged(Employee, flag="name", buffer=EmployeeWork)(handle)
    with pytest.raises(ConfigurationError, match="FlaggedRowsMixin"):
        app.flagged(Employee, flag="needs_work_done", version="version", buffer=ActivityEvent)(
            handle
        )
    for model in (_CodeKeyed, _CustomKeyed):
        with pytest.raises(ConfigurationError, match="must be one integer column named id, got id"):
            app.flagged(model, flag="needs_work_done", version="version", buffer=EmployeeWork)(
                handle
            )


class _Unusual(DeclarativeBase):
    pass


class _Point(UserDefinedType[Any]):
    """A column type of the database's own, read as no Python type of its own."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "POINT"


class _CodeKeyed(_Unusual):
    __tablename__ = "code_keyed"
    id: Mapped[str] = mapped_column(String(20), primary_key=True)
    needs_work_done: Mapped[bool]
    version: Mapped[int]


class _CustomKeyed(_Unusual):
    __tablename__ = "custom_keyed"
    id: Mapped[Any] = mapped_column(_Point(), primary_key=True)
    needs_work_done: Mapped[bool]
    version: Mapped[int]


def test_an_async_handler_is_handed_the_rows_on_its_loop(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """An ``async def`` flag handler is awaited with the business rows; flags cleared after."""
    app = make_app(database_url)
    seen: list[int] = []

    @app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork)
    async def sync_employees(batch: Batch[Employee]) -> None:
        await asyncio.sleep(0)
        seen.extend(e.id for e in batch.events)

    assert app.get_handler("sync_employees").is_async
    _hire(app.engine, 5)
    drain(app)
    assert [1, 2, 3, 4, 5] == sorted(seen)
    assert [] == _flagged(app.engine)


def test_a_time_flag_is_its_own_version_and_is_cleared_to_null(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """``flag="changed_at"`` with no version: rows with a time are handed over and set back to
    NULL; one whose time moves while it is handled keeps it and is handed over again."""
    app = make_app(database_url)
    seen: list[tuple[int, str]] = []
    first = dt.datetime(2026, 1, 2, 3, 4, 5, 123456)

    @app.flagged(Employee, flag="changed_at", buffer=EmployeeChanges)
    def sync_changes(batch: Batch[Employee]) -> None:
        seen.extend((e.id, e.name) for e in batch.events)
        if len(seen) == 2:
            # A second later: MariaDB's DATETIME keeps whole seconds, and two changes within
            # one would read as one (docs/flags.md).
            with app.engine.begin() as conn:
                conn.execute(
                    update(Employee)
                    .where(Employee.id == 2)
                    .values(name="later", changed_at=first + dt.timedelta(seconds=1))
                )

    with Session(app.engine) as session, session.begin():
        session.add_all(
            [
                Employee(id=1, name="one", changed_at=first),
                Employee(id=2, name="two", changed_at=first),
                Employee(id=3, name="three"),
            ]
        )
    drain(app)
    assert [(1, "one"), (2, "later"), (2, "two")] == sorted(seen)
    with app.engine.connect() as conn:
        assert [None, None, None] == list(
            conn.execute(select(Employee.changed_at).order_by(Employee.id)).scalars()
        )


def test_a_missing_business_table_is_named_and_the_handler_set_aside(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """The business table does not exist: a drain refuses in one line naming it, and a
    distribution that sets missing tables aside tells which handler and table."""
    app = make_app(database_url)
    app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork)(_ignore)
    Employee.__table__.drop(app.engine)  # type: ignore[attr-defined]
    named = "'test_employees' of handler '_ignore'"
    with pytest.raises(BufferTableMissingError, match=named):
        drain(app)
    aside: list[Mapping[str, str]] = []
    assert [] == distributor.distribute(app, list(app.handlers.values()), on_missing=aside.append)
    assert [{"_ignore": "test_employees"}] == aside


def _ignore(batch: Batch[Employee]) -> None:
    pass


def test_a_row_changed_between_its_take_and_its_read_is_handed_its_new_state_once(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Employee 1's key is taken at version 1, then it changes to version 2 before its group
    runs: the handler is handed version 2, and that clears the flag; it is not handed the same
    state a second time."""
    app = make_app(database_url)
    seen: list[tuple[int, str]] = []

    @app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork)
    def sync_employees(batch: Batch[Employee]) -> None:
        seen.extend((e.id, e.name) for e in batch.events)

    _hire(app.engine, 2)
    distribute_once(app)
    _flag(app.engine, [1], "renamed before its group ran")
    drain(app)
    assert [(1, "renamed before its group ran"), (2, "employee 2")] == sorted(seen)
    assert [] == _flagged(app.engine)


class _Base(DeclarativeBase):
    pass


class _Document(_Base):
    """A table whose version is long text (a content hash with a prefix, say)."""

    __tablename__ = "test_flag_documents"
    id: Mapped[int] = mapped_column(primary_key=True)
    stale: Mapped[bool] = mapped_column(default=True)
    revision: Mapped[str] = mapped_column(String(300))


class _DocumentWork(FlaggedRowsMixin, _Base):
    __tablename__ = "test_flag_document_work"


def test_a_version_longer_than_the_buffer_shows_is_taken_and_cleared(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A 300-character version: the buffer shows its first 100 characters, and the flag is
    cleared by the version handed over, compared whole."""
    app = make_app(database_url)
    _Base.metadata.drop_all(app.engine)
    _Base.metadata.create_all(app.engine)
    try:
        handed: list[int] = []
        app.flagged(_Document, flag="stale", version="revision", buffer=_DocumentWork, name="docs")(
            lambda batch: handed.extend(batch.ids)
        )
        with Session(app.engine) as session, session.begin():
            session.add_all(_Document(id=n, revision=f"{n}:" + "x" * 298) for n in (1, 2))
        drain(app)
        assert [1, 2] == sorted(handed)
        with app.engine.connect() as conn:
            assert [] == list(conn.execute(select(_Document.id).where(_Document.stale)))
    finally:
        _Base.metadata.drop_all(app.engine)
