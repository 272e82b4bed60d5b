"""_dialects: classification of transient errors and dialect names."""

from __future__ import annotations

import datetime as dt
import sqlite3

import psycopg.errors
import pymysql
import pytest
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.dialects.mssql import dialect as mssql_dialect
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError

from outbox import UnsupportedDatabaseError
from outbox._db.dialects import DATABASES, is_missing_table, is_transient, name_of


def wrapped(orig: Exception, cls: type[DBAPIError] = OperationalError) -> DBAPIError:
    """A driver error as SQLAlchemy hands it over."""
    return cls("UPDATE outbox_jobs SET ...", {}, orig)


@pytest.mark.parametrize(
    "orig",
    [
        psycopg.errors.SerializationFailure("could not serialize access"),
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.LockNotAvailable("could not obtain lock"),
        psycopg.errors.QueryCanceled("canceling statement due to lock timeout"),
        psycopg.errors.AdminShutdown("terminating connection"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_postgresql_contention_is_transient(orig: Exception) -> None:
    """PostgreSQL contention and shutdown SQLSTATEs are worth running again."""
    assert True is is_transient(wrapped(orig))


@pytest.mark.parametrize(
    "orig",
    [
        psycopg.errors.UniqueViolation("duplicate key"),
        psycopg.errors.UndefinedTable("relation does not exist"),
        psycopg.errors.SyntaxError("syntax error"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_postgresql_programming_errors_are_not_transient(orig: Exception) -> None:
    """Errors that a second run cannot fix are not retried."""
    assert False is is_transient(wrapped(orig, IntegrityError))


def test_postgresql_connection_refused_is_transient() -> None:
    """A refused connection (a restarting server) carries no SQLSTATE and is worth retrying."""
    orig = psycopg.OperationalError("connection failed: Connection refused")
    assert True is is_transient(wrapped(orig))


def test_sqlite_database_is_locked_is_transient() -> None:
    """SQLite's busy error is contention."""
    assert True is is_transient(wrapped(sqlite3.OperationalError("database is locked")))


def test_sqlite_constraint_failure_is_not_transient() -> None:
    """A SQLite constraint failure is not contention."""
    error = sqlite3.IntegrityError("UNIQUE constraint failed: outbox_jobs.group_id")
    assert False is is_transient(wrapped(error, IntegrityError))


@pytest.mark.parametrize("code", [1205, 1213, 2006, 2013])
def test_mysql_contention_codes_are_transient(code: int) -> None:
    """MariaDB/MySQL lock wait timeout, deadlock and lost connections are transient."""
    assert True is is_transient(wrapped(Exception(code, "error")))


@pytest.mark.parametrize(
    ("code", "sqlstate"), [(1205, "HY000"), (1213, "40001"), (2013, None), (1053, "08S01")]
)
def test_pymysql_contention_is_transient_whatever_its_sqlstate(
    code: int, sqlstate: str | None
) -> None:
    """PyMySQL's errors carry the server's SQLSTATE; a lock wait timeout's is the general
    HY000: the error number decides."""
    orig = pymysql.err.OperationalError(code, "error", sqlstate=sqlstate)
    assert True is is_transient(wrapped(orig))


def test_pymysql_missing_table_is_a_missing_table() -> None:
    """MariaDB's "table doesn't exist" (1146, SQLSTATE 42S02) is a missing table, not contention."""
    orig = pymysql.err.ProgrammingError(1146, "Table 'app.events' doesn't exist", sqlstate="42S02")
    assert (True, False) == (
        is_missing_table(wrapped(orig, ProgrammingError)),
        is_transient(wrapped(orig, ProgrammingError)),
    )


def test_mysql_duplicate_key_is_not_transient() -> None:
    """MariaDB/MySQL duplicate entry (1062) is not transient."""
    assert False is is_transient(wrapped(Exception(1062, "Duplicate entry"), IntegrityError))


def test_invalidated_connection_is_transient() -> None:
    """A connection SQLAlchemy invalidated (dropped) is worth a new transaction."""
    error = DBAPIError(
        "SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True
    )
    assert True is is_transient(error)


def test_error_without_driver_error_is_not_transient() -> None:
    """An exception that did not come from a driver is never retried."""
    assert False is is_transient(RuntimeError("bug"))


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        (postgresql.dialect(), "postgresql"),
        (sqlite.dialect(), "sqlite"),
        (mysql.dialect(), "mysql"),
    ],
)
def test_supported_dialect_names(dialect: object, expected: str) -> None:
    """Supported SQLAlchemy dialects map to outbox's dialect names."""
    assert expected == name_of(dialect)  # type: ignore[arg-type]


def test_mariadb_is_named_mysql() -> None:
    """MariaDB and MySQL share one code path."""
    from sqlalchemy.dialects.mysql.mariadb import MariaDBDialect

    assert "mysql" == name_of(MariaDBDialect())


def test_unsupported_dialect_is_refused_by_name() -> None:
    """A dialect outbox does not run on is refused, naming it."""
    with pytest.raises(UnsupportedDatabaseError, match="not on 'mssql'"):
        name_of(mssql_dialect())


def test_each_name_a_dialect_goes_by_leads_to_one_database() -> None:
    """No two packages of the registry answer to one SQLAlchemy name, nor share a name."""
    sqlalchemy_names = [name for db in DATABASES for name in db.SQLALCHEMY_NAMES]
    names = [db.NAME for db in DATABASES]
    assert (sorted(set(sqlalchemy_names)), sorted(set(names))) == (
        sorted(sqlalchemy_names),
        sorted(names),
    )


def test_each_database_is_named_by_its_own_sqlalchemy_dialect() -> None:
    """A package's dialect object is one ``name_of`` leads back to that package."""
    assert [db.NAME for db in DATABASES] == [name_of(db.sqlalchemy_dialect()) for db in DATABASES]


def test_a_mariadb_url_s_dialect_writes_the_clock_as_mysql_s_does() -> None:
    """An engine of a ``mariadb+pymysql://`` URL (its dialect is named "mariadb") writes the
    database's clock as UTC_TIMESTAMP(6), and the claim's index hint, as a ``mysql://`` one:
    never the session-local CURRENT_TIMESTAMP, never a claim that scans the table."""
    from sqlalchemy import Column, Float, Integer, MetaData, Table, create_engine, literal, select

    from outbox._db.dialects.clock import age_seconds, db_now_plus, time_plus
    from outbox.schema import db_now

    table = Table("t", MetaData(), Column("id", Integer, primary_key=True), Column("at", Float))
    hinted = select(table.c.id).with_hint(table, "FORCE INDEX (ix)", "mysql")
    hinted = hinted.with_hint(table, "FORCE INDEX (ix)", "mariadb")
    elements = [
        db_now(),
        db_now_plus(literal(5.0)),
        time_plus(dt.datetime(2024, 1, 1), 5.0),
        age_seconds(table.c.at),
        hinted,
    ]
    mariadb = create_engine("mariadb+pymysql://root@127.0.0.1/test").dialect
    mysql_ = create_engine("mysql+pymysql://root@127.0.0.1/test").dialect
    written = [str(element.compile(dialect=mariadb)) for element in elements]
    assert ("mariadb", [str(e.compile(dialect=mysql_)) for e in elements]) == (
        mariadb.name,
        written,
    )
    assert "UTC_TIMESTAMP(6)" in written[0]
