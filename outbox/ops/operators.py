"""Who an operator's write is recorded as, and its record (``outbox_operations``): what the
replays, edits and discards of :mod:`outbox.ops.groups` and :mod:`outbox.ops.archive` share."""

from __future__ import annotations

import getpass
import json
import socket
from typing import Any

from sqlalchemy import Connection

from outbox._db import queries, run_in_transaction
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.schema import OperationAction

__all__ = ["checked_actor", "default_actor", "finish", "record", "record_in"]

ACTOR_LENGTH = 200
"""The longest name an operation records (``outbox_operations.actor``)."""


def default_actor() -> str:
    """Who an operation is recorded as when not told: ``user@host`` of this process."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def checked_actor(actor: str | None) -> str:
    """``actor``, or :func:`default_actor` when None; a ConfigurationError for a name that is
    not one."""
    if actor is None:
        return default_actor()
    if not isinstance(actor, str) or not actor.strip():
        raise ConfigurationError(f"actor: expected a name, got {actor!r}")
    return actor[:ACTOR_LENGTH]


def record(
    app: Outbox,
    action: OperationAction,
    actor: str,
    selection: str | None,
    detail: str | None = None,
) -> int:
    """Record an operation as begun, its counts at 0 (``finish`` adds to them); its id.
    ``selection``: the filter it was given, as JSON."""
    return run_in_transaction(
        app.engine,
        lambda conn: queries.record_operation(
            conn,
            action=action.value,
            actor=actor,
            selection=selection,
            groups=0,
            events=0,
            detail=detail,
        ),
    )


def record_in(
    conn: Connection,
    action: OperationAction,
    actor: str | None,
    selection: dict[str, Any],
    *,
    groups: int = 0,
    detail: str | None = None,
) -> int:
    """Record an operation in the caller's transaction (``actor`` None: :func:`default_actor`),
    so that the record and the write it records commit together; its id."""
    chosen = {k: v for k, v in selection.items() if v not in (None, [], "")}
    return queries.record_operation(
        conn,
        action=action.value,
        actor=checked_actor(actor),
        selection=json.dumps(chosen, sort_keys=True, default=str),
        groups=groups,
        events=0,
        detail=detail,
    )


def finish(app: Outbox, operation_id: int, groups: int, events: int) -> None:
    """Add the groups and events a part of an operation took to its record."""
    run_in_transaction(
        app.engine, lambda conn: queries.finish_operation(conn, operation_id, groups, events)
    )
