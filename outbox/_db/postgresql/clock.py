"""The database's clock on PostgreSQL: ``statement_timestamp()``, with intervals of seconds."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles

from outbox._db.dialects.clock import age_seconds, db_now_plus, time_plus
from outbox.schema import db_now


@compiles(db_now, "postgresql")
def _now_pg(element: db_now, compiler: Any, **kw: Any) -> str:
    # statement_timestamp, not now(): a lease taken late in a transaction must not start early.
    return "statement_timestamp()"


@compiles(db_now_plus, "postgresql")
def _now_plus_pg(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (seconds,) = element.clauses
    return f"(statement_timestamp() + make_interval(secs => {compiler.process(seconds, **kw)}))"


@compiles(time_plus, "postgresql")
def _time_plus_pg(element: time_plus, compiler: Any, **kw: Any) -> str:
    at, seconds = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"(CAST({at} AS TIMESTAMP WITH TIME ZONE) + make_interval(secs => {seconds}))"


@compiles(age_seconds, "postgresql")
def _age_pg(element: age_seconds, compiler: Any, **kw: Any) -> str:
    (ts,) = element.clauses
    return f"EXTRACT(EPOCH FROM (statement_timestamp() - {compiler.process(ts, **kw)}))"
