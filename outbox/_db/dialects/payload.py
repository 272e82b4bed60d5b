"""A row as JSON, built by the database, for the archive: each database's own functions."""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, func, literal, literal_column, null
from sqlalchemy import cast as sql_cast
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.selectable import NamedFromClause
from sqlalchemy.types import (
    JSON,
    Float,
    Integer,
    LargeBinary,
    Numeric,
    Text,
    TypeEngine,
)

from outbox._core.values import storage_type
from outbox._db.dialects.names import MYSQL, POSTGRESQL, SQLITE, default_dialect

MAX_DOUBLE = 1.7976931348623157e308
# Marks a SQLite payload archived in the lenient form, whose JSON columns are kept as text.
JSON_AS_TEXT_MARKER = "__outbox_json_columns_as_text__"


def row_as_json(dialect: str, row: NamedFromClause, *, lenient: bool = False) -> ColumnElement[Any]:
    """A JSON object of one row's columns, by column name (the archive's ``payload``).

    ``lenient``: for rows the exact form cannot hold (a json value with ``\\u0000`` that jsonb
    refuses, NaN or nesting SQLite's json() refuses): the row as JSON *text* on PostgreSQL
    (a JSON string), JSON columns as strings on SQLite. Nothing is lost; replay parses them.
    """
    if dialect == POSTGRESQL:
        # The whole row (``alias.*``, so that a column named like the alias cannot hide it):
        # no argument limit, where jsonb_build_object stops at 100.
        whole_row: ColumnElement[Any] = literal_column(f"{row.name}.*")
        if lenient:
            return func.to_jsonb(sql_cast(func.row_to_json(whole_row), Text))
        return func.to_jsonb(whole_row)
    pairs = [
        part
        for column in row.c
        for part in (
            literal(column.name),
            _json_value(
                column, storage_type(column.type, default_dialect(dialect)), lenient, dialect
            ),
        )
    ]
    if lenient:
        pairs += [literal(JSON_AS_TEXT_MARKER), literal(1)]
    return func.json_object(*pairs)


def _json_value(column: Any, stored: TypeEngine[Any], lenient: bool, dialect: str) -> Any:
    if dialect == MYSQL:
        return _mysql_json_value(column, stored)
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
        return _hex(column)
    if isinstance(stored, Float | Numeric) and not isinstance(stored, Integer):
        return case((column.is_(None), null()), else_=_exact_real(column))
    if lenient and dialect == SQLITE:
        # SQLite stores what it is given, whatever the declared type: bytes in a column of any
        # type would stop json_object. The lenient form holds every value.
        return case((func.typeof(column) == "blob", _hex(column)), else_=column)
    return column


def _mysql_json_value(column: Any, stored: TypeEngine[Any]) -> Any:
    # JSON_OBJECT writes numbers exactly (a DECIMAL's digits, a DOUBLE's shortest form that
    # reads back as the same double, a FLOAT as the driver reads it), and dates and times as
    # text. A JSON column goes through JSON_EXTRACT, so that its document is embedded as JSON
    # rather than as a string wherever the server does not know the column holds JSON. Binary
    # values cannot be JSON: "\\x<hex>", as on the other databases. One form holds every
    # value MariaDB stores (it refuses invalid text and JSON when they are written): the
    # lenient form is the same.
    if isinstance(stored, JSON):
        return func.json_extract(column, "$")
    if _holds_bytes(stored):
        return _hex(column)
    return column


def _holds_bytes(stored: TypeEngine[Any]) -> bool:
    # BLOB, BINARY, VARBINARY and MariaDB's TINY/MEDIUM/LONGBLOB (which are not LargeBinary).
    try:
        return stored.python_type is bytes
    except NotImplementedError:  # a type that does not say
        return False


def _hex(column: Any) -> Any:
    return case((column.is_(None), null()), else_=literal("\\x") + func.hex(column))


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


class byte_length(FunctionElement[int]):  # noqa: N801 - named like the SQL function it renders
    """The bytes of a text value in UTF-8: ``octet_length`` on PostgreSQL, MariaDB and MySQL,
    the length of it as a BLOB on SQLite (whose ``length`` of a text counts characters)."""

    type = Integer()
    inherit_cache = True


@compiles(byte_length)
def _octet_length(element: byte_length, compiler: Any, **kw: Any) -> str:
    (value,) = element.clauses
    return f"octet_length({compiler.process(value, **kw)})"


@compiles(byte_length, SQLITE)
def _blob_length(element: byte_length, compiler: Any, **kw: Any) -> str:
    (value,) = element.clauses
    return f"length(CAST({compiler.process(value, **kw)} AS BLOB))"
