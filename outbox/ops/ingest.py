"""Events written by producers outside Python (the HTTP API's ingest): checked against the
buffer model's columns, idempotent by a key the producer gives.

A producer that retries after a timeout sends the same key again: the event written the first
time is found by its key and nothing is written twice. The keys live in
``outbox_ingest_keys``, written in the transaction that writes the events, so a batch is
written whole or not at all.

A key sent again with other values is a conflict, as idempotency keys are elsewhere (Stripe
answers an error for a key reused with other parameters): :class:`IngestConflictError`, and
nothing of the batch is written. "The same values" are compared as the database stores them (numbers
at the column's scale, text, times at the column's precision, JSON as a value), never as the
bytes sent: ``"12.5"`` and ``12.50`` in a ``NUMERIC(12, 2)`` are the same.
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.exc import IntegrityError

from outbox._core.checks import quoted, text_problem
from outbox._core.values import NamedValueError, from_json
from outbox._db import queries, run_in_transaction
from outbox.app import Outbox
from outbox.buffer import BufferMixin
from outbox.exceptions import ConfigurationError, OutboxError

__all__ = [
    "MAX_EVENTS",
    "MAX_KEY_LENGTH",
    "IngestConflictError",
    "IngestError",
    "IngestResult",
    "Ingested",
    "ingest",
]

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


class IngestResult(StrEnum):
    """What became of one event of a batch, by its key."""

    NEW = "new"
    """Written now (in a batch refused for a conflict: would have been, and was not)."""
    SAME = "same"
    """Written before with the same values: nothing written."""
    CONFLICT = "conflict"
    """Written before with other values: the batch is refused, nothing written."""
    UNCHECKED = "unchecked"
    """Written before, and its event has left the buffer (delivered, discarded): its values are
    no longer there to compare, and nothing is written."""


@dataclass(frozen=True, slots=True)
class Ingested:
    """One event of a batch: its key, the id of the event written under it (None: a new key
    of a batch refused for a conflict), whether this call wrote it, and what became of it."""

    key: str
    event_id: int | None
    created: bool
    result: IngestResult


class IngestConflictError(OutboxError):
    """Keys of a batch sent before (or earlier in the batch) with other values: nothing of the
    batch was written. ``events`` says, key by key, what became of each
    (:class:`IngestResult`)."""

    def __init__(self, events: list[Ingested]) -> None:
        keys = [e.key for e in events if e.result == IngestResult.CONFLICT]
        named = ", ".join(quoted(k) for k in keys[:10]) + (", ..." if len(keys) > 10 else "")
        word = "key" if len(keys) == 1 else "keys"
        super().__init__(
            f"{word} {named} sent before with other values: nothing of the batch written"
        )
        self.events = events


def ingest(
    app: Outbox, handler: str, events: Sequence[tuple[str, Mapping[str, Any]]]
) -> list[Ingested]:
    """Write events into ``handler``'s buffer, each under the producer's idempotency ``key``:
    ``events`` is a sequence of (key, values). Values are JSON's, in the encodings of
    :mod:`outbox._core.values` (text for times, UUIDs and decimals, bytes in base64), or the
    columns' own Python types.

    Every event is checked first (its key, each column named, each value, the columns that must
    have one, text no database stores: NUL characters and lone surrogates): any problem raises
    :class:`IngestError` listing them all, and nothing is written. A key twice in one batch is
    written once. A key written before returns that event, ``created=False``: ``same`` when its
    values are these; when they are not (or a batch gives a key twice with other values),
    :class:`IngestConflictError` is raised and nothing of the batch is written.
    """
    target = app.get_handler(handler)
    if not isinstance(events, Sequence) or isinstance(events, str | bytes):
        raise IngestError(["events: expected a list of (key, values)"])
    if not 1 <= len(events) <= MAX_EVENTS:
        raise IngestError([f"events: expected 1 to {MAX_EVENTS} events, got {len(events)}"])
    rows: dict[str, dict[str, Any]] = {}
    twice: set[str] = set()
    problems: list[str] = []
    for position, item in enumerate(events):
        key, values = item if isinstance(item, tuple) and len(item) == 2 else (None, None)
        where = f"event {position}" + (f" (key {quoted(key)})" if isinstance(key, str) else "")
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_LENGTH:
            problems.append(f"{where}: key: expected text of 1 to {MAX_KEY_LENGTH} characters")
            continue
        if text_problem(key) is not None:
            problems.append(f"{where}: key: {text_problem(key)}")
            continue
        if not isinstance(values, Mapping):
            problems.append(f"{where}: values: expected an object of column values")
            continue
        row, found = _checked(target.table, values)
        problems += [f"{where}: {problem}" for problem in found]
        if not found and rows.setdefault(key, row) != row:
            twice.add(key)
    if problems:
        raise IngestError(problems)
    for _ in range(_RACES):
        try:
            written = run_in_transaction(
                app.engine,
                lambda conn: _write(conn, app.dialect, target.table, handler, rows, twice),
            )
        except IntegrityError:
            continue
        answer = [written[key] for key in dict.fromkeys(k for k, _ in events)]
        if any(w.result == IngestResult.CONFLICT for w in answer):
            raise IngestConflictError(answer)
        return answer
    raise IngestError(
        [f"events: keys kept being written by other producers at the same time ({_RACES} tries)"]
    )


def _write(
    conn: Connection,
    dialect: str,
    table: Table,
    handler: str,
    rows: dict[str, dict[str, Any]],
    twice: set[str],
) -> dict[str, Ingested]:
    """Write the events of keys not held yet; those held are compared, and those the batch
    gives twice with other values conflict. A conflict writes nothing: the answer says what
    would have been new."""
    known = queries.ingested_keys(conn, dialect, handler, list(rows))
    fresh = [key for key in rows if key not in known and key not in twice]
    result = _compared(conn, table, {key: rows[key] for key in known}, known)
    for key in twice:
        result[key] = Ingested(key, known.get(key), False, IngestResult.CONFLICT)
    if any(r.result == IngestResult.CONFLICT for r in result.values()):
        result.update({key: Ingested(key, None, False, IngestResult.NEW) for key in fresh})
        return result
    by_columns: dict[tuple[str, ...], list[str]] = {}
    for key in fresh:
        by_columns.setdefault(tuple(sorted(rows[key])), []).append(key)
    written: dict[str, int] = {}
    for keys in by_columns.values():
        ids = queries.insert_events_returning(conn, table, [rows[key] for key in keys])
        written.update(zip(keys, ids, strict=True))
    if written:
        queries.record_ingested(conn, handler, written)
    result.update(
        {key: Ingested(key, event_id, True, IngestResult.NEW) for key, event_id in written.items()}
    )
    return result


def _compared(
    conn: Connection, table: Table, rows: dict[str, dict[str, Any]], known: dict[str, int]
) -> dict[str, Ingested]:
    """Each held key's values against its event's, both as the database stores them; a key
    whose event has left the buffer is unchecked."""
    if not rows:
        return {}
    held = queries.events_by_id(conn, table, list(known.values()))
    present = [key for key in rows if known[key] in held]
    by_columns: dict[tuple[str, ...], list[str]] = {}
    for key in present:
        by_columns.setdefault(tuple(sorted(rows[key])), []).append(key)
    stored: dict[str, dict[str, Any]] = {}
    for keys in by_columns.values():
        stored.update(
            zip(keys, queries.as_stored(conn, table, [rows[k] for k in keys]), strict=True)
        )
    result = {}
    for key, event_id in known.items():
        if key not in stored:
            outcome = IngestResult.UNCHECKED
        elif _same(table, rows[key], stored[key], held[event_id]):
            outcome = IngestResult.SAME
        else:
            outcome = IngestResult.CONFLICT
        result[key] = Ingested(key, event_id, False, outcome)
    return result


def _same(
    table: Table, given: Mapping[str, Any], stored: Mapping[str, Any], held: Mapping[str, Any]
) -> bool:
    """Whether ``stored`` (the values given, as stored) is the event ``held``: outbox's own
    columns aside, and those the values leave to a default that differs each time (a function,
    the database's)."""
    for column in table.columns:
        name = column.name
        if name in BufferMixin.OWN_COLUMNS:
            continue
        defaulted = column.server_default is not None or (
            column.default is not None and not getattr(column.default, "is_scalar", False)
        )
        if name not in given and defaulted:
            continue
        if stored[name] != held[name]:
            return False
    return True


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
            row[name] = from_json(column, value)
        except NamedValueError as error:
            problems.append(str(error))
        except (ValueError, TypeError, OverflowError, decimal.InvalidOperation) as error:
            problems.append(f"{name}: {error}")
    for name, column in columns.items():
        needed = not column.nullable and column.default is None and column.server_default is None
        if needed and name not in BufferMixin.OWN_COLUMNS and name not in values:
            problems.append(f"{name}: a value is required")
    return row, problems
