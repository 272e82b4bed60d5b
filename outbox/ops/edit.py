"""Editing a dead or discarded event: replaying it with some of its values changed, recorded as
an edit.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, Connection, Dialect, Table
from sqlalchemy.exc import DataError

from outbox import schema
from outbox._core import log as _log
from outbox._core.values import NamedValueError, archived_payload, from_text
from outbox._db import dialects, queries, run_in_transaction
from outbox.app import Outbox
from outbox.buffer import BufferMixin
from outbox.exceptions import ConfigurationError, GroupNotFoundError, ReplayError
from outbox.handler import MAX_BATCH_SIZE
from outbox.ops.operators import checked_actor
from outbox.ops.replay import handler_table, put_back

log = _log.get_logger(__name__)

# The statuses an edit takes: events that were never delivered, dead or refused for good (a
# poison value a downstream rejected per record is archived as discarded).
EDITABLE = (schema.ArchiveStatus.DEAD.value, schema.ArchiveStatus.DISCARDED.value)


@dataclass(frozen=True, slots=True)
class EditResult:
    """What a replay with edit did: the dead (or discarded) event it took and the event it
    became."""

    handler: str
    group_id: uuid.UUID
    event_id: int
    """The archived event's id."""
    new_event_id: int
    """The id of the event put back into the buffer: its own (``event_id``), as every replay
    keeps it."""
    changed: tuple[str, ...]
    """The columns changed."""
    operation_id: int


def edit(
    app: Outbox,
    group_id: uuid.UUID,
    event_id: int,
    changes: Mapping[str, Any],
    *,
    actor: str | None = None,
) -> EditResult:
    """Replay one dead or discarded event with some of its values changed: the buffer
    model's columns named in ``changes`` take the new values, the others keep the archived
    ones, and the event goes back into its buffer under its own id (the same event for sinks
    and consumers, fixed; an id another row holds now is a
    :class:`~outbox.exceptions.ReplayError`, and nothing is written). Its archive row stays,
    marked ``replayed`` and pointing at the event; the operation is
    recorded as an edit by ``actor`` with the columns changed (not their values, which may be
    personal data).

    A value may be given as the column's Python type or as text, parsed for the column's type
    (``true``/``false``, numbers, ISO times, UUIDs, JSON for a JSON column, base64 for bytes:
    the encodings of :mod:`outbox._core.values`).
    Each name must be a column of the buffer other than outbox's own (``id``, ``group_id``,
    ``created_at``), and each value must be what the column takes: anything else is a
    :class:`~outbox.exceptions.ConfigurationError` naming it, and nothing is written.

    An ordered handler's dead group keeps holding its keys while other events of it are dead:
    the edited event is handled once they are replayed or discarded too.
    """
    if not isinstance(group_id, uuid.UUID):
        raise ConfigurationError(f"group_id: expected a UUID, got {type(group_id).__name__}")
    if isinstance(event_id, bool) or not isinstance(event_id, int):
        raise ConfigurationError(f"event_id: expected an integer, got {type(event_id).__name__}")
    if not isinstance(changes, Mapping) or not changes:
        raise ConfigurationError("changes: expected a mapping of column names to new values")
    with app.engine.connect() as conn:
        rows = queries.select_archived(
            conn,
            handler=None,
            statuses=EDITABLE,
            group_id=group_id,
            after_id=0,
            limit=MAX_BATCH_SIZE,
        )
    row = next((r for r in rows if int(r["event_id"]) == event_id), None)
    if row is None and not rows and not _archived_at_all(app, group_id):
        raise GroupNotFoundError(group_id)
    if row is None:
        raise ConfigurationError(
            f"no dead or discarded event {event_id} in group {group_id}: `outbox show "
            f"{group_id}` lists its events"
        )
    table = handler_table(app, row["handler"])
    payload = archived_payload(row["payload"])
    edited = _edited_values(table, changes, app.engine.dialect)
    actor = checked_actor(actor)
    changed = tuple(sorted(edited))
    detail = f"event {event_id} of group {group_id}: {', '.join(changed)} changed"

    def work(conn: Connection) -> tuple[int, int]:
        operation_id = queries.record_operation(
            conn,
            action=schema.OperationAction.EDIT.value,
            actor=actor,
            selection=json.dumps({"group_ids": [str(group_id)], "event_id": event_id}),
            groups=1,
            events=1,
            detail=detail,
        )
        # An ordered handler's group holds its keys while any event of it is dead.
        dead = schema.ArchiveStatus.DEAD
        remaining = sum(1 for r in rows if r["id"] != row["id"] and r["status"] == dead)
        put, left = put_back(
            conn,
            app,
            [{**row, "payload": payload}],
            operation_id,
            edited=edited,
            release_keys=remaining == 0,
        )
        if left:
            raise ReplayError(f"{left[int(row['id'])]} (group {group_id}); nothing written")
        return operation_id, put[int(row["id"])]

    try:
        operation_id, new_id = run_in_transaction(app.engine, work)
    except DataError as error:
        # A value of the column's type that the column cannot hold (too long, out of range):
        # refused as a value of the wrong type is, and nothing written.
        raise ConfigurationError(
            f"{', '.join(changed)}: the database refused the new value "
            f"({dialects.error_summary(error)})"
        ) from error
    log.info(
        _log.ARCHIVE_EDITED,
        handler=row["handler"],
        group=str(group_id),
        event_id=event_id,
        new_event_id=new_id,
        columns=list(changed),
        actor=actor,
        operation=operation_id,
    )
    return EditResult(row["handler"], group_id, event_id, new_id, changed, operation_id)


def _archived_at_all(app: Outbox, group_id: uuid.UUID) -> bool:
    with app.engine.connect() as conn:
        return bool(queries.archived_of_group(conn, group_id))


def _edited_values(table: Table, changes: Mapping[str, Any], dialect: Dialect) -> dict[str, Any]:
    """The stored values of the changed columns, each checked against its column."""
    columns = {column.name: column for column in table.columns}
    values = {}
    for name, value in changes.items():
        column = columns.get(name) if isinstance(name, str) else None
        if column is None or name in BufferMixin.OWN_COLUMNS:
            mine = sorted(n for n in columns if n not in BufferMixin.OWN_COLUMNS)
            why = "is outbox's own column" if column is not None else "is not a column"
            raise ConfigurationError(
                f"{name!r} {why} of buffer {table.name}; its columns: {', '.join(mine)}"
            )
        values[name] = _edited_value(column, value, dialect)
    return values


def _edited_value(column: Column[Any], value: Any, dialect: Dialect) -> Any:
    """A value an operator gave for ``column``, as the database stores it."""
    if value is None and not column.nullable:
        raise ConfigurationError(f"{column.name}: NULL is not allowed (the column is NOT NULL)")
    try:
        return from_text(column, value, dialect)
    except NamedValueError as error:
        raise ConfigurationError(str(error)) from error
    except (ValueError, TypeError) as error:
        raise ConfigurationError(f"{column.name}: {error}") from error
