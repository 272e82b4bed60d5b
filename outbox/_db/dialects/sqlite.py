"""SQLite connections: the write lock up front, WAL, a busy timeout."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, event

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
