"""SQLite's own statements (``Statements``): no row locks, as every transaction holds the
database's write lock (``BEGIN IMMEDIATE``); upserts; REAL values returned as REAL."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Float,
    Result,
    Row,
    Select,
    Table,
    Update,
    case,
    delete,
    func,
    select,
    tuple_,
    type_coerce,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.exc import CompileError
from sqlalchemy.sql import ColumnElement

from outbox._db.sqlite.connection import sqlalchemy_dialect


def update_picked(
    conn: Connection,
    table: Table,
    pick: Select[Any],
    values: Mapping[str, Any],
    returning: Sequence[ColumnElement[Any]],
    *,
    index: str | None = None,
) -> Sequence[Row[Any]]:
    """Update the rows ``pick`` (a SELECT of ids, ordered and limited) chooses, and return
    ``returning`` of them. No row locks: the transaction holds the database's write lock
    (``BEGIN IMMEDIATE``), so a plain ``IN (SELECT ... LIMIT n)`` is safe."""
    statement = update(table).where(table.c.id.in_(pick.scalar_subquery())).values(dict(values))
    return conn.execute(statement.returning(*returning)).all()


def count_exclusively(
    conn: Connection, key: str, scope: Sequence[ColumnElement[bool]], counted: ColumnElement[bool]
) -> int:
    """The rows of ``scope`` that are ``counted``, counted under the database's write lock,
    which the transaction holds already: no other transaction runs until it ends."""
    return int(conn.execute(select(func.count()).where(*scope, counted)).scalar_one())


def delete_some(conn: Connection, table: Table, where: ColumnElement[bool], limit: int) -> int:
    """Delete up to ``limit`` rows of ``table`` that are ``where``, in one statement (its
    primary key ``IN`` a limited subquery, which the planner takes as one range, where a list
    of a thousand keys costs a plan of a thousand branches); how many."""
    key = tuple_(*table.primary_key.columns)
    some = select(*table.primary_key.columns).where(where).limit(limit)
    return conn.execute(delete(table).where(key.in_(some))).rowcount


def insert_ignoring_duplicates(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
) -> int:
    """Insert ``rows``, skipping those a unique index already holds; returns how many were
    inserted: one statement per row, as a multi-row insert-or-ignore reports no reliable count."""
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    statement = sqlite_insert(table).on_conflict_do_nothing()
    statement = statement.execution_options(preserve_rowcount=True)
    return sum(max(conn.execute(statement, dict(row)).rowcount, 0) for row in rows)


def insert_selected_ignoring_duplicates(
    conn: Connection, table: Table, columns: Sequence[str], rows: Select[Any]
) -> int:
    """Insert what ``rows`` selects into ``columns``, skipping rows a unique index already
    holds (``INSERT ... SELECT ... ON CONFLICT DO NOTHING``; the select has a ``WHERE``, which
    SQLite needs to tell its ``ON`` from a join's); how many were inserted."""
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    statement = sqlite_insert(table).from_select(list(columns), rows).on_conflict_do_nothing()
    return int(conn.execute(statement.execution_options(preserve_rowcount=True)).rowcount)


def insert_new(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], returning: ColumnElement[Any]
) -> list[Any]:
    """Insert ``rows`` in one statement, skipping those whose key is held already; ``returning``
    of the rows inserted."""
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    statement = sqlite_insert(table).values(list(rows)).on_conflict_do_nothing()
    return list(conn.execute(statement.returning(returning)).scalars())


def plan_each_time(conn: Connection) -> None:
    """Nothing to do: no plan outlives its statement here."""


def ids_written(conn: Connection, table: Table, highest: int) -> None:
    """Nothing to do: a row written with an explicit id moves the table's counter past it."""


def add_counts(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], counters: Sequence[str]
) -> None:
    """Insert ``rows``, or add their ``counters`` to the row their primary key already has
    (``INSERT ... ON CONFLICT DO UPDATE``, SQLite 3.24 and newer)."""
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    statement = sqlite_insert(table).values(list(rows))
    added = {name: table.c[name] + statement.excluded[name] for name in counters}
    keys = list(table.primary_key.columns)
    conn.execute(statement.on_conflict_do_update(index_elements=keys, set_=added))


def claim(conn: Connection, table: Table, group_id: uuid.UUID, limit: int, only: Any = None) -> int:
    """Stamp ``group_id`` on up to ``limit`` unclaimed rows of a buffer, oldest first; returns
    how many. The transaction holds the write lock (``BEGIN IMMEDIATE``), so a plain ``IN
    (SELECT ... LIMIT n)`` is safe."""
    return conn.execute(_claim_update(table, group_id, limit, only)).rowcount


def claim_returning(
    conn: Connection, table: Table, group_id: uuid.UUID, limit: int, only: Any = None
) -> Result[Any]:
    """:func:`claim`, returning every column of the rows it stamped from the same statement.

    SQLite stores a whole number in a column of REAL affinity (FLOAT, REAL, DOUBLE) as an
    integer, and RETURNING hands it back as one where a SELECT gives the REAL: such a column
    is returned through ``CAST(... AS REAL)``, taken only for its REAL values (other values
    stay as stored, as a SELECT returns them).
    """
    returning = _claimed_columns(table)
    return conn.execute(_claim_update(table, group_id, limit, only).returning(*returning))


def _claim_update(table: Table, group_id: uuid.UUID, limit: int, only: Any) -> Update:
    pick = select(table.c.id).where(table.c.group_id.is_(None)).order_by(table.c.id).limit(limit)
    if only is not None:
        pick = pick.where(only)
    return update(table).where(table.c.id.in_(pick.scalar_subquery())).values(group_id=group_id)


@functools.cache
def _claimed_columns(table: Table) -> tuple[ColumnElement[Any], ...]:
    # Built once per buffer: deciding affinities compiles every column's type.
    return tuple(_as_real(column) if _real_affinity(column) else column for column in table.c)


def _real_affinity(column: Any) -> bool:
    # SQLite's affinity rules (https://sqlite.org/datatype3.html, 3.1), in their order.
    try:
        declared = column.type.compile(dialect=sqlalchemy_dialect()).upper()
    except CompileError:  # a type SQLite cannot name: no SQLite table has such a column
        return False
    if "INT" in declared or any(word in declared for word in ("CHAR", "CLOB", "TEXT", "BLOB")):
        return False
    return any(word in declared for word in ("REAL", "FLOA", "DOUB"))


def _as_real(column: Any) -> ColumnElement[Any]:
    real = case((func.typeof(column) == "real", sql_cast(column, Float)), else_=column)
    return type_coerce(real, column.type).label(column.name)
