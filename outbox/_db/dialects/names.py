"""The databases outbox runs on, by name, and what each can do (``Supports``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect as SADialect

from outbox.exceptions import UnsupportedDatabaseError

POSTGRESQL = "postgresql"
SQLITE = "sqlite"
MYSQL = "mysql"  # also MariaDB: SQLAlchemy names both "mysql"
SUPPORTED = (POSTGRESQL, SQLITE, MYSQL)


def name_of(dialect: SADialect) -> str:
    """The outbox name of a SQLAlchemy dialect; refuses the ones outbox does not run on."""
    if dialect.name == "mariadb":
        return MYSQL
    if dialect.name not in SUPPORTED:
        raise UnsupportedDatabaseError(
            f"outbox runs on PostgreSQL, SQLite and MariaDB/MySQL, not on {dialect.name!r}"
        )
    return dialect.name


@dataclass(frozen=True)
class Supports:
    """What a database can do. Code outside the SQL layer asks these questions, and never
    compares a database's name: a new database is a new set of answers."""

    one_statement_claim: bool
    """A claim job's claim is one statement: its lease extended as the fence, the rows
    stamped and returned, the batch job inserted, the probe for more rows (``UPDATE ...
    RETURNING`` inside CTEs)."""
    one_statement_completion: bool
    """A group whose events all succeeded is finished in one statement (data-modifying CTEs)."""
    listen_notify: bool
    """``LISTEN``/``NOTIFY``: triggers wake idle workers (``outbox notify``)."""
    concurrent_reindex: bool
    """``REINDEX ... CONCURRENTLY``: bloated indexes rebuilt without blocking writes."""
    zone_free_clock: str | None
    """Why no stored point in time depends on a session's time zone here (the reason, for
    ``outbox migrate-buffers`` to say); None where it can: MariaDB's and MySQL's
    ``CURRENT_TIMESTAMP`` is the session's local time, stored in a DATETIME with no zone, so a
    column default of it (as older releases of outbox wrote) dates rows in each session's zone."""


SUPPORTS = {
    POSTGRESQL: Supports(
        one_statement_claim=True,
        one_statement_completion=True,
        listen_notify=True,
        concurrent_reindex=True,
        zone_free_clock="PostgreSQL stores points in time with their zone (timestamptz): "
        "a session's time zone changes how they are shown, not what is stored",
    ),
    SQLITE: Supports(
        one_statement_claim=False,
        one_statement_completion=False,
        listen_notify=False,
        concurrent_reindex=False,
        zone_free_clock="SQLite's clock is UTC in every connection",
    ),
    MYSQL: Supports(
        one_statement_claim=False,
        one_statement_completion=False,
        listen_notify=False,
        concurrent_reindex=False,
        zone_free_clock=None,
    ),
}


def supports(name: str) -> Supports:
    """What the database called ``name`` (:func:`name_of`) can do."""
    return SUPPORTS[name]


@functools.cache
def default_dialect(name: str) -> SADialect:
    """A dialect object of a database, for deciding types where no engine is at hand."""
    if name == POSTGRESQL:
        return postgresql.dialect()  # type: ignore[no-untyped-call]
    if name == SQLITE:
        from sqlalchemy.dialects import sqlite

        return sqlite.dialect()
    from sqlalchemy.dialects import mysql

    return mysql.dialect()


def dialect_named(name: str) -> SADialect | None:
    """A dialect object of the database SQLAlchemy calls ``name`` (``mariadb`` included), for
    compiling DDL with no connection; None for a database outbox does not run on."""
    name = MYSQL if name == "mariadb" else name
    return default_dialect(name) if name in SUPPORTED else None
