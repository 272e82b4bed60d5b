"""The database's clock on MariaDB and MySQL: ``UTC_TIMESTAMP(6)``, with intervals of
microseconds."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles

from outbox._db.dialects.clock import age_seconds, db_now_plus, time_plus
from outbox.schema import db_now

# UTC_TIMESTAMP, not CURRENT_TIMESTAMP, which is the session's local time with no zone in a
# DATETIME: sessions in other time zones (an application's, say) would date their events and
# leases hours apart. In brackets: MySQL takes a function as a column's DEFAULT only so.
_MYSQL_NOW = "(UTC_TIMESTAMP(6))"
# Each for both names: SQLAlchemy names the dialect of a ``mariadb+pymysql://`` URL "mariadb",
# and a rule for "mysql" alone would leave such an engine the generic CURRENT_TIMESTAMP.


@compiles(db_now, "mysql")
@compiles(db_now, "mariadb")
def _now_mysql(element: db_now, compiler: Any, **kw: Any) -> str:
    return _MYSQL_NOW


@compiles(db_now_plus, "mysql")
@compiles(db_now_plus, "mariadb")
def _now_plus_mysql(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (seconds,) = element.clauses
    micros = f"CAST(ROUND({compiler.process(seconds, **kw)} * 1000000) AS SIGNED)"
    return f"({_MYSQL_NOW} + INTERVAL {micros} MICROSECOND)"


@compiles(time_plus, "mysql")
@compiles(time_plus, "mariadb")
def _time_plus_mysql(element: time_plus, compiler: Any, **kw: Any) -> str:
    at, seconds = (compiler.process(clause, **kw) for clause in element.clauses)
    micros = f"CAST(ROUND({seconds} * 1000000) AS SIGNED)"
    return f"(CAST({at} AS DATETIME(6)) + INTERVAL {micros} MICROSECOND)"


@compiles(age_seconds, "mysql")
@compiles(age_seconds, "mariadb")
def _age_mysql(element: age_seconds, compiler: Any, **kw: Any) -> str:
    (ts,) = element.clauses
    return f"(TIMESTAMPDIFF(MICROSECOND, {compiler.process(ts, **kw)}, {_MYSQL_NOW}) / 1000000.0)"
