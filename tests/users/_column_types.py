"""The column types users declare on buffer models, as a table other tests of this tier reuse.

Each :class:`ColumnCase` names a column (its attribute on the model), makes a fresh column
each time it is asked (a column belongs to one table), lists the values the tests write into it
in turn, one per row (``UNSET``: leave it to the column's default), and says how two loaded
values compare. :func:`buffer_model` turns the cases of one dialect into a buffer model with
one column per case, plus ``position``: which row of the samples a row holds.

What a test expects is what ``session.get(Model, id)`` returns in a fresh session: the ORM's
own loading is the reference for every path that hands rows to a handler.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import functools
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Enum,
    Float,
    Integer,
    Interval,
    LargeBinary,
    Numeric,
    PickleType,
    SmallInteger,
    String,
    Text,
    Time,
    TypeDecorator,
    Uuid,
    inspect,
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Session, mapped_column

from outbox import BufferMixin

POSTGRESQL = "postgresql"
SQLITE = "sqlite"
MARIADB = "mysql"  # SQLAlchemy's name for MariaDB's dialect
EVERY_DIALECT = frozenset({POSTGRESQL, SQLITE, MARIADB})


def dialect_of(url: str) -> str:
    """The dialect a database URL names, as this module names it."""
    if url.startswith("postgresql"):
        return POSTGRESQL
    return MARIADB if url.startswith(("mysql", "mariadb")) else SQLITE


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""A sample that leaves the column unset, to its Python-side default."""


# --- the Python values the columns hold ------------------------------------------------------


class Color(enum.Enum):
    """A Python enum with str values (SQLAlchemy stores the names unless told otherwise)."""

    RED = "red"
    DARK_BLUE = "dark blue"


class Priority(enum.Enum):
    """A Python enum with int values."""

    LOW = 1
    HIGH = 20


class Mood(enum.StrEnum):
    """A str enum: its members equal their values, so only their type tells them apart."""

    CALM = "calm"
    CROSS = "cross"


def enum_values(members: Iterable[enum.Enum]) -> list[str]:
    """``values_callable``: store each member's value (as text) instead of its name."""
    return [str(member.value) for member in members]


@dataclasses.dataclass(frozen=True)
class Point:
    """An application object a PickleType column holds."""

    x: int
    y: int


class Money(NamedTuple):
    """What :class:`MoneyType` turns its stored text into."""

    amount: decimal.Decimal
    currency: str


class MoneyType(TypeDecorator[Money]):
    """Stored as text ``"12.50 EUR"``, loaded as :class:`Money`: both directions transform."""

    impl = String(40)
    cache_ok = True

    def process_bind_param(self, value: Money | None, dialect: Dialect) -> str | None:
        return None if value is None else f"{value.amount} {value.currency}"

    def process_result_value(self, value: str | None, dialect: Dialect) -> Money | None:
        if value is None:
            return None
        amount, currency = value.split(" ")
        return Money(decimal.Decimal(amount), currency)


@dataclasses.dataclass(frozen=True)
class Celsius:
    """What :class:`TenthsOfDegree` turns its stored integer into."""

    degrees: decimal.Decimal


class TenthsOfDegree(TypeDecorator[Celsius]):
    """A NOT NULL column's decorator, written as many are: it never expects a NULL, and fails
    on one (a NULL it meets can only come from the framework, never from the column)."""

    impl = Integer
    cache_ok = True

    def process_bind_param(self, value: Celsius | None, dialect: Dialect) -> int:
        assert value is not None, "a NOT NULL column"
        return int(value.degrees * 10)

    def process_result_value(self, value: int | None, dialect: Dialect) -> Celsius:
        return Celsius(decimal.Decimal(value) / 10)  # type: ignore[arg-type]


def default_label() -> str:
    """A ``default=`` callable: what an unset column gets."""
    return "set by default"


# --- comparing loaded values -----------------------------------------------------------------


def same_value(expected: Any, actual: Any) -> bool:
    """Equal, and of the same type all the way down: ``"RED" == Color.RED`` is false, but
    ``"calm" == Mood.CALM`` and ``Decimal("1.5") == 1.5`` are true, so equality alone would
    hide a value handed over untyped. Datetimes also agree on their UTC offset."""
    if type(expected) is not type(actual):
        return False
    if isinstance(expected, dict):
        return expected.keys() == actual.keys() and all(
            same_value(expected[key], actual[key]) for key in expected
        )
    if isinstance(expected, list | tuple):
        return len(expected) == len(actual) and all(
            same_value(e, a) for e, a in zip(expected, actual, strict=True)
        )
    if isinstance(expected, dt.datetime | dt.time) and expected.utcoffset() != actual.utcoffset():
        return False
    return bool(expected == actual)


# --- the cases -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ColumnCase:
    """One column type a user may declare: (name, column factory, samples, comparison)."""

    name: str
    """The model attribute (and, unless the column says otherwise, the column's name)."""
    column: Callable[[], Any]
    """A fresh ``mapped_column(...)`` (or ``Column(...)``) each call."""
    samples: tuple[Any, ...]
    """The values written, one per row in turn; ``UNSET`` leaves the column to its default."""
    same: Callable[[Any, Any], bool] = same_value
    dialects: frozenset[str] = EVERY_DIALECT


def _case(
    name: str,
    column: Callable[[], Any],
    *samples: Any,
    same: Callable[[Any, Any], bool] = same_value,
    only: str | None = None,
) -> ColumnCase:
    dialects = EVERY_DIALECT if only is None else frozenset({only})
    return ColumnCase(name, column, samples, same, dialects)


def _nullable(type_: Any, **kwargs: Any) -> Callable[[], Any]:
    return lambda: mapped_column(type_, nullable=True, **kwargs)


MOMENT = dt.datetime(2024, 2, 29, 23, 59, 58, 123456)
ZONE = dt.timezone(dt.timedelta(hours=5, minutes=30))

CASES: tuple[ColumnCase, ...] = (
    # SQLAlchemy's generic types.
    _case("string", _nullable(String(40)), "plain", "ünïcødé ✓", "", None),
    _case("text", _nullable(Text), "long text " * 40, None),
    _case("integer", _nullable(Integer), 0, -7, 2**31 - 1, None),
    _case("big_integer", _nullable(BigInteger), 2**62, -(2**62), None),
    _case("small_integer", _nullable(SmallInteger), 32767, -1, None),
    _case("boolean", _nullable(Boolean), True, False, None),
    # Enum: native (a PostgreSQL type) and not (VARCHAR), by name and by value.
    _case(
        "enum_native",
        _nullable(Enum(Color, name="users_color")),
        Color.RED,
        Color.DARK_BLUE,
        None,
    ),
    _case(
        "enum_native_int_values",
        _nullable(Enum(Priority, name="users_priority")),
        Priority.HIGH,
        Priority.LOW,
        None,
    ),
    _case(
        "enum_native_by_value",
        _nullable(Enum(Color, name="users_color_value", values_callable=enum_values)),
        Color.DARK_BLUE,
        Color.RED,
        None,
    ),
    _case(
        "enum_varchar",
        _nullable(Enum(Color, native_enum=False)),
        Color.DARK_BLUE,
        None,
        Color.RED,
    ),
    _case(
        "enum_varchar_int_values",
        _nullable(Enum(Priority, native_enum=False)),
        Priority.LOW,
        Priority.HIGH,
        None,
    ),
    _case(
        "enum_varchar_by_int_value",
        _nullable(Enum(Priority, native_enum=False, values_callable=enum_values)),
        Priority.HIGH,
        None,
        Priority.LOW,
    ),
    _case(
        "enum_str_enum_by_value",
        _nullable(Enum(Mood, native_enum=False, values_callable=enum_values, length=10)),
        Mood.CROSS,
        Mood.CALM,
        None,
    ),
    # TypeDecorators whose process_bind_param and process_result_value transform.
    _case(
        "decorated",
        _nullable(MoneyType),
        Money(decimal.Decimal("12.50"), "EUR"),
        None,
        Money(decimal.Decimal("-0.01"), "JPY"),
    ),
    _case(
        "decorated_not_null",
        lambda: mapped_column(TenthsOfDegree, nullable=False),
        Celsius(decimal.Decimal("21.5")),
        Celsius(decimal.Decimal("-40")),
    ),
    _case("pickled", _nullable(PickleType), {"nested": [1, (2, 3)]}, Point(1, 2), None),
    # JSON, and the PostgreSQL-only JSONB and ARRAY.
    _case(
        "json",
        _nullable(JSON),
        {"a": 1, "b": [1, 2.5, "x", None], "c": {"d": True}},
        [1, "two"],
        "just a string",
        None,
    ),
    _case(
        "jsonb",
        _nullable(postgresql.JSONB),
        {"deep": {"er": [1, 2.25]}, "flag": False},
        None,
        only=POSTGRESQL,
    ),
    _case("int_array", _nullable(postgresql.ARRAY(Integer)), [3, 1, 2], [], None, only=POSTGRESQL),
    _case("text_array", _nullable(postgresql.ARRAY(Text)), ["a", "b c"], None, only=POSTGRESQL),
    # MariaDB's own: a DOUBLE read as Decimal (its default), and the long text and binary types.
    _case(
        "double_as_decimal",
        _nullable(mysql.DOUBLE()),
        decimal.Decimal("1.5"),
        decimal.Decimal("-2.25E+10"),
        None,
        only=MARIADB,
    ),
    _case("longtext", _nullable(mysql.LONGTEXT), "x" * 70_000, None, only=MARIADB),
    _case("mediumblob", _nullable(mysql.MEDIUMBLOB), b"\x00" * 70_000, None, only=MARIADB),
    # Uuid, as UUID objects and as strings.
    _case("uuid", _nullable(Uuid), uuid.UUID("5e0f6a1c-53bb-4a5f-9d7e-1a2b3c4d5e6f"), None),
    _case(
        "uuid_as_str",
        _nullable(Uuid(as_uuid=False)),
        "0b8f0d2e-6c36-4a1c-a2b4-7f00c1d2e3f4",
        None,
    ),
    # Numbers.
    _case(
        "numeric",
        _nullable(Numeric(12, 3)),
        decimal.Decimal("12.345"),
        decimal.Decimal("-0.001"),
        None,
    ),
    _case("numeric_as_float", _nullable(Numeric(12, 3, asdecimal=False)), 12.345, -0.5, None),
    _case("float", _nullable(Float), 1.5, -2.25e10, None),
    # Time.
    _case("datetime", _nullable(DateTime), MOMENT, None),
    _case(
        "datetime_tz",
        _nullable(DateTime(timezone=True)),
        MOMENT.replace(tzinfo=ZONE),
        MOMENT.replace(tzinfo=dt.UTC),
        None,
    ),
    _case("date", _nullable(Date), dt.date(2000, 1, 1), None),
    _case("time", _nullable(Time), dt.time(13, 14, 15, 16), None),
    _case("interval", _nullable(Interval), dt.timedelta(days=3, seconds=5, microseconds=7), None),
    _case("binary", _nullable(LargeBinary), b"\x00\xff raw \x80", b"", None),
    # Python-side defaults: the ORM calls them when the attribute is left unset.
    _case("default_callable", _nullable(String(40), default=default_label), UNSET, "given"),
    _case(
        "default_uuid",
        lambda: mapped_column(Uuid, nullable=False, default=uuid.uuid4),
        UNSET,
    ),
    # Attributes named apart from their columns, and column keys other than the names.
    _case("renamed", lambda: mapped_column("renamed_in_db", String(20)), "by attribute", None),
    _case(
        "keyed",
        lambda: mapped_column("keyed_in_db", Integer, key="keyed_key", nullable=True),
        41,
        None,
    ),
    _case(
        "keyed_core",
        lambda: Column("keyed_core_in_db", Enum(Color, native_enum=False), key="keyed_core_key"),
        Color.RED,
        None,
    ),
)


def cases(dialect: str) -> tuple[ColumnCase, ...]:
    """The cases a dialect runs."""
    return tuple(case for case in CASES if dialect in case.dialects)


# --- the model -------------------------------------------------------------------------------


class UsersBase(DeclarativeBase):
    """The metadata of this tier's models, apart from the other tiers'."""


@functools.cache
def buffer_model(dialect: str) -> type[Any]:
    """A buffer model with one column per case of ``dialect``, and ``position``."""
    name = f"users_typed_events_{dialect}"
    attributes: dict[str, Any] = {
        "__tablename__": name,
        "__module__": __name__,
        "position": mapped_column(Integer, nullable=False),
    }
    attributes.update({case.name: case.column() for case in cases(dialect)})
    return type(f"TypedEvent{dialect.title()}", (BufferMixin, UsersBase), attributes)


def row_count(dialect: str) -> int:
    """How many rows it takes to write every sample of every case once."""
    return max(len(case.samples) for case in cases(dialect))


def new_events(model: type[Any], dialect: str, first_position: int = 0) -> list[Any]:
    """Unsaved instances of ``model``: row ``n`` holds sample ``n`` of each case, in turn."""
    events = []
    for position in range(first_position, first_position + row_count(dialect)):
        values = {case.name: case.samples[position % len(case.samples)] for case in cases(dialect)}
        events.append(
            model(position=position, **{k: v for k, v in values.items() if v is not UNSET})
        )
    return events


def attribute_names(model: type[Any]) -> list[str]:
    """The model's attributes in the order of its table's columns (the order of a row)."""
    mapper = inspect(model)
    return [mapper.get_property_by_column(column).key for column in mapper.local_table.columns]


def loaded(session: Session, model: type[Any], ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """What ``session.get`` returns for each id, as attribute values, by id."""
    names = attribute_names(model)
    found = {}
    for id_ in ids:
        instance = session.get(model, id_)
        assert instance is not None, f"no row {id_}"
        found[id_] = {name: getattr(instance, name) for name in names}
    return found


class Mismatches:
    """Values that differ from what was expected, gathered per column across rows and calls."""

    def __init__(self, dialect: str) -> None:
        self.checked = (*cases(dialect), ColumnCase("position", lambda: None, ()))
        self.by_column: dict[str, list[str]] = {}

    def compare(self, expected: dict[str, Any], actual: dict[str, Any], where: str) -> None:
        """Compare one row's attribute values with the expected ones; ``where`` names it."""
        for case in self.checked:
            want, got = expected[case.name], actual[case.name]
            if not case.same(want, got):
                self.by_column.setdefault(case.name, []).append(
                    f"{where}: expected {want!r} ({type(want).__name__}), "
                    f"got {got!r} ({type(got).__name__})"
                )

    def add(self, what: str, difference: str) -> None:
        """A difference that is not one column's value."""
        self.by_column.setdefault(what, []).append(difference)

    def summary(self) -> dict[str, str]:
        """The first difference of each column, and how many more there are."""
        return {
            column: found[0] + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
            for column, found in sorted(self.by_column.items())
        }

    def report(self) -> str:
        """The summary one column per line, for a failure message no diff truncates."""
        return "".join(f"\n  {column}: {what}" for column, what in self.summary().items())
