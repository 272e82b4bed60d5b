"""Statements the console's search asks: where an event id, a group id, an ordering key or an
ingest key is. Each is served by an index or reads a bounded number of rows, so that a search
of a buffer of ten million events costs a few index probes."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from typing import Any

from sqlalchemy import Connection, Table, func, select

from outbox import schema

_archive = schema.archive
_held = schema.held_keys
_ingest = schema.ingest_keys


def buffer_event(conn: Connection, table: Table, event_id: int) -> list[uuid.UUID | None]:
    """The group of a buffer's event (None: in no group yet), or nothing when the buffer has
    no such event; served by the primary key."""
    return list(conn.execute(select(table.c.group_id).where(table.c.id == event_id)).scalars())


def archived_events(
    conn: Connection,
    event_id: int,
    *,
    handler: str | None = None,
    scan: int,
    limit: int,
) -> list[dict[str, Any]]:
    """Archive rows of an event id (of one handler, or any), newest first, looked for among
    the newest ``scan`` rows only: the archive has no index on ``event_id``, and the primary
    key's range bounds the read."""
    newest = conn.execute(select(func.max(_archive.c.id))).scalar_one_or_none() or 0
    stmt = select(
        _archive.c.id,
        _archive.c.handler,
        _archive.c.event_id,
        _archive.c.group_id,
        _archive.c.status,
    ).where(_archive.c.id > int(newest) - scan, _archive.c.event_id == event_id)
    if handler is not None:
        stmt = stmt.where(_archive.c.handler == handler)
    rows = conn.execute(stmt.order_by(_archive.c.id.desc()).limit(limit))
    return [dict(row._mapping) for row in rows]


def ingested_event(conn: Connection, handlers: Collection[str], key: str) -> list[tuple[str, int]]:
    """(handler, event id) of the events producers wrote under the idempotency key ``key``,
    one per handler at most; served by the primary key (``handler, key``), a probe per
    handler."""
    rows = conn.execute(
        select(_ingest.c.handler, _ingest.c.event_id)
        .where(_ingest.c.handler.in_(sorted(handlers)), _ingest.c.key == key)
        .order_by(_ingest.c.handler)
    )
    return [(handler, int(event_id)) for handler, event_id in rows]


def held_key_group(conn: Connection, handler: str, key: str) -> uuid.UUID | None:
    """The dead group that holds a handler's ordering key, if one does; served by the primary
    key."""
    return conn.execute(
        select(_held.c.group_id).where(_held.c.handler == handler, _held.c.key == key)
    ).scalar_one_or_none()


def count_unclaimed_with_key(
    conn: Connection, table: Table, key_name: str, value: Any, cap: int
) -> int:
    """Events of a key not yet in a group, up to ``cap``: for a key column with an index of
    its own (the caller checks), which serves the pick; ``value`` is of the column's type."""
    picked = (
        select(table.c.id)
        .where(table.c[key_name] == value, table.c.group_id.is_(None))
        .limit(cap)
        .subquery()
    )
    return int(conn.execute(select(func.count()).select_from(picked)).scalar_one())
