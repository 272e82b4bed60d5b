"""Events written by producers outside Python (the HTTP API's ingest): checked against the
buffer model's columns, idempotent by a key the producer gives.

A producer that retries after a timeout sends the same key again: the event written the first
time is found by its key and nothing is written twice. The keys live in
``outbox_ingest_keys``, written in the transaction that writes the events, so a batch is
written whole or not at all.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, Connection, SmallInteger, Table
from sqlalchemy.exc import IntegrityError

from outbox._db import queries, run_in_transaction
from outbox.app import Outbox
from outbox.buffer import BufferMixin
from outbox.exceptions import ConfigurationError

__all__ = ["MAX_EVENTS", "MAX_KEY_LENGTH", "IngestError", "Ingested", "ingest"]

MAX_EVENTS = 5_000
"""Events one call writes at most: a larger batch is several calls."""
MAX_KEY_LENGTH = 200
"""The longest idempotency key (``outbox_ingest_keys.key``)."""
# A concurrent producer may record one of the keys between the lookup and the write: the write
# fails on the key's primary key, and the batch is looked up and written again.
_RACES = 5


class IngestError(ConfigurationError):
    """A batch of events that cannot be written as given: every problem, each naming the event
    (by its position and key) and the column."""

    def __init__(self, problems: list[str]) -> None:
        shown = "; ".join(problems[:20]) + ("; ..." if len(problems) > 20 else "")
        super().__init__(shown)
        self.problems = problems


@dataclass(frozen=True, slots=True)
class Ingested:
    """One event of a batch: its key, the id of the event written under it, and whether this
    call wrote it (False: an earlier call did, and nothing was written)."""

    key: str
    event_id: int
    created: bool


def ingest(
    app: Outbox, handler: str, events: Sequence[tuple[str, Mapping[str, Any]]]
) -> list[Ingested]:
    """Write events into ``handler``'s buffer, each under the producer's idempotency ``key``:
    ``events`` is a sequence of (key, values). Values are JSON's (text for times, UUIDs,
    decimals and bytes as hex) or the columns' own Python types.

    Every event is checked first (its key, each column named, each value, the columns that must
    have one): any problem raises :class:`IngestError` listing them all, and nothing is
    written. A key written before returns that event, ``created=False``; a key twice in one
    batch is written once.
    """
    target = app.get_handler(handler)
    if not isinstance(events, Sequence) or isinstance(events, str | bytes):
        raise IngestError(["events: expected a list of (key, values)"])
    if not 1 <= len(events) <= MAX_EVENTS:
        raise IngestError([f"events: expected 1 to {MAX_EVENTS} events, got {len(events)}"])
    rows: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for position, item in enumerate(events):
        key, values = item if isinstance(item, tuple) and len(item) == 2 else (None, None)
        where = f"event {position}" + (f" (key {key!r})" if isinstance(key, str) else "")
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_LENGTH:
            problems.append(f"{where}: key: expected text of 1 to {MAX_KEY_LENGTH} characters")
            continue
        if not isinstance(values, Mapping):
            problems.append(f"{where}: values: expected an object of column values")
            continue
        row, found = _checked(target.table, values)
        problems += [f"{where}: {problem}" for problem in found]
        rows.setdefault(key, row)
    if problems:
        raise IngestError(problems)
    for _ in range(_RACES):
        try:
            written = run_in_transaction(
                app.engine, lambda conn: _write(conn, app.dialect, target.table, handler, rows)
            )
        except IntegrityError:
            continue
        return [written[key] for key in dict.fromkeys(k for k, _ in events)]
    raise IngestError(
        [f"events: keys kept being written by other producers at the same time ({_RACES} tries)"]
    )


def _write(
    conn: Connection, dialect: str, table: Table, handler: str, rows: dict[str, dict[str, Any]]
) -> dict[str, Ingested]:
    known = queries.ingested_keys(conn, dialect, handler, list(rows))
    fresh = [key for key in rows if key not in known]
    result = {key: Ingested(key, event_id, False) for key, event_id in known.items()}
    by_columns: dict[tuple[str, ...], list[str]] = {}
    for key in fresh:
        by_columns.setdefault(tuple(sorted(rows[key])), []).append(key)
    written: dict[str, int] = {}
    for keys in by_columns.values():
        ids = queries.insert_events_returning(conn, table, [rows[key] for key in keys])
        written.update(zip(keys, ids, strict=True))
    if written:
        queries.record_ingested(conn, handler, written)
    result.update({key: Ingested(key, event_id, True) for key, event_id in written.items()})
    return result


def _checked(table: Table, values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The row ``values`` make for ``table``, and what is wrong with them."""
    columns = {column.name: column for column in table.columns}
    row: dict[str, Any] = {}
    problems = []
    for name, value in values.items():
        column = columns.get(name) if isinstance(name, str) else None
        if column is None:
            problems.append(f"{name!r} is not a column of buffer {table.name}")
            continue
        if name in BufferMixin.OWN_COLUMNS:
            problems.append(f"{name!r} is outbox's own column: it is set when the event is written")
            continue
        try:
            row[name] = _value(column, value)
        except (ValueError, TypeError, decimal.InvalidOperation) as error:
            problems.append(f"{name}: {error}")
    for name, column in columns.items():
        needed = not column.nullable and column.default is None and column.server_default is None
        if needed and name not in BufferMixin.OWN_COLUMNS and name not in values:
            problems.append(f"{name}: a value is required")
    return row, problems


def _value(column: Column[Any], value: Any) -> Any:
    """A JSON value as ``column``'s Python type; ValueError or TypeError naming what is wrong."""
    if value is None:
        if not column.nullable:
            raise ValueError("NULL is not allowed (the column is NOT NULL)")
        return None
    try:
        python_type = column.type.python_type
    except NotImplementedError:
        return value
    if isinstance(column.type, JSON) or python_type in (dict, list):
        return value
    if python_type is str and isinstance(value, str):
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
        parse = _PARSERS.get(python_type)
        if parse is not None:
            return parse(value)
    raise TypeError(f"expected {python_type.__name__}, got {type(value).__name__}")


def _decimal(column: Column[Any], number: decimal.Decimal) -> decimal.Decimal:
    if not number.is_finite():
        raise ValueError(f"{number} is not a finite number")
    whole = decimal_digits(column)
    if whole is not None and abs(number) >= 10**whole:
        raise ValueError(f"{number} has more than the column's {whole} digits before the point")
    return number


def decimal_digits(column: Column[Any]) -> int | None:
    """The digits a NUMERIC(p, s) column holds before the point (p - s); None: not said."""
    precision = getattr(column.type, "precision", None)
    scale = getattr(column.type, "scale", None) or 0
    return None if precision is None else precision - scale


def integer_range(column: Column[Any]) -> tuple[int, int]:
    """The values an integer column holds on every database outbox runs on."""
    bits = 16 if isinstance(column.type, SmallInteger) else 32
    if isinstance(column.type, BigInteger):
        bits = 64
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


_PARSERS: dict[type, Any] = {
    dt.datetime: dt.datetime.fromisoformat,
    dt.date: dt.date.fromisoformat,
    dt.time: dt.time.fromisoformat,
    uuid.UUID: uuid.UUID,
    bytes: bytes.fromhex,
}
