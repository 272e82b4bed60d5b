"""Ordering keys held back by dead groups: listed, and released.

A handler with an ``ordering_key`` handles each key's events in id order. When one of its
groups is dead-lettered, the keys of its dead events are *held*: their later events wait in
the buffer rather than overtake them, while other keys flow. ``outbox replay`` of the dead
group puts its events back where they were in the order (their ids kept) and releases its
keys; :func:`release` lets the later events go without them (the dead events stay archived).
"""

from __future__ import annotations

import uuid

from sqlalchemy import Connection

from outbox import operators
from outbox._db import queries, run_in_transaction
from outbox._db.queries import HeldKey
from outbox.app import Outbox
from outbox.schema import OperationAction

__all__ = ["HeldKey", "keys", "release"]


def keys(app: Outbox, handler: str | None = None) -> list[HeldKey]:
    """The held keys (of one handler), oldest first, each with its dead group and error."""
    if handler is not None:
        app.get_handler(handler)
    with app.engine.connect() as conn:
        return queries.held_keys(conn, handler)


def release(
    app: Outbox,
    handler: str | None = None,
    key: str | None = None,
    group_id: uuid.UUID | None = None,
    *,
    actor: str | None = None,
) -> int:
    """Release held keys (all, one handler's, one key as text, or one group's): their later
    events are handled again. Returns how many keys were released. Recorded as an operation
    by ``actor`` (default: ``user@host``; ``outbox history``)."""
    if handler is not None:
        app.get_handler(handler)

    def work(conn: Connection) -> int:
        released = queries.release_held_keys(conn, handler, key, group_id)
        selection = {
            "handlers": [handler] if handler else [],
            "key": key,
            "group_ids": [group_id] if group_id else [],
        }
        detail = f"{released} held key{'s' * (released != 1)} released"
        operators.record_in(conn, OperationAction.RELEASE, actor, selection, detail=detail)
        return released

    return run_in_transaction(app.engine, work)
