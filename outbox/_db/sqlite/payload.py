"""A row as JSON on SQLite, for the archive: ``json_object`` of its columns, each written so
that it reads back exactly; and a text's length in bytes."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Text, case, func, literal, null
from sqlalchemy import cast as sql_cast
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.selectable import NamedFromClause
from sqlalchemy.types import JSON, Float, Integer, LargeBinary, Numeric, TypeEngine

from outbox._db.dialects.payload import MAX_DOUBLE, byte_length, hex_text, json_object
from outbox._db.sqlite.connection import sqlalchemy_dialect


def row_as_json(row: NamedFromClause, *, lenient: bool = False) -> ColumnElement[Any]:
    """A JSON object of one row's columns, by column name (the archive's ``payload``).

    ``lenient``: for rows the exact form cannot hold (NaN or nesting SQLite's json()
    refuses): JSON columns as strings, and bytes wherever they are. Nothing is lost; replay
    parses them.
    """
    value = functools.partial(_json_value, lenient=lenient)
    return json_object(row, sqlalchemy_dialect(), value, lenient=lenient)


def _json_value(column: Any, stored: TypeEngine[Any], *, lenient: bool) -> Any:
    # JSON columns are stored as text: json() embeds them as JSON, not as a string. Binary
    # values cannot be JSON: they are written as "\\x<hex>", the form PostgreSQL's to_jsonb uses.
    # REAL values: json_object would keep 15 significant digits; 17 round-trip exactly, and
    # infinities (not JSON numbers) become strings.
    # A column declared JSON has numeric affinity in SQLite: a bare number is stored as REAL.
    # ``stored``: what the column holds, past any TypeDecorator (a PickleType holds bytes).
    if isinstance(stored, JSON):
        if lenient:
            return column
        return case((func.typeof(column) == "real", _exact_real(column)), else_=func.json(column))
    if isinstance(stored, LargeBinary):
        return hex_text(column)
    if isinstance(stored, Float | Numeric) and not isinstance(stored, Integer):
        return case((column.is_(None), null()), else_=_exact_real(column))
    if lenient:
        # SQLite stores what it is given, whatever the declared type: bytes in a column of any
        # type would stop json_object. The lenient form holds every value.
        return case((func.typeof(column) == "blob", hex_text(column)), else_=column)
    return column


def _exact_real(column: Any) -> Any:
    # 17 significant digits round-trip a double; SQLite's printf is off by one unit in the last
    # place at the very largest doubles, which are written out exactly; infinities, not JSON
    # numbers, become strings.
    return case(
        (func.abs(column) > MAX_DOUBLE, func.json_quote(sql_cast(column, Text))),
        (column == MAX_DOUBLE, func.json(literal(repr(MAX_DOUBLE)))),
        (column == -MAX_DOUBLE, func.json(literal(repr(-MAX_DOUBLE)))),
        else_=func.json(func.printf("%!.17g", column)),
    )


@compiles(byte_length, "sqlite")
def _blob_length(element: byte_length, compiler: Any, **kw: Any) -> str:
    (value,) = element.clauses
    return f"length(CAST({compiler.process(value, **kw)} AS BLOB))"
