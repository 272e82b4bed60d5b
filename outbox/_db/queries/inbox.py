"""Statements on ``outbox_inbox``: the message ids each inbox had an effect for."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Connection, func, literal, select

from outbox import schema
from outbox._db import dialects
from outbox._db.dialects.clock import age_seconds, db_now_plus

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


def record_inbox_ids(
    conn: Connection, dialect: str, inbox: str, message_ids: Sequence[str], horizon: float
) -> set[str]:
    """Record ``message_ids`` in ``inbox``, kept ``horizon`` seconds; the ids it did not hold,
    which this transaction now holds. An id another transaction is recording waits for that
    transaction's end: taken when it commits, recorded here when it rolls back. Ids are written
    in their order, so that two transactions recording some of the same ids wait for each
    other rather than each holding what the other needs."""
    statements = dialects.statements(dialect)
    ordered = sorted(set(message_ids))
    new: set[str] = set()
    for start in range(0, len(ordered), INSERT_CHUNK):
        rows = [
            {
                "inbox": inbox,
                "message_id": m,
                "expires_at": db_now_plus(horizon),
            }
            for m in ordered[start : start + INSERT_CHUNK]
        ]
        inserted = statements.insert_new(conn, _inbox, rows, _inbox.c.message_id)
        new.update(inserted)
    return new


def delete_expired_inbox_ids(conn: Connection, limit: int) -> int:
    """Delete up to ``limit`` inbox ids past their ``expires_at`` (found through its index);
    how many."""
    dialect = dialects.name_of(conn.dialect)
    expired = _inbox.c.expires_at < db_now_plus(0)
    return dialects.statements(dialect).delete_some(conn, _inbox, expired, limit)


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


def inbox_holds(conn: Connection, inbox: str, message_id: str) -> bool:
    """Whether ``inbox`` holds ``message_id`` (committed, or written by this transaction)."""
    found = conn.execute(
        select(_inbox.c.inbox).where(_inbox.c.inbox == inbox, _inbox.c.message_id == message_id)
    ).first()
    return found is not None


@dataclass(frozen=True, slots=True)
class InboxReading:
    """What one inbox keeps, read at a bounded cost (:func:`read_inbox`). Ages are float
    seconds by the database clock."""

    ids: int
    """Ids kept, counted no further than the cap."""
    expired: int
    """Ids past their ``expires_at`` not deleted yet, counted no further than the cap."""
    oldest_age: float | None
    """Seconds since the id that expires first was received; None when it keeps none."""
    newest_age: float | None
    """Seconds since the id that expires last was received."""
    next_expiry_in: float | None
    """Seconds until the first id expires (< 0: it expired that long ago)."""


def inbox_names(conn: Connection, limit: int) -> list[str]:
    """The names of the inboxes that keep ids, in order, at most ``limit``.

    One ``MIN(inbox)`` after the last name found per inbox: each is a probe of the primary key
    (inbox, message_id), so that a table of millions of ids costs as many probes as it has
    inboxes, where ``SELECT DISTINCT`` would read the whole index on PostgreSQL."""
    names: list[str] = []
    while len(names) < limit:
        statement = select(func.min(_inbox.c.inbox))
        if names:
            statement = statement.where(_inbox.c.inbox > names[-1])
        found = conn.execute(statement).scalar_one_or_none()
        if found is None:
            break
        names.append(found)
    return names


def read_inbox(conn: Connection, inbox: str, cap: int | None) -> InboxReading:
    """What ``inbox`` keeps: its ids and those past their expiry, each counted up to ``cap``
    (None: all of them), and the ages of the ids that expire first and last.

    Bounded whatever the table holds: the counts stop after ``cap`` rows of the primary key's
    range of the inbox (those past their expiry: of the ``expires_at`` index's range before
    now, a few rows between two prunes); the first and the last to expire are one ``LIMIT 1``
    each, through the ``expires_at`` index or the inbox's key range, whichever the planner
    finds cheaper. The oldest id received is the first to expire, unless the horizon was
    shortened since it was received (then an id received later may expire first)."""
    mine = _inbox.c.inbox == inbox
    ids = _count_up_to(conn, cap, mine)
    if not ids:
        return InboxReading(0, 0, None, None, None)
    expired = _count_up_to(conn, cap, mine, _inbox.c.expires_at < db_now_plus(0))
    ends = select(age_seconds(_inbox.c.received_at), age_seconds(_inbox.c.expires_at)).where(mine)
    first = conn.execute(ends.order_by(_inbox.c.expires_at).limit(1)).first()
    last = conn.execute(ends.order_by(_inbox.c.expires_at.desc()).limit(1)).first()
    if first is None or last is None:  # pruned between the statements
        return InboxReading(0, 0, None, None, None)
    return InboxReading(
        ids=ids,
        expired=expired,
        oldest_age=max(float(first[0]), 0.0),
        newest_age=max(float(last[0]), 0.0),
        next_expiry_in=-float(first[1]),
    )


def _count_up_to(conn: Connection, cap: int | None, *where: ColumnElement[bool]) -> int:
    # The LIMIT inside stops the scan at ``cap`` rows: a capped count.
    capped = select(literal(1)).select_from(_inbox).where(*where).limit(cap).subquery()
    return int(conn.execute(select(func.count()).select_from(capped)).scalar_one())
