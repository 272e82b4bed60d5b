"""The database's clock on SQLite: ``strftime`` of ``'now'``, in the text form SQLAlchemy
stores a DateTime in."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles

from outbox._db.dialects.clock import age_seconds, db_now_plus, time_plus, whole_buckets
from outbox.schema import db_now

# SQLite stores DateTime as text; SQLAlchemy writes and parses "YYYY-MM-DD HH:MM:SS.ffffff".
# The database clock must produce exactly that shape so that text comparison orders correctly.
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'"


@compiles(db_now, "sqlite")
def _now_sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    return f"({_SQLITE_NOW})"


@compiles(db_now_plus, "sqlite")
def _now_plus_sqlite(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (seconds,) = element.clauses
    offset = f"printf('%+.6f seconds', {compiler.process(seconds, **kw)})"
    return f"(strftime('%Y-%m-%d %H:%M:%f', 'now', {offset}) || '000')"


@compiles(time_plus, "sqlite")
def _time_plus_sqlite(element: time_plus, compiler: Any, **kw: Any) -> str:
    at, seconds = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"(strftime('%Y-%m-%d %H:%M:%f', {at}, printf('%+.6f seconds', {seconds})) || '000')"


@compiles(age_seconds, "sqlite")
def _age_sqlite(element: age_seconds, compiler: Any, **kw: Any) -> str:
    (ts,) = element.clauses
    return f"((julianday('now') - julianday({compiler.process(ts, **kw)})) * 86400.0)"


@compiles(whole_buckets, "sqlite")
def _buckets_sqlite(element: whole_buckets, compiler: Any, **kw: Any) -> str:
    # SQLite has FLOOR only when built with its maths functions; a cast truncates, the floor
    # of a number that is not negative.
    value, seconds = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"CAST({value} / {seconds} AS INTEGER)"
