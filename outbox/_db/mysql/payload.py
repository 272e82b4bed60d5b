"""A row as JSON on MariaDB and MySQL, for the archive: ``JSON_OBJECT`` of its columns."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.selectable import NamedFromClause
from sqlalchemy.types import JSON, TypeEngine

from outbox._db.dialects.payload import hex_text, json_object
from outbox._db.mysql.connection import sqlalchemy_dialect


def row_as_json(row: NamedFromClause, *, lenient: bool = False) -> ColumnElement[Any]:
    """A JSON object of one row's columns, by column name (the archive's ``payload``).

    One form holds every value MariaDB stores (it refuses invalid text and JSON when they are
    written): the ``lenient`` form is the same, marked as lenient.
    """
    return json_object(row, sqlalchemy_dialect(), _json_value, lenient=lenient)


def _json_value(column: Any, stored: TypeEngine[Any]) -> Any:
    # JSON_OBJECT writes numbers exactly (a DECIMAL's digits, a DOUBLE's shortest form that
    # reads back as the same double, a FLOAT as the driver reads it), and dates and times as
    # text. A JSON column goes through JSON_EXTRACT, so that its document is embedded as JSON
    # rather than as a string wherever the server does not know the column holds JSON. Binary
    # values cannot be JSON: "\\x<hex>", as on the other databases.
    if isinstance(stored, JSON):
        return func.json_extract(column, "$")
    if _holds_bytes(stored):
        return hex_text(column)
    return column


def _holds_bytes(stored: TypeEngine[Any]) -> bool:
    # BLOB, BINARY, VARBINARY and MariaDB's TINY/MEDIUM/LONGBLOB (which are not LargeBinary).
    try:
        return stored.python_type is bytes
    except NotImplementedError:  # a type that does not say
        return False
