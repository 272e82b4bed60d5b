"""How an event becomes a sink's message: its values (read from the event, or from its row,
which spares building the event), its id, its key and its JSON body.

The default message of an event is its id (:func:`message_id`: the same on every attempt), its
key (the handler's ordering key as text: :func:`ordering_key`) and its payload (its columns as
a JSON object: :func:`json_payload`). :class:`RowPath` reads the same message from a batch's
rows. What JSON has no type for (times, UUIDs, decimals, bytes, enums) is written by
:func:`json_default`, the one place a sink converts a column's value: the value codec
(:mod:`outbox._core.values`) that every face of outbox writes and reads values with.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm.exc import UnmappedColumnError

from outbox._core.values import to_json
from outbox.batch import Batch
from outbox.handler import Handler

# Columns that are outbox's bookkeeping, not the event's: a message does not carry them.
_BOOKKEEPING = frozenset({"group_id"})


def event_values(event: Any) -> dict[str, Any]:
    """An event's columns, by attribute name, but ``group_id`` (which changes between
    attempts, so that the same event would not be the same message)."""
    return {key: getattr(event, key) for key in _value_keys(type(event))}


# Read once per model: inspecting the mapper for each event of a group of 1,000 cost as much
# as encoding it. (Computed twice by two threads at worst, to the same value.)
_VALUE_KEYS: dict[type[Any], tuple[str, ...]] = {}
_ROW_READERS: dict[type[Any], Callable[[Sequence[Any]], dict[str, Any]] | None] = {}


def _value_keys(model: type[Any]) -> tuple[str, ...]:
    keys = _VALUE_KEYS.get(model)
    if keys is None:
        mapper = sa_inspect(model)
        keys = tuple(a.key for a in mapper.column_attrs if a.key not in _BOOKKEEPING)
        _VALUE_KEYS[model] = keys
    return keys


def row_values(model: type[Any]) -> Callable[[Sequence[Any]], dict[str, Any]] | None:
    """What :func:`event_values` reads from an event, read from its row instead (a batch's
    ``rows``: every column of the model's table, in table order), which spares building the
    event; None when a value of the model is not a column of its table."""
    if model not in _ROW_READERS:
        _ROW_READERS[model] = _row_reader(model)
    return _ROW_READERS[model]


def _row_reader(model: type[Any]) -> Callable[[Sequence[Any]], dict[str, Any]] | None:
    mapper = sa_inspect(model)
    position: dict[str, int] = {}
    for index, column in enumerate(mapper.local_table.columns):
        try:
            position[mapper.get_property_by_column(column).key] = index
        except UnmappedColumnError:
            continue
    keys = _value_keys(model)
    if not all(key in position for key in keys):
        return None
    pairs = tuple((key, position[key]) for key in keys)

    def read(row: Sequence[Any]) -> dict[str, Any]:
        return {key: row[index] for key, index in pairs}

    return read


def ordering_key(handler: Handler[Any]) -> Callable[[Any], str | None] | None:
    """Reads the value of ``handler``'s ``ordering_key`` column from an event, as text (the
    message key a sink gives each message by default, so that a consumer can keep per-key
    order too); None when the handler has no ordering key."""
    if handler.ordering_key is None:
        return None
    column = handler.table.c[handler.ordering_key]
    attribute = sa_inspect(handler.model).get_property_by_column(column).key

    def read(event: Any) -> str | None:
        value = getattr(event, attribute)
        return None if value is None else str(value)

    return read


Message: TypeAlias = tuple[str, str | None, bytes]
"""A default message: its id (:func:`message_id`), its key (the ordering key's value as text,
or None) and its payload (:func:`json_payload`)."""


@dataclass(frozen=True, slots=True)
class RowPath:
    """How the default message of an event is read from its row (a batch's ``rows``), which
    spares building the event: about 40% of the CPU a group's messages cost."""

    table: str
    values: Callable[[Sequence[Any]], dict[str, Any]]
    id_at: int
    key_at: int | None

    def fields(self, row: Sequence[Any]) -> tuple[str, str | None, bytes]:
        """The message id (as :func:`message_id` writes it), the key (as
        :func:`ordering_key` reads it) and the payload (as :func:`json_payload` writes it) of
        a row."""
        key = None if self.key_at is None else row[self.key_at]
        return (
            f"{self.table}-{row[self.id_at]}",
            None if key is None else str(key),
            payload_bytes(self.values(row)),
        )

    def messages(self, batch: Batch[Any]) -> list[Message] | None:
        """:meth:`fields` of each row of ``batch``, in its order (the ``i``-th message is
        ``batch.events[i]``'s); None for a batch made of events rather than rows (read those
        from the events)."""
        rows = batch.rows
        if not rows or not hasattr(rows[0], "_fields"):
            return None
        return [self.fields(row) for row in rows]


def row_path(handler: Handler[Any]) -> RowPath | None:
    """How ``handler``'s events' default messages (:func:`json_payload`, :func:`message_id`,
    the :func:`ordering_key` as key) are read from their rows; None when a value of its model
    is not a column of its table. A sink takes it only where its options are the defaults: a
    function of the user's is given the event (:func:`row_messages` checks them)."""
    read = row_values(handler.model)
    if read is None:
        return None
    columns = list(handler.table.columns)
    key = None if handler.ordering_key is None else handler.table.c[handler.ordering_key]
    return RowPath(
        table=handler.table.name,
        values=read,
        id_at=columns.index(handler.table.c.id),
        key_at=None if key is None else columns.index(key),
    )


json_default: Callable[[Any], Any] = to_json
"""How the default payload writes what JSON has no type for: the value codec's own
(:func:`outbox._core.values.to_json`: times in ISO 8601, UUIDs and decimals as text, a decimal
keeping its digits, bytes in base64, enums by value), so that a sink's body writes a column's
value as the API answers it and ingest reads it back. Its common types are looked up by their
exact class first, which keeps the cost of a payload's times and amounts low."""


# One encoder for every payload: json.dumps with options builds a new one per call.
_JSON = json.JSONEncoder(default=json_default, separators=(",", ":"))


def json_payload(event: Any) -> bytes:
    """The default message body: the event's columns (:func:`event_values`) as a JSON
    object, UTF-8."""
    return _JSON.encode(event_values(event)).encode()


def message_id(event: Any) -> str:
    """The default message id: the buffer table's name and the event's id (``orders-42``),
    the same on every attempt, so that a consumer (or a broker's window) drops a repeat."""
    return f"{type(event).__table__.name}-{event.id}"


def payload_bytes(value: bytes | str | Any) -> bytes:
    """A payload function's result as bytes: bytes as they are, text in UTF-8, anything else
    as JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return _JSON.encode(value).encode()


_DEFAULT_MESSAGE_ID = message_id


def row_messages(
    handler: Handler[Any],
    *,
    payload: Callable[[Any], Any],
    message_id: Callable[[Any], str],
    key: Callable[[Any], str | None] | None,
) -> RowPath | None:
    """How a sink reads the default messages of ``handler``'s groups from their rows, given
    the sink's options; None when it cannot: a ``payload`` or ``message_id`` other than the
    defaults, or a ``key`` given (a function of the user's is given the event), or a model
    with a value that is not a column of its table (see :func:`row_path`). ``key`` None
    means the handler's ordering key (or no key)."""
    if payload is not json_payload or message_id is not _DEFAULT_MESSAGE_ID or key is not None:
        return None
    return row_path(handler)
