"""BufferMixin: turns an application's declarative model into a buffer table."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import JSON, BigInteger, Connection, Index, Integer, Table, Uuid, text
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Mapped, Session, declared_attr, mapped_column, scoped_session

from outbox.schema import db_now, timestamp

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

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

    On SQLite the table is declared ``AUTOINCREMENT``: without it SQLite gives a new row the
    highest id in the table plus one, so an id comes back once the events above it were
    handled and deleted, and two events would share the message id a sink derives from it
    (``<table>-<id>``), as would a replayed event and a new one.

    Write events with a plain ``session.add(Model(...))`` in the application's transaction.
    A model that needs table arguments of its own combines them with the buffer indexes and
    options::

        __table_args__ = (
            *BufferMixin.buffer_indexes("my_events"),
            UniqueConstraint(...),
            BufferMixin.buffer_options(),
        )
    """

    id: Mapped[int] = mapped_column(_BIG_ID, primary_key=True, autoincrement=True)
    group_id: Mapped[uuid.UUID | None] = mapped_column(Uuid(), nullable=True, default=None)
    created_at: Mapped[datetime] = mapped_column(
        timestamp(), nullable=False, server_default=db_now()
    )

    @staticmethod
    def buffer_indexes(tablename: str, coalesce_on: str | None = None) -> tuple[Index, ...]:
        """The two indexes every buffer table needs, named after ``tablename``; with
        ``coalesce_on``, a third, ``ix_<table>_unclaimed_<column>``, which finds the waiting
        events of a key for ``add_events(..., coalesce_on=column)`` (partial on ``group_id IS
        NULL`` where the database has partial indexes)."""
        unclaimed, claimed = text("group_id IS NULL"), text("group_id IS NOT NULL")
        indexes = [
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
        ]
        if coalesce_on is not None:
            indexes.append(
                Index(
                    f"ix_{tablename}_unclaimed_{coalesce_on}",
                    coalesce_on,
                    postgresql_where=unclaimed,
                    sqlite_where=unclaimed,
                )
            )
        return tuple(indexes)

    @staticmethod
    def buffer_options() -> dict[str, Any]:
        """The table options every buffer table needs (the last item of ``__table_args__``):
        on SQLite, ids never reused (``AUTOINCREMENT``)."""
        return {"sqlite_autoincrement": True}

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:  # noqa: N805 - a declared_attr takes the class
        indexes = BufferMixin.buffer_indexes(cls.__tablename__)  # type: ignore[attr-defined]
        return (*indexes, BufferMixin.buffer_options())

    # Columns the framework owns; everything else is the application's payload.
    OWN_COLUMNS = frozenset({"id", "group_id", "created_at"})


# Keys of BufferMixin's columns that add_events refuses. A row given a ``group_id`` looks
# claimed: no claim ever takes it, so it is never handled, and the status counts and
# ``outbox check``, which count unclaimed rows, never see it. ``id`` and ``created_at`` stay
# accepted, as ``Model(id=..., created_at=...)`` accepts them: a backfill or a copy between
# buffers keeps its ids and creation times.
_REFUSED_KEYS = frozenset({"group_id"})


def add_events(
    session: Session | Connection | scoped_session[Any],
    model: type[BufferMixin],
    rows: Iterable[Mapping[str, Any]],
    *,
    coalesce_on: str | None = None,
) -> int:
    """Write many events of one buffer model at once, in the caller's transaction.

    One ``executemany`` of a Core ``INSERT`` on the model's table: no ORM objects are built,
    nothing is flushed or committed here. Returns how many events were written.

    ``session`` is a ``Session``, a ``scoped_session`` or a ``Connection``; anything else (an
    ``AsyncSession`` or ``AsyncConnection`` above all, whose writes would be coroutines nobody
    awaits) raises :class:`TypeError` before anything is written: async code awaits
    :func:`add_events_async`.

    ``rows`` are dicts keyed by the columns' keys (``Model.__table__.c``: the column's name
    unless ``mapped_column`` was given a ``key``; an attribute named apart from its column, as
    in ``attr = mapped_column("db_name")``, is written as ``"db_name"``). Every row sets the
    same keys. ``id`` and ``created_at`` may be set, as in ``Model(...)``, for a backfill that
    keeps them; ``group_id`` belongs to outbox's claims and may not. A row that breaks any of
    this raises :class:`TypeError`, naming its position and keys, before anything is written.

    ``coalesce_on``: coalescing at write time, for a record that changes many times before it
    is sent (docs/flow-control.md, "Coalescing by key"). Each row is written over the
    unclaimed events of the same value of that column, as long as a claim has not taken them,
    and inserted only when there are none: a key written a thousand times between two claims
    is one row. A statement per row (an ``UPDATE``, then an ``INSERT`` for a key not waiting);
    the buffer needs an index on the column (``BufferMixin.buffer_indexes(table,
    coalesce_on=...)``), or each write reads every waiting event. Every row sets the column,
    to a value other than None.
    """
    from outbox._db import queries

    if isinstance(session, scoped_session):
        session = session()
    if not isinstance(session, Session | Connection):
        raise _not_a_session(session)
    table = model.__table__  # type: ignore[attr-defined]
    batch = [dict(row) for row in rows]
    if batch:
        _check_keys(model, table, batch)
    if coalesce_on is None:
        return queries.insert_events(session, table, batch)
    _check_coalesce_on(model, table, coalesce_on, batch)
    queries.fold_events(session, table, coalesce_on, batch)
    return len(batch)


async def add_events_async(
    session: AsyncSession | AsyncConnection | async_scoped_session[Any],
    model: type[BufferMixin],
    rows: Iterable[Mapping[str, Any]],
    *,
    coalesce_on: str | None = None,
) -> int:
    """:func:`add_events` for async code: ``await add_events_async(session, Model, rows)``.

    ``session`` is an ``AsyncSession``, an ``async_scoped_session`` or an ``AsyncConnection``.
    The same checks and the same one ``executemany``, run through the session's ``run_sync``
    in the caller's transaction; nothing is flushed or committed here. Returns how many events
    were written.
    """
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

    if isinstance(session, async_scoped_session):
        session = session()
    if not isinstance(session, AsyncSession | AsyncConnection):
        raise TypeError(
            "add_events_async takes an AsyncSession or an AsyncConnection, "
            f"got {type(session).__name__}; with a Session or a Connection, call "
            "outbox.add_events(...)"
        )
    return await session.run_sync(add_events, model, rows, coalesce_on=coalesce_on)


def _not_a_session(session: object) -> TypeError:
    """The error for what add_events was given instead of a session, naming it."""
    from sqlalchemy.ext import asyncio

    got = type(session).__name__
    asynchronous = (
        asyncio.AsyncSession,
        asyncio.AsyncConnection,
        asyncio.async_scoped_session,
        asyncio.AsyncEngine,
    )
    if isinstance(session, asynchronous):
        # Their execute() makes a coroutine that nothing here would await: the events would
        # silently not be written, and the transaction would commit without them.
        return TypeError(
            f"add_events takes a Session or a Connection, got {got}; "
            "with an async session or connection, await outbox.add_events_async(...)"
        )
    return TypeError(f"add_events takes a Session or a Connection, got {got}")


def _check_coalesce_on(
    model: type[BufferMixin], table: Table, key: str, batch: list[dict[str, Any]]
) -> None:
    """Raise TypeError unless ``key`` is a payload column every row sets to a value."""
    where = f"add_events({model.__name__})"
    payload = frozenset(table.c.keys()) - BufferMixin.OWN_COLUMNS
    if key not in payload:
        raise TypeError(
            f"{where}: coalesce_on={key!r} is not a payload column of {table.name} "
            f"(its payload columns: {_quoted(payload)})"
        )
    if isinstance(table.c[key].type, JSON):
        # PostgreSQL compares no json values, and the other databases compare their text.
        raise TypeError(
            f"{where}: coalesce_on={key!r} is a JSON column; coalesce on a column whose "
            "values compare (a number, text, a UUID)"
        )
    for position, row in enumerate(batch):
        if row.get(key) is None:
            raise TypeError(
                f"{where}: rows[{position}] gives no value for {key!r}, the column its events "
                "are coalesced on"
            )


def _check_keys(model: type[BufferMixin], table: Table, batch: list[dict[str, Any]]) -> None:
    """Raise TypeError unless every row sets the same writable columns as the first one.

    The first row is compared with the table's columns once; every other row only with the
    first (one set comparison each), so the check costs next to nothing per row.
    """
    # Core's executemany is compiled for the first row's keys: a key that only a later row sets
    # would be dropped without a word, and one that a later row lacks fails in the driver.
    writable = frozenset(table.c.keys()) - _REFUSED_KEYS
    first = batch[0].keys()
    if not first <= writable:
        raise _row_error(model, table, 0, first, first, writable)
    for position, row in enumerate(batch):
        if row.keys() != first:
            raise _row_error(model, table, position, row.keys(), first, writable)


def _row_error(
    model: type[BufferMixin],
    table: Table,
    position: int,
    keys: AbstractSet[str],
    first: AbstractSet[str],
    writable: AbstractSet[str],
) -> TypeError:
    """The error for row ``position``, whose ``keys`` are refused or differ from ``first``."""
    # TypeError, as ``Model(nope=...)`` raises for a keyword that is not a mapped attribute:
    # the mistake is in the shape of the call rather than in a value, and a caller who catches
    # the ORM's error catches this one too.
    where = f"add_events({model.__name__}): rows[{position}]"
    if refused := keys & _REFUSED_KEYS:
        return TypeError(
            f"{where} sets {_quoted(refused)}, which outbox sets when a claim takes the row; "
            "an event written with it would never be handled"
        )
    if unknown := keys - writable:
        # An attribute named apart from its column is a key the ORM takes and Core does not.
        renamed = {
            attribute: column.key
            for attribute, column in sa_inspect(model).columns.items()
            if attribute != column.key
        }
        hints = [
            f"; attribute {name!r} maps to column key {renamed[name]!r}"
            for name in sorted(unknown & renamed.keys())
        ]
        return TypeError(
            f"{where} sets {_quoted(unknown)}, not a column of {table.name}{''.join(hints)} "
            f"(its columns: {_quoted(writable)})"
        )
    differences = []
    if extra := keys - first:
        differences.append(f"sets {_quoted(extra)}, which rows[0] does not")
    if missing := first - keys:
        differences.append(f"lacks {_quoted(missing)}, which rows[0] sets")
    return TypeError(
        f"{where} {' and '.join(differences)}: all rows of one call set the same columns, "
        "as one executemany writes them"
    )


def _quoted(keys: AbstractSet[str]) -> str:
    return ", ".join(repr(key) for key in sorted(keys))
