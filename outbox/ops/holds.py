"""What is held back until an operator lets it go: ordering keys held by dead groups, and
groups whose finishing write the database refused. Each is listed, and released.

*Held keys.* A handler with an ``ordering_key`` handles each key's events in id order. When one
of its groups is dead-lettered, the keys of its dead events are held: their later events wait
in the buffer rather than overtake them, while other keys flow. ``outbox replay`` of the dead
group puts its events back where they were in the order (their ids kept) and releases its
keys; :func:`release_keys` lets the later events go without them (the dead events stay
archived).

*Refused groups.* A group is refused when the database will not take the write that records
its outcome, for a reason that does not go away by trying again: a value the archive refuses,
a constraint or a trigger of the application's, a statement the database cannot run. Retried,
the write would fail again; a group whose handler succeeded would be delivered again and
again, a group out of attempts attempted past its last one. So the group is held instead: its
rows stay in the buffer, its batch job stays with the error, no worker runs it, and ``outbox
status``, ``outbox check`` and the metrics show it. Once the cause is fixed,
:func:`release_refused` gives the groups back to the workers: each is handled again (at least
once: handlers are idempotent by contract).

Each release is recorded as an operation by its ``actor`` (default: ``user@host``; ``outbox
history``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from sqlalchemy import Connection

from outbox._db import queries, run_in_transaction
from outbox._db.queries import HeldKey, RefusedGroup
from outbox.app import Outbox
from outbox.ops import operators
from outbox.schema import OperationAction

__all__ = [
    "HeldKey",
    "RefusedGroup",
    "held_keys",
    "refused_groups",
    "release_keys",
    "release_refused",
]


def held_keys(app: Outbox, handler: str | None = None) -> list[HeldKey]:
    """The held keys (of one handler), oldest first, each with its dead group and error."""
    if handler is not None:
        app.get_handler(handler)
    with app.engine.connect() as conn:
        return queries.held_keys(conn, handler)


def refused_groups(app: Outbox, handler: str | None = None) -> list[RefusedGroup]:
    """The refused groups (of one handler), oldest first, each with the database's error."""
    if handler is not None:
        app.get_handler(handler)
    with app.engine.connect() as conn:
        return queries.refused_groups(conn, handler)


def release_keys(
    app: Outbox,
    handler: str | None = None,
    key: str | None = None,
    group_id: uuid.UUID | None = None,
    *,
    actor: str | None = None,
) -> int:
    """Release held keys (all, one handler's, one key as text, or one group's): their later
    events are handled again. Returns how many keys were released."""

    def work(conn: Connection) -> int:
        released = queries.release_held_keys(conn, handler, key, group_id)
        detail = f"{released} held key{'s' * (released != 1)} released"
        selection = {
            "handlers": [handler] if handler else [],
            "key": key,
            "group_ids": [group_id] if group_id else [],
        }
        operators.record_in(conn, OperationAction.RELEASE, actor, selection, detail=detail)
        return released

    return _release(app, handler, work)


def release_refused(
    app: Outbox,
    handler: str | None = None,
    group_id: uuid.UUID | None = None,
    *,
    actor: str | None = None,
) -> int:
    """Give refused groups (all, one handler's, or one group) back to the workers, to be
    handled again now; returns how many. Their attempts stay counted."""

    def work(conn: Connection) -> int:
        released = queries.release_refused_jobs(conn, handler, group_id)
        detail = f"{released} refused group{'s' * (released != 1)} released"
        operators.record_in(
            conn,
            OperationAction.RELEASE,
            actor,
            {"handlers": [handler] if handler else [], "group_ids": [group_id] if group_id else []},
            groups=released,
            detail=detail,
        )
        return released

    return _release(app, handler, work)


def _release(app: Outbox, handler: str | None, work: Callable[[Connection], int]) -> int:
    """``work`` in one transaction, once ``handler`` (when named) is known to be registered."""
    if handler is not None:
        app.get_handler(handler)
    return run_in_transaction(app.engine, work)
