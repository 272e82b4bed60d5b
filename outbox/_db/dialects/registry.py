"""The databases outbox runs on: the one place that lists their packages, and the lookups by
name. A new database is one more package of ``outbox._db`` and one more entry here."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.selectable import NamedFromClause

from outbox._db import mysql, postgresql, sqlite
from outbox._db.dialects.interface import Database, Statements, Supports
from outbox.exceptions import UnsupportedDatabaseError

# One entry per database. A driver's error is classified by the first package here that
# recognises it (``errors``): MariaDB's first, as PyMySQL's errors carry a SQLSTATE beside
# their number, and the number says more.
DATABASES: tuple[Database, ...] = (mysql, postgresql, sqlite)
# What outbox runs on, as a refusal of another database says (:func:`name_of`).
RUNS_ON = "PostgreSQL, SQLite and MariaDB/MySQL"

POSTGRESQL = postgresql.NAME
SQLITE = sqlite.NAME
MYSQL = mysql.NAME  # also MariaDB: SQLAlchemy names both "mysql"
SUPPORTED = tuple(database.NAME for database in DATABASES)
SUPPORTS = {database.NAME: database.SUPPORTS for database in DATABASES}

_BY_NAME = {database.NAME: database for database in DATABASES}
_BY_SQLALCHEMY_NAME = {
    name: database for database in DATABASES for name in database.SQLALCHEMY_NAMES
}


def database(name: str) -> Database:
    """The package of the database called ``name`` (:func:`name_of`)."""
    return _BY_NAME[name]


def database_named(sqlalchemy_name: str) -> Database | None:
    """The package of the database SQLAlchemy calls ``sqlalchemy_name`` (a dialect's or a URL
    backend's name, ``mariadb`` included); None for a database outbox does not run on."""
    return _BY_SQLALCHEMY_NAME.get(sqlalchemy_name)


def name_of(dialect: SADialect) -> str:
    """The outbox name of a SQLAlchemy dialect; refuses the ones outbox does not run on."""
    found = database_named(dialect.name)
    if found is None:
        raise UnsupportedDatabaseError(f"outbox runs on {RUNS_ON}, not on {dialect.name!r}")
    return found.NAME


def supports(name: str) -> Supports:
    """What the database called ``name`` (:func:`name_of`) can do."""
    return _BY_NAME[name].SUPPORTS


def statements(name: str) -> Statements:
    """The statements of the database called ``name`` (:func:`name_of`)."""
    return _BY_NAME[name]


def partitions(name: str) -> ModuleType | None:
    """The archive partitions module of the database called ``name`` (:func:`name_of`); None
    where it has none."""
    return _BY_NAME[name].PARTITIONS


def uses_skip_locked(dialect: str) -> bool:
    """Whether the claims of the database called ``dialect`` lock rows ``FOR UPDATE SKIP
    LOCKED`` (SQLite's rely on the write lock taken by BEGIN IMMEDIATE instead)."""
    return _BY_NAME[dialect].SKIP_LOCKED


@functools.cache
def default_dialect(name: str) -> SADialect:
    """A dialect object of a database, for deciding types where no engine is at hand."""
    return _BY_NAME[name].sqlalchemy_dialect()


def dialect_named(name: str) -> SADialect | None:
    """A dialect object of the database SQLAlchemy calls ``name`` (``mariadb`` included), for
    compiling DDL with no connection; None for a database outbox does not run on."""
    found = database_named(name)
    return None if found is None else default_dialect(found.NAME)


def row_as_json(dialect: str, row: NamedFromClause, *, lenient: bool = False) -> ColumnElement[Any]:
    """A JSON object of one row's columns, by column name (the archive's ``payload``), built
    by the database called ``dialect`` (:func:`name_of`) with its own functions.

    ``lenient``: for rows the exact form cannot hold (a json value with ``\\u0000`` that jsonb
    refuses, NaN or nesting SQLite's json() refuses): the row as JSON *text* on PostgreSQL
    (a JSON string), JSON columns as strings on SQLite. Nothing is lost; replay parses them.
    """
    return _BY_NAME[dialect].row_as_json(row, lenient=lenient)
