"""Who an operator's write is recorded as, and its record (``outbox_operations``): what the
replays, edits, retries and discards of :mod:`outbox.ops.group_operations`,
:mod:`outbox.ops.replay` and :mod:`outbox.ops.edit` share; and the log of them
(:func:`history`)."""

from __future__ import annotations

import datetime as dt
import getpass
import json
import socket
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from outbox import schema
from outbox._db import queries, run_in_transaction
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.schema import OperationAction

__all__ = [
    "Operation",
    "checked_actor",
    "default_actor",
    "finish",
    "history",
    "record",
    "record_in",
]

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


@dataclass(frozen=True, slots=True)
class Operation:
    """An operator's replay, edit or discard, as recorded: who, when, which filter, how many."""

    id: int
    action: schema.OperationAction
    actor: str
    selection: dict[str, Any]
    """The filter it was given."""
    groups: int
    events: int
    detail: str | None
    done_at: dt.datetime


def history(
    app: Outbox, *, action: str | None = None, limit: int = 50, before_id: int | None = None
) -> list[Operation]:
    """The replays, edits and discards operators made, newest first: ``limit`` of them, of one
    ``action`` (:class:`~outbox.schema.OperationAction`) or all, before the operation
    ``before_id`` (the next page)."""
    if action is not None:
        known = {a.value for a in schema.OperationAction}
        if action not in known:
            raise ConfigurationError(
                f"action: {action!r} is not an operation; expected one of {', '.join(known)}"
            )
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ConfigurationError(f"limit: expected 1 to 1000 operations, got {limit!r}")
    if before_id is not None and (
        isinstance(before_id, bool) or not isinstance(before_id, int) or not 0 <= before_id < 2**63
    ):
        raise ConfigurationError(f"before_id: expected an operation's id, got {before_id!r}")
    with app.engine.connect() as conn:
        rows = queries.operations(conn, action=action, limit=limit, before_id=before_id)
    return [
        Operation(
            r.id,
            schema.OperationAction(r.action),
            r.actor,
            json.loads(r.selection) if r.selection else {},
            r.groups,
            r.events,
            r.detail,
            r.done_at,
        )
        for r in rows
    ]
