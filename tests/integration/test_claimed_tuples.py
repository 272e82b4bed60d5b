"""PostgreSQL's claim reads a buffer's rows as psycopg's tuples when no column type processes
them, and builds ``Row`` objects only when something reads the rows as rows: a handler must see
the same values, of the same types, as through SQLAlchemy's rows, in ``batch.rows``,
``batch.events`` and ``batch.ids``. Each buffer is claimed twice from the same rows, once as
the claim reads it and once with the tuples turned off, and the two batches compared."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Engine,
    Float,
    LargeBinary,
    Numeric,
    String,
    TypeDecorator,
    Uuid,
    create_engine,
    inspect,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, add_events
from outbox._db import queries
from outbox._db.engine import create_outbox_engine
from outbox._db.queries import one_statement
from outbox._db.types import TupleRows

pytestmark = pytest.mark.postgres


class Upper(TypeDecorator[str]):
    """A column whose values its type turns in Python: its rows must go through SQLAlchemy."""

    impl = String(32)
    cache_ok = True

    def process_result_value(self, value: str | None, dialect: Any) -> str | None:
        return None if value is None else value.upper()


class Base(DeclarativeBase):
    pass


class PlainColumns:
    """Columns psycopg types by itself: numbers, text, JSON, times, UUIDs, bytes."""

    account: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    document: Mapped[dict[str, Any] | None] = mapped_column(JSONB, nullable=True)
    occurred_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    ratio: Mapped[float] = mapped_column(Float)
    reference: Mapped[uuid.UUID] = mapped_column(Uuid)
    flag: Mapped[bool] = mapped_column(Boolean)
    blob: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


class TupleEvent(PlainColumns, BufferMixin, Base):
    __tablename__ = "test_tuple_events"


class DecoratedEvent(PlainColumns, BufferMixin, Base):
    __tablename__ = "test_decorated_events"
    label: Mapped[str] = mapped_column(Upper)


def _values(n: int, decorated: bool) -> dict[str, Any]:
    values = {
        "account": 10**12 + n,
        "kind": f"kind-{n}",
        "payload": {"page": f"/p/{n}", "items": [n, 1.5, None, True], "nested": {"a": "é"}},
        "document": None if n % 2 else {"n": n},
        "occurred_at": dt.datetime(2026, 1, 2, 3, 4, 5, n, tzinfo=dt.UTC),
        "amount": Decimal(f"{n}.25"),
        "ratio": n / 3,
        "reference": uuid.UUID(int=n),
        "flag": bool(n % 2),
        "blob": None if n % 3 else bytes([n, 0, 255]),
    }
    if decorated:
        values["label"] = f"label-{n}"
    return values


@pytest.fixture
def engine(postgres_database: str) -> Iterator[Engine]:
    postgres_url = postgres_database  # the framework's tables, empty
    setup = create_engine(postgres_url)
    with setup.begin() as conn:
        Base.metadata.drop_all(conn)
        Base.metadata.create_all(conn)
    setup.dispose()
    # An engine as outbox makes one: its JSON functions, its sessions in UTC.
    made = create_outbox_engine(postgres_url)
    yield made
    made.dispose()
    with create_engine(postgres_url).begin() as conn:
        Base.metadata.drop_all(conn)


def _claim(engine: Engine, model: type[Any]) -> tuple[uuid.UUID, queries.LeasedClaim]:
    group_id = uuid.uuid4()
    with engine.begin() as conn:
        claimed = queries.claim_group_with_job(
            conn,
            model.__table__,
            group_id=group_id,
            limit=100,
            held=None,
            handler="test",
            priority=1,
            lease=("worker", uuid.uuid4(), 30.0),
        )
    return group_id, claimed


def _unclaim(engine: Engine, model: type[Any]) -> None:
    with engine.begin() as conn:
        conn.execute(update(model.__table__).values(group_id=None))


def _seen(batch: Batch[Any], model: type[Any]) -> dict[str, Any]:
    """Everything a handler can read of a batch, each value with its type."""
    table = model.__table__

    def typed(values: Any) -> list[tuple[type, Any]]:
        return [(type(value), value) for value in values]

    keys = [column.key for column in table.c]
    return {
        "len": len(batch),
        "ids": batch.ids,
        "rows": [typed(row) for row in batch.rows],
        "row_types": {type(row) for row in batch.rows},
        "fields": [row._fields for row in batch.rows],
        "by_name": [typed(getattr(row, key) for key in keys) for row in batch.rows],
        "by_column": [typed(row._mapping[column] for column in table.c) for row in batch.rows],
        "tuples": [tuple(row) for row in batch.rows],
        "events": [typed(getattr(event, key) for key in keys) for event in batch.events],
        "states": [
            (inspect(event).detached, inspect(event).identity, inspect(event).key)
            for event in batch.events
        ],
    }


@pytest.mark.parametrize(("model", "as_tuples"), [(TupleEvent, True), (DecoratedEvent, False)])
def test_a_handler_sees_the_same_batch_from_tuples_as_from_rows(
    engine: Engine, model: type[Any], as_tuples: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tuples only where no column type processes values (the TypeDecorator's buffer keeps
    SQLAlchemy's rows), and from tuples the batch a handler reads is the rows' batch."""
    with engine.begin() as conn:
        add_events(conn, model, [_values(n, model is DecoratedEvent) for n in range(1, 8)])

    group_id, claimed = _claim(engine, model)
    fast = Batch(rows=claimed.rows, model=model, group_id=group_id, attempt=1, handler="test")
    seen_fast = _seen(fast, model)
    _unclaim(engine, model)
    monkeypatch.setattr(one_statement, "_as_tuples", lambda *args: False)
    group_id, claimed_as_rows = _claim(engine, model)
    slow = Batch(
        rows=claimed_as_rows.rows, model=model, group_id=group_id, attempt=1, handler="test"
    )
    seen_slow = _seen(slow, model)

    assert (as_tuples, False) == (
        isinstance(claimed.rows, TupleRows),
        isinstance(claimed_as_rows.rows, TupleRows),
    )
    # The group ids differ between the two claims, and with them the rows' group_id values.
    group_at = [column.key for column in model.__table__.c].index("group_id")

    def without_group(seen: dict[str, Any]) -> dict[str, Any]:
        def drop(values: Any) -> Any:
            return [v for i, v in enumerate(values) if i != group_at]

        return {
            name: [drop(row) for row in value] if name in ("rows", "by_name", "by_column",
                                                          "tuples", "events") else value
            for name, value in seen.items()
        }  # fmt: skip

    assert without_group(seen_fast) == without_group(seen_slow)
    assert [row == other for row, other in zip(fast.rows, fast.rows, strict=True)] == [True] * 7
    if model is DecoratedEvent:
        assert {row.label for row in fast.rows} == {f"LABEL-{n}" for n in range(1, 8)}


def test_tuple_rows_become_rows_once_and_read_as_a_list(engine: Engine) -> None:
    """The claim's tuples make their rows once; the sequence compares, indexes and slices as
    the list of rows it stands for."""
    with engine.begin() as conn:
        add_events(conn, TupleEvent, [_values(n, False) for n in range(1, 4)])
    _, claimed = _claim(engine, TupleEvent)
    rows = claimed.rows
    assert isinstance(rows, TupleRows)
    made = rows.rows()
    assert (made is rows.rows(), rows == made, rows[1] is made[1], rows[:2], len(rows)) == (
        True,
        True,
        True,
        made[:2],
        3,
    )
    assert [row.id for row in rows] == sorted(row.id for row in rows)
