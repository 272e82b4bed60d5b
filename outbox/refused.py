"""Groups whose finishing write the database refused: listed, and released once the cause is
fixed.

A group is *refused* when the database will not take the write that records its outcome, for
a reason that does not go away by trying again: a value the archive refuses, a constraint or a
trigger of the application's, a statement the database cannot run. Retried, the write would
fail again; a group whose handler succeeded would be delivered again and again, a group out of
attempts attempted past its last one. So the group is held instead: its rows stay in the
buffer, its batch job stays with the error, no worker runs it, and ``outbox status``, ``outbox
check`` and the metrics show it. Once the cause is fixed, :func:`release` gives the groups back
to the workers: each is handled again (at least once: handlers are idempotent by contract).
"""

from __future__ import annotations

import uuid

from sqlalchemy import Connection

from outbox import operators
from outbox._db import queries, run_in_transaction
from outbox._db.queries import RefusedGroup
from outbox.app import Outbox
from outbox.schema import OperationAction

__all__ = ["RefusedGroup", "groups", "release"]


def groups(app: Outbox, handler: str | None = None) -> list[RefusedGroup]:
    """The refused groups (of one handler), oldest first, each with the database's error."""
    if handler is not None:
        app.get_handler(handler)
    with app.engine.connect() as conn:
        return queries.refused_groups(conn, handler)


def release(
    app: Outbox,
    handler: str | None = None,
    group_id: uuid.UUID | None = None,
    *,
    actor: str | None = None,
) -> int:
    """Give refused groups (all, one handler's, or one group) back to the workers, to be
    handled again now; returns how many. Their attempts stay counted. Recorded as an
    operation by ``actor`` (default: ``user@host``; ``outbox history``)."""
    if handler is not None:
        app.get_handler(handler)

    def work(conn: Connection) -> int:
        released = queries.release_refused_jobs(conn, handler, group_id)
        selection = {
            "handlers": [handler] if handler else [],
            "group_ids": [group_id] if group_id else [],
        }
        detail = f"{released} refused group{'s' * (released != 1)} released"
        operators.record_in(
            conn, OperationAction.RELEASE, actor, selection, groups=released, detail=detail
        )
        return released

    return run_in_transaction(app.engine, work)
