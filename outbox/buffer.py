"""BufferMixin: turns an application's declarative model into a buffer table."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Connection, DateTime, Index, Integer, Uuid, text
from sqlalchemy.orm import Mapped, Session, declared_attr, mapped_column

from outbox._dialects import db_now

# SQLite only autoincrements a column declared exactly INTEGER PRIMARY KEY.
_BIG_ID = BigInteger().with_variant(Integer(), "sqlite")


class BufferMixin:
    """Declarative mixin for a buffer model.

    Adds ``id`` (big-integer primary key), ``group_id`` (the claim that took the row, NULL while
    unclaimed), ``created_at`` (set by the database) and two named indexes:
    ``ix_<table>_unclaimed``, partial on ``group_id IS NULL`` (PostgreSQL and SQLite), which
    carries the distributor's count and the claimer's oldest-first scan, and
    ``ix_<table>_group_id``, partial on ``group_id IS NOT NULL``, which carries loading and
    deleting one group (partial, so that writing an event adds no entry to it).

    Write events with a plain ``session.add(Model(...))`` in the application's transaction.
    A model that needs table arguments of its own combines them with the buffer indexes::

        __table_args__ = (*BufferMixin.buffer_indexes("my_events"), UniqueConstraint(...))
    """

    id: Mapped[int] = mapped_column(_BIG_ID, primary_key=True, autoincrement=True)
    group_id: Mapped[uuid.UUID | None] = mapped_column(Uuid(), nullable=True, default=None)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=db_now()
    )

    @staticmethod
    def buffer_indexes(tablename: str) -> tuple[Index, Index]:
        """The two indexes every buffer table needs, named after ``tablename``."""
        unclaimed, claimed = text("group_id IS NULL"), text("group_id IS NOT NULL")
        return (
            Index(
                f"ix_{tablename}_unclaimed",
                "id",
                postgresql_where=unclaimed,
                sqlite_where=unclaimed,
            ),
            Index(
                f"ix_{tablename}_group_id",
                "group_id",
                postgresql_where=claimed,
                sqlite_where=claimed,
            ),
        )

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:  # noqa: N805 - a declared_attr takes the class
        return BufferMixin.buffer_indexes(cls.__tablename__)  # type: ignore[attr-defined]

    # Columns the framework owns; everything else is the application's payload.
    OWN_COLUMNS = frozenset({"id", "group_id", "created_at"})


def add_events(
    session: Session | Connection, model: type[BufferMixin], rows: Iterable[Mapping[str, Any]]
) -> int:
    """Write many events of one buffer model at once, in the caller's transaction.

    One ``executemany`` of a Core ``INSERT`` on the model's table: no ORM objects are built,
    nothing is flushed or committed here. ``rows`` are dicts of the model's own columns.
    Returns how many events were written.
    """
    from outbox import _sql

    return _sql.insert_events(session, model.__table__, [dict(row) for row in rows])  # type: ignore[attr-defined]
