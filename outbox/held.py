"""Ordering keys held back by dead groups: listed, and released.

A handler with an ``ordering_key`` handles each key's events in id order. When one of its
groups is dead-lettered, the keys of its dead events are *held*: their later events wait in
the buffer rather than overtake them, while other keys flow. ``outbox replay`` of the dead
group puts its events back where they were in the order (their ids kept) and releases its
keys; :func:`release` lets the later events go without them (the dead events stay archived).
"""

from __future__ import annotations

import uuid

from outbox._db import queries, run_in_transaction
from outbox._db.queries import HeldKey
from outbox.app import Outbox

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
) -> int:
    """Release held keys (all, one handler's, one key as text, or one group's): their later
    events are handled again. Returns how many keys were released."""
    if handler is not None:
        app.get_handler(handler)
    return run_in_transaction(
        app.engine, lambda conn: queries.release_held_keys(conn, handler, key, group_id)
    )
