"""Statements on ``outbox_held_keys``: ordering keys a dead group holds back, and the
condition that keeps an ordered handler's claims in order."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    String,
    Table,
    and_,
    delete,
    exists,
    func,
    literal,
    select,
    update,
)
from sqlalchemy import cast as sql_cast

from outbox import schema
from outbox._db import dialects
from outbox._db.types import HeldKey

_held = schema.held_keys
KEY_TEXT_LIMIT = 400


def key_text(column: ColumnElement[Any]) -> ColumnElement[str]:
    """A key's value as the text ``outbox_held_keys`` keeps it."""
    return sql_cast(column, String(KEY_TEXT_LIMIT))


def in_order(table: Table, key_name: str, handler: str) -> ColumnElement[bool]:
    """A row of an ordered handler may be claimed: no row of its key is in a group (claimed,
    running, retrying, refused) and no dead group holds its key. Rows of one key are then
    claimed oldest first, a group of the key at a time (the claims of an ordered handler are
    serialized: :func:`outbox._db.queries.lock_handler_state`, but for a buffer that holds one
    row per key, a flag handler's: ``Handler.claims_take_turns``)."""
    key = table.c[key_name]
    other = table.alias("outbox_same_key")
    in_a_group = exists(
        select(other.c.id).where(other.c[key_name] == key, other.c.group_id.is_not(None))
    )
    held = exists(
        select(_held.c.key).where(_held.c.handler == handler, _held.c.key == key_text(key))
    )
    return and_(~in_a_group, ~held)


def give_back_keys_past_skipped_rows(
    conn: Connection, table: Table, key_name: str, group_id: uuid.UUID
) -> set[Any]:
    """Give back (unclaim) the rows of the just-claimed group ``group_id`` of each key that
    still has an older unclaimed row: a claim's ``SKIP LOCKED`` passed over that row, locked
    by another statement (MariaDB locks the rows a scan reads, not only those it changes; an
    update of a waiting event locks it on every database), and the key's later rows must not
    be handed over before it. Returns those keys (their rows wait for a later claim)."""
    key = table.c[key_name]
    older = table.alias("outbox_older")
    skipped = exists(
        select(older.c.id).where(
            older.c[key_name] == key, older.c.group_id.is_(None), older.c.id < table.c.id
        )
    )
    keys = set(
        conn.execute(
            select(key).where(table.c.group_id == group_id, key.is_not(None), skipped).distinct()
        ).scalars()
    )
    if keys:
        conn.execute(
            update(table)
            .where(table.c.group_id == group_id, key.in_(sorted(keys)))
            .values(group_id=None)
        )
    return keys


def group_keys(
    conn: Connection, table: Table, key_name: str, group_id: uuid.UUID, ids: Iterable[int] | None
) -> list[str]:
    """The distinct keys (as text) of a group's rows (only ``ids``, when given)."""
    stmt = select(key_text(table.c[key_name])).where(
        table.c.group_id == group_id, table.c[key_name].is_not(None)
    )
    if ids is not None:
        stmt = stmt.where(table.c.id.in_(list(ids)))
    return sorted(set(conn.execute(stmt.distinct()).scalars()))


def hold_keys(
    conn: Connection,
    dialect: str,
    handler: str,
    keys: Iterable[str],
    group_id: uuid.UUID,
    error: str | None,
) -> int:
    """Hold ``keys`` of a handler for the dead group ``group_id``; a key held already stays
    held by its first group. Returns how many keys were newly held."""
    rows = [{"handler": handler, "key": key, "group_id": group_id, "error": error} for key in keys]
    if not rows:
        return 0
    return dialects.statements(dialect).insert_ignoring_duplicates(conn, _held, rows)


def held_keys(conn: Connection, handler: str | None = None) -> list[HeldKey]:
    """The held keys (of one handler), oldest first."""
    stmt = select(_held.c.handler, _held.c.key, _held.c.group_id, _held.c.error)
    if handler is not None:
        stmt = stmt.where(_held.c.handler == handler)
    return [HeldKey(*row) for row in conn.execute(stmt.order_by(_held.c.held_at, _held.c.key))]


def count_held_keys(conn: Connection, handler: str, cap: int | None) -> int:
    """The keys dead groups of ``handler`` hold, counted no further than ``cap`` (None: all);
    a range of the primary key (handler, key)."""
    mine = select(literal(1)).where(_held.c.handler == handler)
    if cap is None:
        return int(conn.execute(select(func.count()).select_from(mine.subquery())).scalar_one())
    # ORDER BY keeps the planner on the primary key; the LIMIT inside stops the walk at the cap.
    capped = mine.order_by(_held.c.key).limit(cap).subquery()
    return int(conn.execute(select(func.count()).select_from(capped)).scalar_one())


def release_held_keys(
    conn: Connection,
    handler: str | None = None,
    key: str | None = None,
    group_id: uuid.UUID | None = None,
) -> int:
    """Release held keys (all, one handler's, one key, or those of one group); how many."""
    stmt = delete(_held)
    if handler is not None:
        stmt = stmt.where(_held.c.handler == handler)
    if key is not None:
        stmt = stmt.where(_held.c.key == key)
    if group_id is not None:
        stmt = stmt.where(_held.c.group_id == group_id)
    return conn.execute(stmt).rowcount
