"""What differs between the databases: one module per database (``postgresql``, ``sqlite``,
``mysql``) for setting up its connections, and one per concern (``clock``, ``errors``,
``payload``) for the SQL that differs. Code outside the database layer asks ``supports``."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, Result, Row, Select, Table, event
from sqlalchemy.sql import ColumnElement

from outbox._db.dialects import mysql, postgresql, sqlite
from outbox._db.dialects.clock import (
    age_seconds,
    db_now,
    db_now_plus,
    timestamp,
)
from outbox._db.dialects.errors import (
    error_summary,
    is_missing_table,
    is_transient,
)
from outbox._db.dialects.mysql import (
    MIN_MARIADB_VERSION,
    MIN_MYSQL_VERSION,
    configure_mysql,
    read_committed,
)
from outbox._db.dialects.names import (
    MYSQL,
    POSTGRESQL,
    SQLITE,
    SUPPORTED,
    SUPPORTS,
    Supports,
    default_dialect,
    dialect_named,
    name_of,
    supports,
)
from outbox._db.dialects.payload import (
    JSON_AS_TEXT_MARKER,
    MAX_DOUBLE,
    row_as_json,
)
from outbox._db.dialects.postgresql import (
    IdleTimeout,
    behind_pooler,
    name_utc_plainly,
)
from outbox._db.dialects.sqlite import (
    SQLITE_BUSY_TIMEOUT_SECONDS,
    configure_sqlite,
)


class Statements(Protocol):
    """The statements each database writes its own way: one module per database implements
    them (``postgresql``, ``sqlite``, ``mysql``)."""

    def update_picked(
        self,
        conn: Connection,
        table: Table,
        pick: Select[Any],
        values: Mapping[str, Any],
        returning: Sequence[ColumnElement[Any]],
        *,
        index: str | None = None,
    ) -> Sequence[Row[Any]]: ...

    def insert_ignoring_duplicates(
        self, conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
    ) -> int: ...

    def plan_each_time(self, conn: Connection) -> None: ...

    def ids_written(self, conn: Connection, table: Table, highest: int) -> None: ...

    def add_counts(
        self,
        conn: Connection,
        table: Table,
        rows: Sequence[Mapping[str, Any]],
        counters: Sequence[str],
    ) -> None: ...

    def claim(
        self, conn: Connection, table: Table, group_id: uuid.UUID, limit: int, only: Any = None
    ) -> int: ...

    def claim_returning(
        self, conn: Connection, table: Table, group_id: uuid.UUID, limit: int, only: Any = None
    ) -> Result[Any]: ...

    def count_exclusively(
        self,
        conn: Connection,
        key: str,
        scope: Sequence[ColumnElement[bool]],
        counted: ColumnElement[bool],
    ) -> int: ...


def statements(name: str) -> Statements:
    """The statements of the database called ``name`` (:func:`name_of`)."""
    return _STATEMENTS[name]


_STATEMENTS: dict[str, Statements] = {POSTGRESQL: postgresql, SQLITE: sqlite, MYSQL: mysql}


def uses_skip_locked(dialect: str) -> bool:
    """SQLite has no row locks: its claims rely on the write lock taken by BEGIN IMMEDIATE."""
    return dialect != SQLITE


def configure_engine(engine: Engine, *, idle_transaction_timeout: float | None = None) -> None:
    """Set up connections of an engine the way outbox needs them (once per engine).

    SQLite: see :func:`configure_sqlite`. PostgreSQL through psycopg: a session whose time
    zone is UTC under another name (``Etc/UTC``, the default of many server images) is switched
    to the name ``UTC``. That changes no value and no time arithmetic, only how fast psycopg
    reads ``timestamptz`` columns: for ``UTC`` it attaches Python's own UTC, for any other name
    it converts each value through zoneinfo, a visible part of reading a claimed row.

    ``idle_transaction_timeout`` (PostgreSQL, float seconds): the server ends a transaction
    left idle this long, so that a frozen worker cannot hold row locks forever. See
    :class:`IdleTimeout` for how it is set, directly and behind a connection pooler.
    """
    if getattr(engine, "_outbox_configured", False):
        return
    if engine.dialect.name == SQLITE:
        configure_sqlite(engine)
    elif engine.dialect.name == POSTGRESQL:
        if engine.dialect.driver == "psycopg":
            event.listen(engine, "connect", name_utc_plainly)
        if idle_transaction_timeout is not None:
            IdleTimeout(engine, idle_transaction_timeout).install()
    elif name_of(engine.dialect) == MYSQL:
        configure_mysql(engine, idle_transaction_timeout)
    engine._outbox_configured = True  # type: ignore[attr-defined]


__all__ = [
    "JSON_AS_TEXT_MARKER",
    "MAX_DOUBLE",
    "MIN_MARIADB_VERSION",
    "MIN_MYSQL_VERSION",
    "MYSQL",
    "POSTGRESQL",
    "SQLITE",
    "SQLITE_BUSY_TIMEOUT_SECONDS",
    "SUPPORTED",
    "SUPPORTS",
    "Statements",
    "Supports",
    "age_seconds",
    "behind_pooler",
    "configure_engine",
    "db_now",
    "db_now_plus",
    "default_dialect",
    "dialect_named",
    "error_summary",
    "is_missing_table",
    "is_transient",
    "name_of",
    "read_committed",
    "row_as_json",
    "statements",
    "supports",
    "timestamp",
    "uses_skip_locked",
]
