"""Archived values to and from JSON: an archived payload read back (:func:`parse_payload`), a
value of it turned back into what its column stores (a replay), and an operator's value or text
turned into what a column stores (an edit).

One block on purpose: the conversions between the archive's JSON and the columns live here and
nowhere else, so that they change together.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
import uuid
from typing import Any

from sqlalchemy import JSON, Column, Dialect, Float, TypeDecorator

from outbox._core.checks import json_problem
from outbox._db import dialects
from outbox.exceptions import ConfigurationError, ReplayError


def _edited_value(column: Column[Any], value: Any, dialect: Dialect) -> Any:
    """A value an operator gave for ``column``, as the database stores it."""
    if value is None:
        if not column.nullable:
            raise ConfigurationError(f"{column.name}: NULL is not allowed (the column is NOT NULL)")
        return None
    try:
        python_type = column.type.python_type
    except NotImplementedError:
        python_type = object
    if isinstance(value, str) and python_type is not str:
        value = _parsed_text(column, python_type, value, dialect)
    widened = (python_type is float and isinstance(value, int | decimal.Decimal)) or (
        python_type is decimal.Decimal and isinstance(value, int | float)
    )
    if python_type is not object and not isinstance(value, python_type) and not widened:
        raise ConfigurationError(
            f"{column.name}: expected {python_type.__name__}, got {type(value).__name__}"
        )
    problem = json_problem(value, column.name) if isinstance(value, str | dict | list) else None
    if problem is not None:
        raise ConfigurationError(problem)
    if isinstance(column.type, TypeDecorator):
        try:
            value = column.type.process_bind_param(value, dialect)
        except (TypeError, ValueError) as error:
            raise ConfigurationError(f"{column.name}: {error}") from error
    return value


def _parsed_text(column: Column[Any], python_type: type, text: str, dialect: Dialect) -> Any:
    try:
        if isinstance(dialects.storage_type(column.type, dialect), JSON) or python_type in (
            dict,
            list,
        ):
            return json.loads(text)
        if python_type is bool:
            word = text.strip().lower()
            if word not in ("true", "false", "1", "0"):
                raise ValueError(f"expected true or false, got {text!r}")
            return word in ("true", "1")
        if python_type in _FROM_TEXT:
            return _FROM_TEXT[python_type](text)
        if python_type is decimal.Decimal:
            return decimal.Decimal(text)
        if python_type is bytes:
            return bytes.fromhex(text)
        if python_type in (int, float):
            return python_type(text)
    except (ValueError, TypeError, decimal.InvalidOperation) as error:
        raise ConfigurationError(
            f"{column.name}: {text!r} is not a valid {python_type.__name__}: {error}"
        ) from error
    return text


def parse_payload(text: str | None) -> dict[str, Any]:
    """An archived payload, with exact decimals and integers of any size.

    A payload archived in the lenient form (PostgreSQL: the row as JSON text) is a JSON
    string holding the row's JSON: it is parsed twice.
    """
    if text is None:
        raise ValueError("empty payload")
    payload = json.loads(text, parse_float=decimal.Decimal, parse_int=_integer)
    if isinstance(payload, str):
        payload = json.loads(payload, parse_float=decimal.Decimal, parse_int=_integer)
    if not isinstance(payload, dict):
        raise ValueError("payload is not a JSON object")
    return payload


def _integer(text: str) -> int | decimal.Decimal:
    # Python refuses to parse integers of more than 4,300 digits; Decimal has no such limit.
    return int(text) if len(text) < 4000 else decimal.Decimal(text)


def _coerce(
    column: Column[Any], value: Any, dialect: Dialect, *, json_as_text: bool = False
) -> Any:
    """Turn a JSON value back into the value the column stores on ``dialect``: the archive holds
    stored values, past any TypeDecorator (a PickleType's pickled bytes)."""
    if value is None:
        return None
    stored = dialects.storage_type(column.type, dialect)
    try:
        python_type = stored.python_type
    except NotImplementedError:
        return value
    if isinstance(stored, JSON):
        if json_as_text and isinstance(value, str):
            value = json.loads(value, parse_float=decimal.Decimal, parse_int=_integer)
        return _plain_numbers(value)
    if isinstance(value, python_type) and not isinstance(stored, Float):
        return value
    try:
        if isinstance(stored, Float):
            # A double, whichever Python type the column reads it as (``asdecimal``): bound as
            # a float, exactly; MariaDB would take a Decimal of a large exponent for a DECIMAL
            # it cannot hold.
            return float(value)
        if python_type in _FROM_TEXT:
            return _FROM_TEXT[python_type](value)
        if python_type is decimal.Decimal:
            return decimal.Decimal(str(value))
        if python_type is bytes:
            return _bytes(value)
        if python_type in (int, float, str, bool):
            return python_type(value)
    except (TypeError, ValueError, binascii.Error) as error:
        raise ReplayError(
            f"cannot turn archived value of column {column.name!r} back into "
            f"{python_type.__name__}: {error}"
        ) from error
    return value


# The types JSON carries as text (ISO 8601 times, UUIDs), and how each is read back: by a
# replay from the archive's payloads, and by an edit from an operator's text.
_FROM_TEXT: dict[type, Any] = {
    dt.datetime: dt.datetime.fromisoformat,
    dt.date: dt.date.fromisoformat,
    dt.time: dt.time.fromisoformat,
    uuid.UUID: uuid.UUID,
}


def _plain_numbers(value: Any) -> Any:
    """Decimals inside a JSON value back to int or float: what its column serializes."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, list):
        return [_plain_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain_numbers(v) for k, v in value.items()}
    return value


def _bytes(value: str) -> bytes:
    # PostgreSQL's to_jsonb writes bytea as "\\x<hex>"; others may give base64.
    if value.startswith("\\x"):
        return bytes.fromhex(value[2:])
    return base64.b64decode(value)
