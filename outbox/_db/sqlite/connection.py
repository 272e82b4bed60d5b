"""SQLite connections: the write lock up front, WAL, a busy timeout."""

from __future__ import annotations

import functools
import time
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect
from sqlalchemy.engine import Dialect as SADialect

# How long a SQLite connection waits for the write lock before giving up: generous, because
# every framework transaction is short and takes the lock up front.
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0


def configure(
    engine: Engine, idle_transaction_timeout: float | None, network_timeout: float | None = None
) -> None:
    """WAL (readers do not block the writer), a long busy timeout, and every transaction
    opened with BEGIN IMMEDIATE, so that a claim takes the write lock before it reads instead of
    failing with "database is locked" when it tries to upgrade a read lock. The pysqlite driver's
    own transaction handling is switched off so that SQLAlchemy's BEGIN is the only one.
    ``idle_transaction_timeout`` does not apply: a SQLite transaction holds no server's locks;
    nor does ``network_timeout``: no network lies between.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
        if engine.url.database not in (None, "", ":memory:"):
            _enter_wal(cursor)
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _enter_wal(cursor: Any) -> None:
    """Switch the database to WAL, waiting for another connection's lock as long as the busy
    timeout would: SQLite asks no busy handler before it changes the journal mode, so a
    connection that meets a lock there (another process switching the same new file, or
    writing to it before the switch) would be refused at once with "database is locked"."""
    # Imported here, where a connection's cursor is sqlite3's (so it is imported already): a
    # worker on another database is spared it (a few ms of its start-up).
    import sqlite3

    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_SECONDS
    pause = 0.001
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def read_committed(engine: Engine) -> Engine:
    """``engine`` itself: SQLite's transactions are serializable, and outbox's take the write
    lock up front."""
    return engine


def reading_connection(engine: Engine) -> Connection:
    """A connection for one statement that only reads, as it comes."""
    return engine.connect()


def behind_pooler(engine: Engine) -> bool:
    """False: SQLite has no server to pool connections to."""
    return False


@functools.cache
def sqlalchemy_dialect() -> SADialect:
    """A SQLite dialect object, for compiling with no connection."""
    return sqlite_dialect()
