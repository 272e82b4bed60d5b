"""Statements on ``outbox_schema``: the schema generation the database is at, and the oldest
worker generation that may work on it."""

from __future__ import annotations

from sqlalchemy import Connection, delete, select

from outbox import schema
from outbox._db.types import SchemaGeneration

_state = schema.schema_state


def schema_generation(conn: Connection) -> SchemaGeneration | None:
    """The database's schema generation; None when its row is missing. One row, by its key."""
    row = conn.execute(
        select(
            _state.c.generation,
            _state.c.workers_from,
            _state.c.migrated_at,
            _state.c.migrated_by,
        ).where(_state.c.id == 1)
    ).one_or_none()
    if row is None:
        return None
    return SchemaGeneration(row.generation, row.workers_from, row.migrated_at, row.migrated_by)


def record_schema_generation(conn: Connection, generation: int, workers_from: int) -> None:
    """Record the generation the database is now at (by this outbox's version), in place of
    whatever was recorded."""
    conn.execute(delete(_state))
    conn.execute(schema.generation_row(generation, workers_from))
