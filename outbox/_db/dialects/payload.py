"""What the archive's payloads are built from on every database: the type a value is stored
as, binary values as text, the marker of the lenient form, and a value's length in bytes.
Each database's package builds a row as JSON with them (its ``payload`` module)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import case, func, literal, null
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.selectable import NamedFromClause
from sqlalchemy.types import Integer, TypeEngine

from outbox._core.values import storage_type

MAX_DOUBLE = 1.7976931348623157e308
# Marks a SQLite payload archived in the lenient form, whose JSON columns are kept as text.
JSON_AS_TEXT_MARKER = "__outbox_json_columns_as_text__"


def json_object(
    row: NamedFromClause,
    dialect: SADialect,
    value: Callable[[Any, TypeEngine[Any]], Any],
    *,
    lenient: bool,
) -> ColumnElement[Any]:
    """``json_object`` of one row's columns, by column name: each column as ``value`` gives it
    from the column and the type it is stored as on ``dialect`` (:func:`storage_type`), and
    the lenient form marked (:data:`JSON_AS_TEXT_MARKER`)."""
    pairs = [
        part
        for column in row.c
        for part in (literal(column.name), value(column, storage_type(column.type, dialect)))
    ]
    if lenient:
        pairs += [literal(JSON_AS_TEXT_MARKER), literal(1)]
    return func.json_object(*pairs)


def hex_text(column: Any) -> Any:
    """A binary value as JSON can hold it: ``"\\x<hex>"``, the form PostgreSQL's ``to_jsonb``
    writes; NULL stays NULL."""
    return case((column.is_(None), null()), else_=literal("\\x") + func.hex(column))


class byte_length(FunctionElement[int]):  # noqa: N801 - named like the SQL function it renders
    """The bytes of a text value in UTF-8: ``octet_length`` on PostgreSQL, MariaDB and MySQL,
    the length of it as a BLOB on SQLite (whose ``length`` of a text counts characters)."""

    type = Integer()
    inherit_cache = True


@compiles(byte_length)
def _octet_length(element: byte_length, compiler: Any, **kw: Any) -> str:
    (value,) = element.clauses
    return f"octet_length({compiler.process(value, **kw)})"
