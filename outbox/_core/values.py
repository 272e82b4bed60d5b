"""Every crossing of a value between JSON and a column, in one place: what a column holds as
JSON's value (what ``--json`` prints, the HTTP API answers and the sinks' default bodies
carry), and JSON's value, or an operator's text, as what a column takes (what ingest, an
edit and a replay write).

One encoding per type, written and read alike on every face:

- times (``datetime``, ``date``, ``time``): ISO 8601 text, as ``isoformat`` writes it (a
  datetime keeps its UTC offset when it has one);
- intervals (``timedelta``): Python's text of them, ``"3 days, 0:00:05.000007"``;
- UUIDs: their text with dashes; decimals: their text, every digit kept;
- bytes: standard base64 (RFC 4648, the ``+/`` alphabet, with padding). Hex is not read:
  ``"deadbeef"`` is valid hex and valid base64 and would mean other bytes, so text that only
  hex reads is refused with a message saying bytes are base64;
- enums: by their members' values (``Color.RED`` with value ``"red"`` is ``"red"``);
- booleans, integers, floats, text, and a JSON column's value: JSON's own.

The archive is storage, not a face: its payloads are rows as the database writes them as JSON
(PostgreSQL's ``to_jsonb``, and the other databases' functions made to match it), in which
binary is ``"\\\\x<hex>"``, PostgreSQL's text of a bytea (and an interval the database's own
text of it). :func:`from_archived` reads that form back; nothing is answered or accepted in it.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Enum,
    Float,
    Interval,
    SmallInteger,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeEngine

from outbox._core.checks import json_problem, quoted, text_problem

__all__ = [
    "BASE64_PATTERN",
    "INTERVAL_PATTERN",
    "NamedValueError",
    "archived_payload",
    "archived_values",
    "bytes_from_json",
    "bytes_to_json",
    "decimal_digits",
    "exact_json",
    "from_archived",
    "from_json",
    "from_text",
    "integer_range",
    "interval_from_json",
    "jsonable",
    "storage_type",
    "to_json",
]


# --- column values as JSON ------------------------------------------------------------------


def to_json(value: Any) -> Any:
    """One value a column holds as JSON's value, in the encodings above: a list, tuple or
    dict (a JSON or ARRAY column's value) item by item, JSON's own values as they are; a
    ``TypeError`` for a value of any other type (an application's own object).

    Also ``json.JSONEncoder``'s ``default``: the sinks' bodies are written with it.
    """
    # Called for a value of most events a sink sends (a time, an amount): the common types are
    # looked up by their class first, a third of what the isinstance checks below cost (for a
    # decimal, 0.3 against 1 µs).
    write = _WRITERS.get(type(value))
    if write is not None:
        return write(value)
    if isinstance(value, enum.Enum):  # before str and int: a StrEnum is text, an IntEnum a number
        return to_json(value.value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value)
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes_to_json(value)
    if isinstance(value, dict):
        return {str(to_json(k)): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    raise TypeError(f"a {type(value).__qualname__} value cannot be written as JSON")


def bytes_to_json(value: bytes | bytearray | memoryview) -> str:
    """Bytes as JSON's text: standard base64, padded."""
    return base64.b64encode(value).decode("ascii")


def _same(value: Any) -> Any:
    return value


_WRITERS: dict[type[Any], Callable[[Any], Any]] = {
    dt.datetime: dt.datetime.isoformat,
    dt.date: dt.date.isoformat,
    dt.time: dt.time.isoformat,
    uuid.UUID: str,
    decimal.Decimal: str,
    bytes: bytes_to_json,
    str: _same,
    int: _same,
    float: _same,
    bool: _same,
    type(None): _same,
}


def jsonable(value: Any) -> Any:
    """``value`` as JSON's values: column values as :func:`to_json` writes them, dataclasses
    as objects (with their public properties), enums by value, sets as lists, and anything
    else as its text. What ``--json`` prints and the HTTP API answers, the same for both
    faces."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        found = {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for name in dir(type(value)):
            if isinstance(getattr(type(value), name, None), property) and not name.startswith("_"):
                found[name] = jsonable(getattr(value, name))
        return found
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, dict):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    try:
        return to_json(value)
    except TypeError:
        return str(value)


# --- JSON as column values ------------------------------------------------------------------


class NamedValueError(ValueError):
    """A value a column does not take, whose message names the column already (and where
    within the value)."""


def from_json(column: Column[Any], value: Any) -> Any:
    """JSON's value (as a producer sends it; or the column's own Python type) as ``column``'s
    Python value, checked against the column: NULL where it is allowed, text every database
    stores and no longer than the column, integers in range, decimals within the column's
    digits, the encodings above for the rest. A ``ValueError`` or ``TypeError`` says what is
    wrong (:class:`NamedValueError`: naming the column)."""
    if value is None:
        if not column.nullable:
            raise ValueError("NULL is not allowed (the column is NOT NULL)")
        return None
    try:
        python_type = column.type.python_type
    except NotImplementedError:
        return value
    if isinstance(column.type, JSON) or python_type in (dict, list):
        problem = json_problem(value, column.name)
        if problem is not None:
            raise NamedValueError(problem)
        return value
    if isinstance(value, str) and text_problem(value) is not None:
        raise ValueError(text_problem(value))
    members = _enum_class(column.type)
    if members is not None:
        return _member(members, value, text=False)
    if python_type is str and isinstance(value, str):
        if isinstance(column.type, Enum) and column.type.enums and value not in column.type.enums:
            raise ValueError(f"{quoted(value)} is not one of {', '.join(column.type.enums)}")
        length = getattr(column.type, "length", None)
        if length is not None and len(value) > length:
            raise ValueError(f"{len(value)} characters, more than the column's {length}")
        return value
    if python_type is int and isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON's 2.0 is the integer 2
    if python_type is int and isinstance(value, int) and not isinstance(value, bool):
        low, high = integer_range(column)
        if not low <= value <= high:
            raise ValueError(f"{value} is out of the column's range ({low} to {high})")
        return value
    if python_type is decimal.Decimal and not isinstance(value, bool):
        if not isinstance(value, int | float | str | decimal.Decimal):
            raise TypeError(f"expected a number or its text, got {type(value).__name__}")
        return _decimal(column, decimal.Decimal(str(value)))
    if isinstance(value, python_type) and not (python_type is int and isinstance(value, bool)):
        return value
    if python_type is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        parse = _FROM_TEXT.get(python_type)
        if parse is not None:
            return parse(value)
    raise TypeError(f"expected {python_type.__name__}, got {type(value).__name__}")


def from_text(column: Column[Any], value: Any, dialect: Dialect) -> Any:
    """A value an operator gives for ``column`` (an edit), as the database stores it on
    ``dialect``: the column's Python type, or text parsed for it (``true``/``false``/``1``/
    ``0``, numbers, the encodings above, JSON's text for a JSON column), or a JSON number for
    a float or decimal column; then through the column's ``TypeDecorator``, as a write through
    the model would. A ``ValueError`` or ``TypeError`` says what is wrong; None is NULL, left
    to the caller to allow."""
    if value is None:
        return None
    try:
        python_type = column.type.python_type
    except NotImplementedError:
        python_type = object
    if isinstance(value, str) and python_type is not str:
        try:
            value = _parsed_text(column, python_type, value, dialect)
        except (ValueError, TypeError, decimal.InvalidOperation) as error:
            if python_type is bytes:
                raise  # its message quotes the text and says what bytes are
            raise ValueError(f"{value!r} is not a valid {python_type.__name__}: {error}") from error
    widened = (python_type is float and isinstance(value, int | decimal.Decimal)) or (
        python_type is decimal.Decimal and isinstance(value, int | float)
    )
    if python_type is not object and not isinstance(value, python_type) and not widened:
        raise TypeError(f"expected {python_type.__name__}, got {type(value).__name__}")
    problem = json_problem(value, column.name) if isinstance(value, str | dict | list) else None
    if problem is not None:
        raise NamedValueError(problem)
    if isinstance(column.type, TypeDecorator):
        value = _through_decorator(column.type, value, dialect)
    return value


def _through_decorator(type_: TypeDecorator[Any], value: Any, dialect: Dialect) -> Any:
    """``value`` as ``type_`` hands it to the type it is stored as, as a write through the
    model would. SQLAlchemy's ``Interval`` converts in its bind processor, not in
    ``process_bind_param``: where it is stored as a time (SQLite, MariaDB), as a time since its
    epoch. A decorator that converts only in its processors (``PickleType``) is not edited."""
    if isinstance(type_, Interval):
        if not isinstance(storage_type(type_, dialect), DateTime):
            return value
        try:
            return type_.epoch + value
        except OverflowError:
            raise ValueError(f"{value} is out of the range this database stores") from None
    if type(type_).process_bind_param is TypeDecorator.process_bind_param:
        raise TypeError(f"a {type(type_).__name__} column takes no value as text")
    return type_.process_bind_param(value, dialect)


def _parsed_text(column: Column[Any], python_type: type, text: str, dialect: Dialect) -> Any:
    if isinstance(storage_type(column.type, dialect), JSON) or python_type in (dict, list):
        return json.loads(text)
    members = _enum_class(column.type)
    if members is not None:
        return _member(members, text, text=True)
    if python_type is bool:
        word = text.strip().lower()
        if word not in ("true", "false", "1", "0"):
            raise ValueError(f"expected true or false, got {text!r}")
        return word in ("true", "1")
    if python_type in _FROM_TEXT:
        return _FROM_TEXT[python_type](text)
    if python_type is decimal.Decimal:
        return decimal.Decimal(text)
    if python_type in (int, float):
        return python_type(text)
    return text


def from_archived(
    column: Column[Any], value: Any, dialect: Dialect, *, json_as_text: bool = False
) -> Any:
    """A value of an archived payload as ``column`` stores it on ``dialect`` (the archive
    holds stored values, past any ``TypeDecorator``: a ``PickleType``'s pickled bytes), for a
    replay to write back. Binary is read in the database's own form, ``"\\\\x<hex>"``, or
    base64. ``json_as_text``: the payload keeps JSON columns as their text (SQLite's lenient
    form). A ``ValueError`` or ``TypeError`` says what is wrong."""
    if value is None:
        return None
    stored = storage_type(column.type, dialect)
    try:
        python_type = stored.python_type
    except NotImplementedError:
        return value
    if isinstance(stored, JSON):
        if json_as_text and isinstance(value, str):
            value = exact_json(value)
        return _plain_numbers(value)
    if isinstance(value, python_type) and not isinstance(stored, Float):
        return value
    if isinstance(stored, Float):
        # A double, whichever Python type the column reads it as (``asdecimal``): bound as a
        # float, exactly; MariaDB would take a Decimal of a large exponent for a DECIMAL it
        # cannot hold.
        return float(value)
    if python_type is bytes:
        # The database's own text of binary (to_jsonb's bytea, and hex() on the others).
        if isinstance(value, str) and value.startswith("\\x"):
            return bytes.fromhex(value[2:])
        return bytes_from_json(value)
    if python_type is dt.timedelta:
        return value  # the database's own text of an interval (to_jsonb's), which it reads
    if python_type in _FROM_TEXT:
        return _FROM_TEXT[python_type](value)
    if python_type is decimal.Decimal:
        return decimal.Decimal(str(value))
    if python_type in (int, float, str, bool):
        return python_type(value)
    return value


def archived_payload(text: str | None) -> dict[str, Any]:
    """An archived payload's text as its values by column name, with exact decimals and
    integers of any size; a ``ValueError`` for text that is no JSON object.

    A payload archived in the lenient form (PostgreSQL: the row as JSON text) is a JSON
    string holding the row's JSON: it is parsed twice.
    """
    if text is None:
        raise ValueError("empty payload")
    payload = exact_json(text)
    if isinstance(payload, str):
        payload = exact_json(payload)
    if not isinstance(payload, dict):
        raise ValueError("payload is not a JSON object")
    return payload


def archived_values(
    columns: Iterable[Column[Any]],
    payload: Mapping[str, Any],
    dialect: Dialect,
    *,
    json_as_text: bool = False,
) -> dict[str, Any]:
    """An archived payload's values as their ``columns`` store them (:func:`from_archived`),
    to be shown in the encodings above as a live event's are (binary in base64, not as the
    archive's hex); a value of no column here (one dropped since), or one its column does not
    read, as archived."""
    by_name = {column.name: column for column in columns}
    shown = {}
    for name, value in payload.items():
        column = by_name.get(name)
        try:
            shown[name] = (
                value
                if column is None
                else from_archived(column, value, dialect, json_as_text=json_as_text)
            )
        except (ValueError, TypeError):
            shown[name] = value
    return shown


def exact_json(text: str) -> Any:
    """JSON text read with exact decimals, and integers of any size."""
    return json.loads(text, parse_float=decimal.Decimal, parse_int=_integer)


def _integer(text: str) -> int | decimal.Decimal:
    # Python refuses to parse integers of more than 4,300 digits; Decimal has no such limit.
    return int(text) if len(text) < 4000 else decimal.Decimal(text)


def _plain_numbers(value: Any) -> Any:
    """Decimals inside a JSON value back to int or float: what its column serializes."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, list):
        return [_plain_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain_numbers(v) for k, v in value.items()}
    return value


# --- the encodings read back ----------------------------------------------------------------

BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
"""The text bytes are written in (standard base64, padded), as a regular expression: for a
JSON Schema's ``pattern``."""
_BASE64 = re.compile(BASE64_PATTERN)
_HEX = re.compile(r"(?:\\x|0x)?[0-9a-fA-F]+")


def bytes_from_json(text: Any) -> bytes:
    """Bytes from JSON's text: standard base64 with its padding, nothing else (no hex, no
    URL-safe alphabet, no line breaks); a ``ValueError`` saying so."""
    if not isinstance(text, str):
        raise TypeError(f"expected bytes as base64 text, got {type(text).__name__}")
    if _BASE64.fullmatch(text) is None:
        padded = text + "=" * (-len(text) % 4)
        hint = (
            ", not hex"
            if _HEX.fullmatch(text)
            else "; this text lacks its padding (=)"
            if _BASE64.fullmatch(padded)
            else ""
        )
        raise ValueError(
            f"{quoted(text, 40)} is not base64: bytes are standard base64 (RFC 4648, padded){hint}"
        )
    return base64.b64decode(text, validate=True)


INTERVAL_PATTERN = (
    r"^(?:(-?[0-9]{1,9}) days?, )?([0-9]{1,9}):([0-5][0-9]):([0-5][0-9])(?:\.([0-9]{1,6}))?$"
)
"""The text intervals are written in (``str(timedelta)``; a fraction of 1 to 6 digits), as a
regular expression."""
_INTERVAL = re.compile(INTERVAL_PATTERN)
# SQLite and MariaDB store an interval as a time since 1970: an interval is one only if that
# time is one (years 1 to 9999), on every database alike.
_INTERVAL_EPOCH = dt.datetime(1970, 1, 1)


def interval_from_json(text: str) -> dt.timedelta:
    """An interval from the text :func:`to_json` writes (``str(timedelta)``), within what
    every database stores (1970 plus it a time of years 1 to 9999)."""
    found = _INTERVAL.fullmatch(text)
    if found is None:
        raise ValueError(f"{quoted(text, 40)} is not an interval such as '3 days, 0:00:05.5'")
    days, hours, minutes, seconds, fraction = found.groups()
    try:
        value = dt.timedelta(
            days=int(days or 0),
            hours=int(hours),
            minutes=int(minutes),
            seconds=int(seconds),
            microseconds=int((fraction or "0").ljust(6, "0")),
        )
        _INTERVAL_EPOCH + value  # raises OverflowError where no database stores it
    except OverflowError:
        raise ValueError(
            f"{quoted(text, 40)} is out of the range an interval is stored in"
        ) from None
    return value


# The types JSON carries as text, and how each is read back.
_FROM_TEXT: dict[type, Callable[[str], Any]] = {
    dt.datetime: dt.datetime.fromisoformat,
    dt.date: dt.date.fromisoformat,
    dt.time: dt.time.fromisoformat,
    dt.timedelta: interval_from_json,
    uuid.UUID: uuid.UUID,
    bytes: bytes_from_json,
}


def _enum_class(type_: TypeEngine[Any]) -> type[enum.Enum] | None:
    members = getattr(type_, "enum_class", None) if isinstance(type_, Enum) else None
    return members if isinstance(members, type) and issubclass(members, enum.Enum) else None


def _member(members: type[enum.Enum], value: Any, *, text: bool) -> enum.Enum:
    """The member of ``members`` whose value ``value`` is (or whose value's text it is, for an
    operator's ``text``)."""
    if isinstance(value, members):
        return value
    for member in members:
        given = member.value
        if type(given) is type(value) and given == value:
            return member
        if text and isinstance(value, str) and str(given) == value:
            return member
    known = ", ".join(repr(m.value) for m in members)
    raise ValueError(f"{value!r} is not a value of {members.__name__} ({known})")


# --- what a column takes --------------------------------------------------------------------


def storage_type(type_: TypeEngine[Any], dialect: Dialect) -> TypeEngine[Any]:
    """The type ``type_``'s values are stored as on ``dialect``: its implementation there, with
    every ``TypeDecorator`` unwrapped (a ``PickleType`` stores bytes; an ``Interval`` is a
    DATETIME on SQLite). The archive holds stored values, and replay writes them back as stored,
    past the decorators' conversions: through them, a value would be converted twice."""
    impl = type_.dialect_impl(dialect)
    while isinstance(impl, TypeDecorator):
        impl = impl.load_dialect_impl(dialect).dialect_impl(dialect)
    return impl


def integer_range(column: Column[Any]) -> tuple[int, int]:
    """The values an integer column holds on every database outbox runs on."""
    bits = 16 if isinstance(column.type, SmallInteger) else 32
    if isinstance(column.type, BigInteger):
        bits = 64
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def decimal_digits(column: Column[Any]) -> int | None:
    """The digits a NUMERIC(p, s) column holds before the point (p - s); None: not said."""
    precision = getattr(column.type, "precision", None)
    scale = getattr(column.type, "scale", None) or 0
    return None if precision is None else precision - scale


def _decimal(column: Column[Any], number: decimal.Decimal) -> decimal.Decimal:
    if not number.is_finite():
        raise ValueError(f"{number} is not a finite number")
    whole = decimal_digits(column)
    if whole is None:
        return number
    if abs(number) >= 10**whole:
        raise ValueError(f"{number} has more than the column's {whole} digits before the point")
    # The database rounds to the column's scale, half away from zero (PostgreSQL and MariaDB
    # alike): a number just under the bound can round onto it, which it then refuses.
    scale = getattr(column.type, "scale", None) or 0
    stored = number.quantize(
        decimal.Decimal(1).scaleb(-scale),
        rounding=decimal.ROUND_HALF_UP,
        context=decimal.Context(prec=whole + scale + 1),
    )
    if abs(stored) >= 10**whole:
        raise ValueError(
            f"{number} rounds to {stored}, more than the column's {whole} digits before the point"
        )
    return number
