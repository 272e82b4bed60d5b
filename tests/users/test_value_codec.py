"""Every column type users declare crosses JSON and back unchanged, on every database: a value
written to a buffer column and read back, written as JSON by the codec and read by the codec
for that column, is the value read back; and what the API answers for a row, ingest writes as
that same row.

The column types are this tier's catalogue (``_column_types.CASES``) but the application
objects behind a ``TypeDecorator`` (``MoneyType``, ``TenthsOfDegree``, ``PickleType``): JSON
has no form for an application's own object, and the codec invents none.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import json
import os
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Integer, Table, insert, select
from sqlalchemy.orm import DeclarativeBase, mapped_column

from outbox import Batch, BufferMixin, Outbox, jsonable
from outbox._core.values import from_json, to_json
from outbox.ops import ingest
from tests.users import _column_types as types

APPLICATION_OBJECTS = {"decorated", "decorated_not_null", "pickled"}
"""The cases whose values are an application's own objects: not JSON's to carry."""
EXAMPLES = int(os.environ.get("OUTBOX_CODEC_EXAMPLES", "20"))
"""Rows generated per database, each holding a value of every column type: the whole test, on
the three databases, in about 10 s; ``OUTBOX_CODEC_EXAMPLES=N`` for another number."""

_CHARACTERS = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
"""What every database stores as text: no lone surrogate, no NUL."""
_TEXT = st.text(_CHARACTERS)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)
_TIMES = {"min_value": dt.datetime(1900, 1, 1), "max_value": dt.datetime(2200, 1, 1)}


def _integers(bits: int) -> st.SearchStrategy[int]:
    return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def _decimals(digits: int, places: int) -> st.SearchStrategy[decimal.Decimal]:
    bound = decimal.Decimal(10**digits) - decimal.Decimal(1).scaleb(-places)
    return st.decimals(-bound, bound, places=places, allow_nan=False, allow_infinity=False)


# What each case's column is given: every value of its type the databases store.
STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "string": st.text(_CHARACTERS, max_size=40),
    "text": _TEXT,
    "integer": _integers(32),
    "big_integer": _integers(64),
    "small_integer": _integers(16),
    "boolean": st.booleans(),
    "enum_native": st.sampled_from(types.Color),
    "enum_native_int_values": st.sampled_from(types.Priority),
    "enum_native_by_value": st.sampled_from(types.Color),
    "enum_varchar": st.sampled_from(types.Color),
    "enum_varchar_int_values": st.sampled_from(types.Priority),
    "enum_varchar_by_int_value": st.sampled_from(types.Priority),
    "enum_str_enum_by_value": st.sampled_from(types.Mood),
    "json": _JSON,
    "jsonb": _JSON,
    "int_array": st.lists(_integers(32), max_size=4),
    "text_array": st.lists(_TEXT, max_size=4),
    "double_as_decimal": st.floats(allow_nan=False, allow_infinity=False).map(
        lambda number: decimal.Decimal(repr(number))
    ),
    "longtext": _TEXT,
    "mediumblob": st.binary(max_size=64),
    "uuid": st.uuids(version=4),
    "uuid_as_str": st.uuids(version=4).map(str),
    "numeric": _decimals(9, 3),
    "numeric_as_float": _decimals(9, 3).map(float),
    "float": st.floats(allow_nan=False, allow_infinity=False, width=32),
    "datetime": st.datetimes(**_TIMES),
    "datetime_tz": st.datetimes(**_TIMES, timezones=st.sampled_from([dt.UTC, types.ZONE])),
    "date": st.dates(dt.date(1900, 1, 1), dt.date(2200, 1, 1)),
    "time": st.times(),
    "interval": st.timedeltas(dt.timedelta(days=-10_000), dt.timedelta(days=10_000)),
    "binary": st.binary(max_size=64),
    "default_callable": st.text(_CHARACTERS, max_size=40),
    "default_uuid": st.uuids(version=4),
    "renamed": st.text(_CHARACTERS, max_size=20),
    "keyed": _integers(32),
    "keyed_core": st.sampled_from(types.Color),
}


class CodecBase(DeclarativeBase):
    """The metadata of this test's models."""


def _cases(dialect: str) -> tuple[types.ColumnCase, ...]:
    return tuple(c for c in types.cases(dialect) if c.name not in APPLICATION_OBJECTS)


@functools.cache
def _model(dialect: str) -> type[Any]:
    """A buffer model with one column of each JSON-able case of ``dialect``."""
    attributes: dict[str, Any] = {
        "__tablename__": f"codec_typed_events_{dialect}",
        "__module__": __name__,
        "position": mapped_column(Integer, nullable=True),
    }
    attributes.update({case.name: case.column() for case in _cases(dialect)})
    return type(f"CodecEvent{dialect.title()}", (BufferMixin, CodecBase), attributes)


def _row(dialect: str, model: type[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A row of every case's column, by column name: NULL too where the column allows it."""
    by_column = {}
    for case in _cases(dialect):
        column = model.__mapper__.columns[case.name]
        values = STRATEGIES[case.name]
        by_column[column.name] = st.none() | values if column.nullable else values
    return st.fixed_dictionaries(by_column)


def _same(expected: Any, actual: Any) -> bool:
    """The same value of the same type, but that SQLite hands a float column's whole number
    back as an int (``NUMERIC`` affinity), which the codec reads as the column's float."""
    if type(expected) is int and type(actual) is float:
        return expected == actual
    return types.same_value(expected, actual)


def _ok(batch: Batch[Any]) -> None:
    return None


def test_every_column_type_the_users_tier_knows_has_a_strategy() -> None:
    """A case added to the catalogue is either crossed here or named as an application's
    object."""
    names = {case.name for case in types.CASES}
    assert names - APPLICATION_OBJECTS == set(STRATEGIES)


def test_every_column_value_crosses_json_and_back(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Written, read back, written as JSON and read for its column: the value read back; and
    the row as the API answers it, ingested, is the same row again."""
    dialect = types.dialect_of(database_url)
    model = _model(dialect)
    table: Table = model.__table__
    app = make_app(database_url)
    app.handler(model, name="codec")(_ok)
    CodecBase.metadata.drop_all(app.engine, tables=[table])
    CodecBase.metadata.create_all(app.engine, tables=[table])
    mine = [c for c in table.columns if c.name not in BufferMixin.OWN_COLUMNS]
    keys = iter(range(10**6))

    def read(event_id: int) -> dict[str, Any]:
        with app.engine.connect() as conn:
            row = conn.execute(select(table).where(table.c.id == event_id)).one()
        return {column.name: row._mapping[column] for column in mine}

    @given(row=_row(dialect, model))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    def crosses(row: dict[str, Any]) -> None:
        by_column = {column: row[column.name] for column in mine if column.name in row}
        with app.engine.begin() as conn:
            [event_id] = conn.execute(insert(table).values(by_column)).inserted_primary_key
        stored = read(event_id)
        decoded = {
            column.name: from_json(column, json.loads(json.dumps(to_json(stored[column.name]))))
            for column in mine
        }
        differ = {
            name: (stored[name], decoded[name])
            for name in stored
            if not _same(stored[name], decoded[name])
        }
        assert {} == differ
        answered = json.loads(json.dumps(jsonable(stored)))
        [written] = ingest.ingest(app, "codec", [(f"k{next(keys)}", answered)])
        assert written.event_id is not None
        again = read(written.event_id)
        differ = {
            name: (stored[name], again[name])
            for name in stored
            if not types.same_value(stored[name], again[name])
        }
        assert {} == differ

    try:
        crosses()
    finally:
        CodecBase.metadata.drop_all(app.engine, tables=[table])
