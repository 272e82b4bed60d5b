"""The database's clock in SQL: every lease and backoff is computed from it.

The elements, and how they render where a database says nothing of its own; each database's
package renders them its own way (its ``clock`` module). ``db_now`` itself, the clock the
tables' columns default to, is declared with the tables (``outbox.schema``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import literal, literal_column
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement
from sqlalchemy.types import DateTime, Float, Integer

from outbox.schema import db_now, timestamp


class db_now_plus(FunctionElement[Any]):  # noqa: N801 - named like the SQL function it renders
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


@compiles(db_now)
def _now_default(element: db_now, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"
