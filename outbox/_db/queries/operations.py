"""Statements on ``outbox_operations``: the record of what operators did."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert, select, update

from outbox import schema
from outbox._db.types import OperationRow

_operations = schema.operations


def record_operation(
    conn: Connection,
    *,
    action: str,
    actor: str,
    selection: str | None,
    groups: int,
    events: int,
    detail: str | None,
) -> int:
    """Record what an operator did; the record's id."""
    result = conn.execute(
        insert(_operations).values(
            action=action,
            actor=actor,
            selection=selection,
            groups=groups,
            events=events,
            detail=detail,
        )
    )
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def finish_operation(conn: Connection, operation_id: int, groups: int, events: int) -> None:
    """Set the counts of a recorded operation once it is done."""
    conn.execute(
        update(_operations)
        .where(_operations.c.id == operation_id)
        .values(groups=_operations.c.groups + groups, events=_operations.c.events + events)
    )


def last_operation(conn: Connection, *, action: str, selection: str) -> OperationRow | None:
    """The newest operation recorded with ``action`` and exactly ``selection`` (its JSON text,
    as it was recorded), or None: whether an operation that must not be done twice was done
    (a fan-out consumer's backfill). No index serves the selection: the table holds what
    operators did, and this is asked once per command, not on a worker's path."""
    stmt = (
        select(*_row_columns())
        .where(_operations.c.action == action, _operations.c.selection == selection)
        .order_by(_operations.c.id.desc())
        .limit(1)
    )
    found = conn.execute(stmt).first()
    return None if found is None else _row(found)


def operations(
    conn: Connection, *, action: str | None = None, limit: int, before_id: int | None = None
) -> list[OperationRow]:
    """Operations recorded, newest first (before ``before_id``: the next page)."""
    stmt = select(*_row_columns())
    if action is not None:
        stmt = stmt.where(_operations.c.action == action)
    if before_id is not None:
        stmt = stmt.where(_operations.c.id < before_id)
    rows = conn.execute(stmt.order_by(_operations.c.id.desc()).limit(limit))
    return [_row(r) for r in rows]


def _row_columns() -> tuple[Any, ...]:
    return (
        _operations.c.id,
        _operations.c.action,
        _operations.c.actor,
        _operations.c.selection,
        _operations.c.groups,
        _operations.c.events,
        _operations.c.detail,
        _operations.c.done_at,
    )


def _row(r: Any) -> OperationRow:
    return OperationRow(
        int(r.id), r.action, r.actor, r.selection, int(r.groups), int(r.events), r.detail, r.done_at
    )
