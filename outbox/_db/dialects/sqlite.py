"""SQLite connections: the write lock up front, WAL, a busy timeout."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, Row, Select, Table, event, func, select, update
from sqlalchemy.sql import ColumnElement

# How long a SQLite connection waits for the write lock before giving up: generous, because
# every framework transaction is short and takes the lock up front.
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0


def configure_sqlite(engine: Engine) -> None:
    """WAL (readers do not block the writer), a long busy timeout, and every transaction
    opened with BEGIN IMMEDIATE, so that a claim takes the write lock before it reads instead of
    failing with "database is locked" when it tries to upgrade a read lock. The pysqlite driver's
    own transaction handling is switched off so that SQLAlchemy's BEGIN is the only one.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
        if engine.url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


# --- statements of SQLite's own --------------------------------------------------------------


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


def insert_ignoring_duplicates(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
) -> int:
    """Insert ``rows``, skipping those a unique index already holds; returns how many were
    inserted: one statement per row, as a multi-row insert-or-ignore reports no reliable count."""
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    statement = sqlite_insert(table).on_conflict_do_nothing()
    statement = statement.execution_options(preserve_rowcount=True)
    return sum(max(conn.execute(statement, dict(row)).rowcount, 0) for row in rows)
