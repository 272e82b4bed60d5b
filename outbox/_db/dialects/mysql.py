"""MariaDB and MySQL connections: READ COMMITTED, the idle-transaction guard, the oldest
server outbox runs on."""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, Result, Row, Select, Table, event, select, update
from sqlalchemy.sql import ColumnElement

from outbox._db.dialects.names import MYSQL, name_of
from outbox.exceptions import UnsupportedDatabaseError


def read_committed(engine: Engine) -> Engine:
    """``engine`` for outbox's own transactions: on MariaDB and MySQL at READ COMMITTED.

    At their default, REPEATABLE READ, a claim's locking read also locks the gaps of the index
    it scans, and the application's INSERTs wait behind it. An application's engine keeps its
    own level: outbox gets a copy sharing its pool (``Engine.execution_options``) that sets the
    level on each connection it checks out, and resets it when the connection goes back. The
    engines outbox creates are READ COMMITTED throughout (no statement per checkout).
    """
    if name_of(engine.dialect) != MYSQL:
        return engine
    # As given to create_engine(isolation_level=...), or to execution_options(...).
    level = engine.get_execution_options().get("isolation_level")
    level = level or getattr(engine.dialect, "_on_connect_isolation_level", None)
    if level == "READ COMMITTED":
        return engine
    return engine.execution_options(isolation_level="READ COMMITTED")


# The oldest servers outbox runs on: MariaDB has SKIP LOCKED since 10.6, MySQL since 8.0.
MIN_MARIADB_VERSION = (10, 6)
MIN_MYSQL_VERSION = (8, 0)


def configure_mysql(engine: Engine, idle_transaction_timeout: float | None) -> None:
    """Refuse a MariaDB or MySQL server too old for outbox's claims, on every new connection
    (a comparison of the version SQLAlchemy read when it first connected). On MariaDB, the
    server ends a transaction left idle past ``idle_transaction_timeout`` (whole seconds,
    rounded up), as PostgreSQL does; MySQL has no such setting (docs/operations.md)."""

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        dialect = engine.dialect
        mariadb = bool(getattr(dialect, "is_mariadb", False))
        version = tuple(dialect.server_version_info or ())
        needed = MIN_MARIADB_VERSION if mariadb else MIN_MYSQL_VERSION
        if version and version < needed:
            raise UnsupportedDatabaseError(
                f"outbox needs {'MariaDB' if mariadb else 'MySQL'} "
                f"{'.'.join(map(str, needed))} or newer (for SELECT ... FOR UPDATE SKIP LOCKED); "
                f"this server is {'.'.join(map(str, version))}"
            )
        if mariadb and idle_transaction_timeout is not None:
            cursor = dbapi_connection.cursor()
            cursor.execute(
                f"SET SESSION idle_transaction_timeout = {math.ceil(idle_transaction_timeout)}"
            )
            cursor.close()

    event.listen(engine, "connect", on_connect)


# --- statements of MariaDB's own -------------------------------------------------------------


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
        pick = pick.with_hint(table, f"FORCE INDEX ({index})", "mysql")
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
    """:func:`claim`, then every column of the rows it stamped: no ``UPDATE ... RETURNING``,
    so the group is selected after it is stamped."""
    claim(conn, table, group_id, limit, only)
    return conn.execute(select(*table.c).where(table.c.group_id == group_id))


def count_exclusively(
    conn: Connection, key: str, scope: Sequence[ColumnElement[bool]], counted: ColumnElement[bool]
) -> int:
    """The rows of ``scope`` that are ``counted``, counted so that another transaction counting
    the same scope waits until this one ends. MariaDB's ``GET_LOCK`` is the session's, not the
    transaction's, and would need releasing by hand after the commit: every row of the scope
    is locked instead (``FOR UPDATE``), which the commit releases. ``key`` is not needed."""
    flags = conn.execute(select(counted).where(*scope).with_for_update()).scalars()
    return sum(1 for flag in flags if flag)


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
