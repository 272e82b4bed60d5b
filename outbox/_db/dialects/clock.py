"""The database's clock, rendered for each database: every lease and backoff is computed from it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import literal, literal_column
from sqlalchemy.dialects.mysql import DATETIME as MYSQL_DATETIME
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement
from sqlalchemy.types import (
    DateTime,
    Float,
    Integer,
    TypeEngine,
)

from outbox._db.dialects.names import MYSQL, POSTGRESQL, SQLITE

# SQLite stores DateTime as text; SQLAlchemy writes and parses "YYYY-MM-DD HH:MM:SS.ffffff".
# The database clock must produce exactly that shape so that text comparison orders correctly.
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'"


def timestamp() -> TypeEngine[Any]:
    """The type of every point in time outbox stores: ``DateTime(timezone=True)``, to the
    microsecond on every database. MariaDB's and MySQL's plain DATETIME keeps whole seconds,
    which would cut a lease of a few seconds short by up to one: there it is DATETIME(6)."""
    return DateTime(timezone=True).with_variant(MYSQL_DATETIME(fsp=6), "mysql", "mariadb")


class db_now(FunctionElement[Any]):  # noqa: N801 - named like the SQL function it renders
    """The database's current time. Every lease and backoff is computed from it.

    Public as ``outbox.db_now``: the ``created_at`` default of every buffer table, which
    compiles to each database's own clock when the DDL runs, so a migration that writes
    ``server_default=outbox.db_now()`` runs on every supported database.
    """

    type = DateTime(timezone=True)
    inherit_cache = True


class db_now_plus(FunctionElement[Any]):  # noqa: N801
    """The database's current time plus a number of seconds (a float expression)."""

    type = DateTime(timezone=True)
    inherit_cache = True


class time_plus(FunctionElement[Any]):  # noqa: N801
    """A time the database's clock gave plus a number of seconds: the statements of a
    transaction that must agree on one instant write times from one reading of the clock, not
    each from its own."""

    type = DateTime(timezone=True)
    inherit_cache = True

    def __init__(self, at: dt.datetime, seconds: float) -> None:
        super().__init__(literal(at, timestamp()), literal(seconds, Float()))


class age_seconds(FunctionElement[Any]):  # noqa: N801
    """Seconds between a timestamp column and the database's current time."""

    type = Float()
    inherit_cache = True


class whole_buckets(FunctionElement[Any]):  # noqa: N801
    """How many whole buckets of ``seconds`` (a number written into the statement) a
    non-negative number of seconds spans: the floor of their quotient, an integer."""

    type = Integer()
    inherit_cache = True

    def __init__(self, value: Any, seconds: int) -> None:
        # Inlined, not bound: a GROUP BY of the expression must read as its SELECT does.
        super().__init__(value, literal_column(str(int(seconds))))


@compiles(whole_buckets)
def _buckets_default(element: whole_buckets, compiler: Any, **kw: Any) -> str:
    value, seconds = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"FLOOR({value} / {seconds})"


@compiles(whole_buckets, SQLITE)
def _buckets_sqlite(element: whole_buckets, compiler: Any, **kw: Any) -> str:
    # SQLite has FLOOR only when built with its maths functions; a cast truncates, the floor
    # of a number that is not negative.
    value, seconds = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"CAST({value} / {seconds} AS INTEGER)"


@compiles(db_now)
def _now_default(element: db_now, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(db_now, POSTGRESQL)
def _now_pg(element: db_now, compiler: Any, **kw: Any) -> str:
    # statement_timestamp, not now(): a lease taken late in a transaction must not start early.
    return "statement_timestamp()"


@compiles(db_now, SQLITE)
def _now_sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    return f"({_SQLITE_NOW})"


# MariaDB and MySQL: UTC_TIMESTAMP, not CURRENT_TIMESTAMP, which is the session's local time
# with no zone in a DATETIME: sessions in other time zones (an application's, say) would date
# their events and leases hours apart. In brackets: MySQL takes a function as a column's
# DEFAULT only so.
_MYSQL_NOW = "(UTC_TIMESTAMP(6))"


@compiles(db_now, MYSQL)
def _now_mysql(element: db_now, compiler: Any, **kw: Any) -> str:
    return _MYSQL_NOW


@compiles(db_now_plus, POSTGRESQL)
def _now_plus_pg(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (seconds,) = element.clauses
    return f"(statement_timestamp() + make_interval(secs => {compiler.process(seconds, **kw)}))"


@compiles(db_now_plus, SQLITE)
def _now_plus_sqlite(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (seconds,) = element.clauses
    offset = f"printf('%+.6f seconds', {compiler.process(seconds, **kw)})"
    return f"(strftime('%Y-%m-%d %H:%M:%f', 'now', {offset}) || '000')"


@compiles(db_now_plus, MYSQL)
def _now_plus_mysql(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (seconds,) = element.clauses
    micros = f"CAST(ROUND({compiler.process(seconds, **kw)} * 1000000) AS SIGNED)"
    return f"({_MYSQL_NOW} + INTERVAL {micros} MICROSECOND)"


@compiles(time_plus, POSTGRESQL)
def _time_plus_pg(element: time_plus, compiler: Any, **kw: Any) -> str:
    at, seconds = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"(CAST({at} AS TIMESTAMP WITH TIME ZONE) + make_interval(secs => {seconds}))"


@compiles(time_plus, SQLITE)
def _time_plus_sqlite(element: time_plus, compiler: Any, **kw: Any) -> str:
    at, seconds = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"(strftime('%Y-%m-%d %H:%M:%f', {at}, printf('%+.6f seconds', {seconds})) || '000')"


@compiles(time_plus, MYSQL)
def _time_plus_mysql(element: time_plus, compiler: Any, **kw: Any) -> str:
    at, seconds = (compiler.process(clause, **kw) for clause in element.clauses)
    micros = f"CAST(ROUND({seconds} * 1000000) AS SIGNED)"
    return f"(CAST({at} AS DATETIME(6)) + INTERVAL {micros} MICROSECOND)"


@compiles(age_seconds, POSTGRESQL)
def _age_pg(element: age_seconds, compiler: Any, **kw: Any) -> str:
    (ts,) = element.clauses
    return f"EXTRACT(EPOCH FROM (statement_timestamp() - {compiler.process(ts, **kw)}))"


@compiles(age_seconds, SQLITE)
def _age_sqlite(element: age_seconds, compiler: Any, **kw: Any) -> str:
    (ts,) = element.clauses
    return f"((julianday('now') - julianday({compiler.process(ts, **kw)})) * 86400.0)"


@compiles(age_seconds, MYSQL)
def _age_mysql(element: age_seconds, compiler: Any, **kw: Any) -> str:
    (ts,) = element.clauses
    return f"(TIMESTAMPDIFF(MICROSECOND, {compiler.process(ts, **kw)}, {_MYSQL_NOW}) / 1000000.0)"
