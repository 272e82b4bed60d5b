"""MariaDB's and MySQL's own statements (``Statements``): no ``UPDATE ... RETURNING`` and no
``LIMIT`` inside ``IN``, so rows are picked ``FOR UPDATE SKIP LOCKED``, then updated by id;
upserts."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Result, Row, Select, Table, delete, literal, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ColumnElement


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
    ``returning`` of them. No ``UPDATE ... RETURNING`` and no ``LIMIT`` inside ``IN``: the ids
    are selected ``FOR UPDATE SKIP LOCKED``, then updated, then read back. ``index``: the index
    to pick through, in its order: on a table as small as outbox's job table, MariaDB would
    rather scan it whole and sort, locking every row it scans before the LIMIT, and a
    concurrent transaction would find none of them free."""
    if index is not None:
        for name in ("mysql", "mariadb"):  # a mariadb+pymysql:// engine's dialect is "mariadb"
            pick = pick.with_hint(table, f"FORCE INDEX ({index})", name)
    ids = _update_picked_ids(conn, table, pick, values)
    if not ids:
        return []
    return conn.execute(select(*returning).where(table.c.id.in_(ids))).all()


def _update_picked_ids(
    conn: Connection, table: Table, pick: Select[Any], values: Mapping[str, Any]
) -> list[Any]:
    ids = list(conn.execute(pick.with_for_update(skip_locked=True)).scalars())
    if ids:
        conn.execute(update(table).where(table.c.id.in_(ids)).values(dict(values)))
    return ids


def plan_each_time(conn: Connection) -> None:
    """Nothing to do: no plan outlives its statement here."""


def ids_written(conn: Connection, table: Table, highest: int) -> None:
    """Nothing to do: a row written with an explicit id moves the table's counter past it."""


def add_counts(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], counters: Sequence[str]
) -> None:
    """Insert ``rows``, or add their ``counters`` to the row their primary key already has
    (``INSERT ... ON DUPLICATE KEY UPDATE``)."""
    from sqlalchemy.dialects.mysql import insert as mysql_insert

    statement = mysql_insert(table).values(list(rows))
    added = {name: table.c[name] + statement.inserted[name] for name in counters}
    conn.execute(statement.on_duplicate_key_update(added))


def claim(conn: Connection, table: Table, group_id: uuid.UUID, limit: int, only: Any = None) -> int:
    """Stamp ``group_id`` on up to ``limit`` unclaimed rows of a buffer (``only``: those that
    meet this condition too), oldest first; returns how many. No ``LIMIT`` inside ``IN``: the
    ids are selected ``FOR UPDATE SKIP LOCKED``, then updated by id."""
    pick = select(table.c.id).where(table.c.group_id.is_(None)).order_by(table.c.id).limit(limit)
    if only is not None:
        pick = pick.where(only)
    return len(_update_picked_ids(conn, table, pick, {"group_id": group_id}))


def claim_returning(
    conn: Connection, table: Table, group_id: uuid.UUID, limit: int, only: Any = None
) -> Result[Any]:
    """:func:`claim`, and every column of the rows it stamped. No ``UPDATE ... RETURNING``: the
    rows are picked whole (``FOR UPDATE SKIP LOCKED``, their ``group_id`` read as the one about
    to be stamped), then stamped by id. Locked, they cannot change in between, so they are
    what a SELECT after the stamp would read; a statement and a thousand ids read fewer.

    A row whose values cannot be read leaves no ids to stamp: the same rows are then claimed by
    :func:`claim` (this transaction holds their locks) before the error goes on, so that the
    claim stands (see ``queries.fetch_claimed``).

    A buffer with a column the stamp itself changes (an ``onupdate``, a server ``ON UPDATE``, a
    computed column) is read after the stamp instead, as the other databases return it.
    """
    if _stamp_changes_more(table):
        claim(conn, table, group_id, limit, only)
        return conn.execute(select(*table.c).where(table.c.group_id == group_id))
    stamped = literal(group_id, table.c.group_id.type).label("group_id")
    pick = select(*(stamped if column.name == "group_id" else column for column in table.c))
    pick = pick.where(table.c.group_id.is_(None)).order_by(table.c.id).limit(limit)
    if only is not None:
        pick = pick.where(only)
    try:
        # Read here, not by the caller: the ids are needed before the rows are handed back.
        rows = conn.execute(pick.with_for_update(skip_locked=True)).freeze()
    except DBAPIError:
        raise
    except Exception:
        claim(conn, table, group_id, limit, only)
        raise
    ids = [row.id for row in rows.data]
    if ids:
        conn.execute(update(table).where(table.c.id.in_(ids)).values(group_id=group_id))
    return rows()


@functools.cache
def _stamp_changes_more(table: Table) -> bool:
    return any(
        column.onupdate is not None
        or column.server_onupdate is not None
        or column.computed is not None
        for column in table.c
    )


def count_exclusively(
    conn: Connection, key: str, scope: Sequence[ColumnElement[bool]], counted: ColumnElement[bool]
) -> int:
    """The rows of ``scope`` that are ``counted``, counted so that another transaction counting
    the same scope waits until this one ends. MariaDB's ``GET_LOCK`` is the session's, not the
    transaction's, and would need releasing by hand after the commit: every row of the scope
    is locked instead (``FOR UPDATE``), which the commit releases. ``key`` is not needed."""
    flags = conn.execute(select(counted).where(*scope).with_for_update()).scalars()
    return sum(1 for flag in flags if flag)


def delete_some(conn: Connection, table: Table, where: ColumnElement[bool], limit: int) -> int:
    """Delete up to ``limit`` rows of ``table`` that are ``where``, in one statement (MariaDB
    takes no ``LIMIT`` in an ``IN`` subquery, and limits its ``DELETE`` itself); how many."""
    statement = delete(table).where(where).with_dialect_options(mysql_limit=limit)
    return conn.execute(statement).rowcount


def insert_ignoring_duplicates(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
) -> int:
    """Insert ``rows``, skipping those a unique index already holds (``INSERT IGNORE``);
    returns how many were inserted: one statement per row, as a multi-row insert-ignore
    reports no reliable count."""
    from sqlalchemy.dialects.mysql import insert as mysql_insert

    statement = mysql_insert(table).prefix_with("IGNORE")
    statement = statement.execution_options(preserve_rowcount=True)
    return sum(max(conn.execute(statement, dict(row)).rowcount, 0) for row in rows)


def insert_selected_ignoring_duplicates(
    conn: Connection, table: Table, columns: Sequence[str], rows: Select[Any]
) -> int:
    """Insert what ``rows`` selects into ``columns``, skipping rows a unique index already
    holds (``INSERT IGNORE ... SELECT``); how many were inserted."""
    from sqlalchemy.dialects.mysql import insert as mysql_insert

    statement = mysql_insert(table).prefix_with("IGNORE").from_select(list(columns), rows)
    return int(conn.execute(statement.execution_options(preserve_rowcount=True)).rowcount)


def insert_new(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], returning: ColumnElement[Any]
) -> list[Any]:
    """Insert ``rows`` in one statement, skipping those whose key is held already (or is being
    written by a transaction still open, whose end the statement waits for); ``returning`` of
    the rows inserted (``INSERT IGNORE ... RETURNING``, MariaDB 10.5 and newer)."""
    from sqlalchemy.dialects.mysql import insert as mysql_insert

    statement = mysql_insert(table).values(list(rows)).prefix_with("IGNORE")
    return list(conn.execute(statement.returning(returning)).scalars())
