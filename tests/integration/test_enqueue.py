"""Enqueue: events are written in the application's own transaction, atomically."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime

import pytest
from sqlalchemy import Engine, String, create_engine, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import BufferMixin, add_events
from tests.models import ActivityEvent, Order


class RenamedBase(DeclarativeBase):
    pass


class RenamedColumnEvent(BufferMixin, RenamedBase):
    """A buffer model whose attribute ``page`` is stored in the column ``page_path``."""

    __tablename__ = "test_renamed_column_events"
    page: Mapped[str] = mapped_column("page_path", String(200))


@pytest.fixture
def app_engine(database_url: str) -> Iterator[Engine]:
    """The application's own engine, as it exists without outbox."""
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def renamed_column_table(app_engine: Engine) -> Iterator[None]:
    """The table of RenamedColumnEvent, dropped after the test."""
    RenamedBase.metadata.create_all(app_engine)
    yield
    RenamedBase.metadata.drop_all(app_engine)


@pytest.fixture
def observer(database_url: str) -> Iterator[Engine]:
    """A second engine: what other connections can see."""
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


def count(engine: Engine, model: type[object]) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


def test_committed_event_is_visible_with_its_business_row(
    app_engine: Engine, observer: Engine
) -> None:
    """session.add of an order and its event, committed together, writes both."""
    with Session(app_engine) as session, session.begin():
        session.add(Order(id=1, reference="A-1"))
        session.add(ActivityEvent(activity_id=1))
    assert (1, 1) == (count(observer, Order), count(observer, ActivityEvent))


def test_committed_event_starts_unclaimed_with_a_creation_time(
    app_engine: Engine, observer: Engine
) -> None:
    """A new event has no group and gets created_at from the database."""
    with Session(app_engine) as session, session.begin():
        session.add(ActivityEvent(activity_id=7, kind="clicked"))
    with observer.connect() as conn:
        row = conn.execute(select(ActivityEvent.__table__)).one()
    assert (7, "clicked", None, True) == (
        row.activity_id,
        row.kind,
        row.group_id,
        row.created_at is not None,
    )


def test_rolled_back_transaction_leaves_no_event(app_engine: Engine, observer: Engine) -> None:
    """An event of a rolled-back transaction never exists for anyone."""
    with Session(app_engine) as session:
        session.add(Order(id=1, reference="A-1"))
        session.add(ActivityEvent(activity_id=1))
        session.flush()
        session.rollback()
    assert (0, 0) == (count(observer, Order), count(observer, ActivityEvent))


def test_failed_business_write_takes_the_event_with_it(
    app_engine: Engine, observer: Engine
) -> None:
    """When the business write fails, the event written before it is rolled back too."""
    with Session(app_engine) as session, session.begin():
        session.add(Order(id=1, reference="A-1"))

    def event_then_duplicate_order() -> None:
        with Session(app_engine) as session, session.begin():
            session.add(ActivityEvent(activity_id=2))
            session.flush()
            session.add(Order(id=1, reference="duplicate"))

    with pytest.raises(IntegrityError):
        event_then_duplicate_order()
    assert 0 == count(observer, ActivityEvent)


def test_flushed_event_is_invisible_to_other_connections_until_commit(
    app_engine: Engine, observer: Engine
) -> None:
    """Another connection does not see an event before its transaction commits."""
    with Session(app_engine) as session, session.begin():
        session.add(ActivityEvent(activity_id=1))
        session.flush()
        seen_before_commit = count(observer, ActivityEvent)
    assert (0, 1) == (seen_before_commit, count(observer, ActivityEvent))


def test_add_events_writes_every_row_and_returns_the_count(
    app_engine: Engine, observer: Engine
) -> None:
    """add_events writes many rows at once and says how many."""
    with Session(app_engine) as session, session.begin():
        written = add_events(session, ActivityEvent, ({"activity_id": n} for n in range(250)))
    assert (250, 250) == (written, count(observer, ActivityEvent))


def test_add_events_does_not_commit(app_engine: Engine, observer: Engine) -> None:
    """add_events joins the caller's transaction: a rollback removes its rows."""
    with Session(app_engine) as session:
        add_events(session, ActivityEvent, [{"activity_id": n} for n in range(10)])
        seen_inside = session.scalar(select(func.count()).select_from(ActivityEvent))
        seen_outside = count(observer, ActivityEvent)
        session.rollback()
    assert (10, 0, 0) == (seen_inside, seen_outside, count(observer, ActivityEvent))


def test_add_events_on_a_connection_joins_its_transaction(
    app_engine: Engine, observer: Engine
) -> None:
    """add_events takes a Core connection as well, and commits with it."""
    with app_engine.begin() as conn:
        conn.execute(Order.__table__.insert().values(id=1, reference="A-1"))
        add_events(conn, ActivityEvent, [{"activity_id": 1}, {"activity_id": 2}])
    assert (1, 2) == (count(observer, Order), count(observer, ActivityEvent))


def test_add_events_with_no_rows_writes_nothing(app_engine: Engine) -> None:
    """An empty batch of events is a no-op."""
    with Session(app_engine) as session, session.begin():
        written = add_events(session, ActivityEvent, [])
    assert 0 == written


def test_add_events_keeps_row_order_in_ids(app_engine: Engine, observer: Engine) -> None:
    """Events written in one call get increasing ids in the order given."""
    with Session(app_engine) as session, session.begin():
        add_events(session, ActivityEvent, [{"activity_id": n} for n in (30, 10, 20)])
    with observer.connect() as conn:
        rows = conn.execute(select(ActivityEvent.activity_id).order_by(ActivityEvent.id))
        assert [30, 10, 20] == list(rows.scalars())


def test_add_events_refuses_a_key_that_is_not_a_column(
    app_engine: Engine, observer: Engine
) -> None:
    """A mistyped key raises TypeError naming it, the model and the row, and nothing is written."""
    with Session(app_engine) as session, session.begin(), pytest.raises(TypeError) as raised:
        add_events(session, ActivityEvent, [{"activity_id": 1}, {"activity_id": 2, "nope": 3}])
    assert (True, 0) == (
        "add_events(ActivityEvent): rows[1] sets 'nope', not a column" in str(raised.value),
        count(observer, ActivityEvent),
    )


def test_add_events_refuses_group_id(app_engine: Engine, observer: Engine) -> None:
    """A row may not set group_id: it would look claimed and never be handled."""
    with Session(app_engine) as session, session.begin(), pytest.raises(TypeError) as raised:
        add_events(session, ActivityEvent, [{"activity_id": 1, "group_id": uuid.uuid4()}])
    assert (True, 0) == (
        "add_events(ActivityEvent): rows[0] sets 'group_id'" in str(raised.value),
        count(observer, ActivityEvent),
    )


def test_add_events_refuses_a_row_whose_keys_differ_from_the_first(
    app_engine: Engine, observer: Engine
) -> None:
    """A key only a later row sets would be dropped by the executemany, so it raises TypeError."""
    rows = [{"activity_id": 1}, {"activity_id": 2, "kind": "clicked"}]
    with Session(app_engine) as session, session.begin(), pytest.raises(TypeError) as raised:
        add_events(session, ActivityEvent, rows)
    assert (True, 0) == (
        "rows[1] sets 'kind', which rows[0] does not" in str(raised.value),
        count(observer, ActivityEvent),
    )


def test_add_events_keeps_a_given_id_and_creation_time(
    app_engine: Engine, observer: Engine
) -> None:
    """A backfill may set id and created_at, as the model's constructor may."""
    created_at = datetime(2020, 6, 15, 12, tzinfo=UTC)
    with Session(app_engine) as session, session.begin():
        add_events(session, ActivityEvent, [{"id": 42, "activity_id": 1, "created_at": created_at}])
    with observer.connect() as conn:
        row = conn.execute(select(ActivityEvent.id, ActivityEvent.created_at)).one()
    assert (42, date(2020, 6, 15)) == (row.id, row.created_at.date())


@pytest.mark.usefixtures("renamed_column_table")
def test_add_events_takes_the_column_key_of_a_renamed_attribute(
    app_engine: Engine, observer: Engine
) -> None:
    """Rows are keyed by column keys, as Core takes them: page_path for the attribute page."""
    with Session(app_engine) as session, session.begin():
        add_events(session, RenamedColumnEvent, [{"page_path": "/home"}])
    with observer.connect() as conn:
        assert ["/home"] == list(conn.execute(select(RenamedColumnEvent.page)).scalars())


def test_add_events_points_a_renamed_attribute_to_its_column_key(app_engine: Engine) -> None:
    """A row keyed by an attribute named apart from its column is refused with the key to use."""
    with Session(app_engine) as session, pytest.raises(TypeError) as raised:
        add_events(session, RenamedColumnEvent, [{"page": "/home"}])
    assert "attribute 'page' maps to column key 'page_path'" in str(raised.value)
