"""A row as JSON on PostgreSQL, for the archive: ``to_jsonb`` of the whole row."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Text, func, literal_column
from sqlalchemy import cast as sql_cast
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.selectable import NamedFromClause


def row_as_json(row: NamedFromClause, *, lenient: bool = False) -> ColumnElement[Any]:
    """A JSON object of one row's columns, by column name (the archive's ``payload``).

    The whole row (``alias.*``, so that a column named like the alias cannot hide it): no
    argument limit, where jsonb_build_object stops at 100. ``lenient``: the row as JSON *text*
    (a JSON string), for a json value with ``\\u0000`` that jsonb refuses; replay parses it.
    """
    whole_row: ColumnElement[Any] = literal_column(f"{row.name}.*")
    if lenient:
        return func.to_jsonb(sql_cast(func.row_to_json(whole_row), Text))
    return func.to_jsonb(whole_row)
