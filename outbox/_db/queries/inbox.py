"""Statements on ``outbox_inbox``: the message ids each inbox had an effect for."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, func, select, tuple_

from outbox import schema
from outbox._db import dialects
from outbox._db.dialects.clock import db_now_plus

_inbox = schema.inbox
INSERT_CHUNK = 500
"""Ids recorded by one statement: a few thousand bound values, within every database's limit."""


@dataclass(frozen=True, slots=True)
class InboxKept:
    """What an inbox keeps: its ids, and when the oldest and the newest were received."""

    inbox: str
    ids: int
    oldest: dt.datetime | None
    newest: dt.datetime | None
    next_expiry: dt.datetime | None


def _bytes_kept(dialect: str) -> bool:
    # MariaDB keeps the ids as bytes, compared exactly (schema.inbox).
    return dialect == "mysql"


def record_inbox_ids(
    conn: Connection, dialect: str, inbox: str, message_ids: Sequence[str], horizon: float
) -> set[str]:
    """Record ``message_ids`` in ``inbox``, kept ``horizon`` seconds; the ids it did not hold,
    which this transaction now holds. An id another transaction is recording waits for that
    transaction's end: taken when it commits, recorded here when it rolls back. Ids are written
    in their order, so that two transactions recording some of the same ids wait for each
    other rather than each holding what the other needs."""
    as_bytes = _bytes_kept(dialect)
    statements = dialects.statements(dialect)
    ordered = sorted(set(message_ids))
    new: set[str] = set()
    for start in range(0, len(ordered), INSERT_CHUNK):
        rows = [
            {
                "inbox": inbox,
                "message_id": m.encode() if as_bytes else m,
                "expires_at": db_now_plus(horizon),
            }
            for m in ordered[start : start + INSERT_CHUNK]
        ]
        inserted = statements.insert_new(conn, _inbox, rows, _inbox.c.message_id)
        new.update(m.decode() if isinstance(m, bytes) else m for m in inserted)
    return new


def delete_expired_inbox_ids(conn: Connection, limit: int) -> int:
    """Delete up to ``limit`` inbox ids past their ``expires_at``, oldest first (served by its
    index); how many."""
    picked = conn.execute(
        select(_inbox.c.inbox, _inbox.c.message_id)
        .where(_inbox.c.expires_at < db_now_plus(0))
        .order_by(_inbox.c.expires_at)
        .limit(limit)
    ).all()
    if not picked:
        return 0
    keys = tuple_(_inbox.c.inbox, _inbox.c.message_id).in_([tuple(k) for k in picked])
    return conn.execute(_inbox.delete().where(keys)).rowcount


def inboxes_kept(conn: Connection) -> list[InboxKept]:
    """Each inbox that keeps ids, by name: how many, the oldest, the newest, and when the next
    expires."""
    rows = conn.execute(
        select(
            _inbox.c.inbox,
            func.count(),
            func.min(_inbox.c.received_at),
            func.max(_inbox.c.received_at),
            func.min(_inbox.c.expires_at),
        )
        .group_by(_inbox.c.inbox)
        .order_by(_inbox.c.inbox)
    )
    return [
        InboxKept(name, int(n), oldest, newest, expiry) for name, n, oldest, newest, expiry in rows
    ]


def inbox_holds(conn: Connection, dialect: str, inbox: str, message_id: str) -> bool:
    """Whether ``inbox`` holds ``message_id`` (committed, or written by this transaction)."""
    stored: str | bytes = message_id.encode() if _bytes_kept(dialect) else message_id
    found = conn.execute(
        select(_inbox.c.inbox).where(_inbox.c.inbox == inbox, _inbox.c.message_id == stored)
    ).first()
    return found is not None
