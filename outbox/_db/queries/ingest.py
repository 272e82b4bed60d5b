"""Statements on ``outbox_ingest_keys``: the idempotency keys a producer's events were
written under."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, insert, select, tuple_

from outbox import schema
from outbox._db import dialects
from outbox._db.dialects.clock import db_now_plus


def ingested_keys(
    conn: Connection, dialect: str, handler: str, keys: Sequence[str]
) -> dict[str, int]:
    """Of ``keys``, those a producer's events were written under already, with the event's id;
    served by the primary key of ``outbox_ingest_keys``, planned for the keys given (see
    ``plan_each_time``): hundreds of them in one ``IN``."""
    dialects.statements(dialect).plan_each_time(conn)
    ingest = schema.ingest_keys
    rows = conn.execute(
        select(ingest.c.key, ingest.c.event_id).where(
            ingest.c.handler == handler, ingest.c.key.in_(list(keys))
        )
    )
    found = {key: int(event_id) for key, event_id in rows}
    given = set(keys)
    if given.issuperset(found):
        return found
    # The column's collation matched a key spelled otherwise (MariaDB's compares case, accents
    # and trailing spaces away): each key not found as given is asked alone, so that the
    # answer is by the keys given, matched as the primary key matches them.
    matched = {key: event_id for key, event_id in found.items() if key in given}
    for key in given - set(found):
        event_id = conn.execute(
            select(ingest.c.event_id).where(ingest.c.handler == handler, ingest.c.key == key)
        ).scalar_one_or_none()
        if event_id is not None:
            matched[key] = int(event_id)
    return matched


def record_ingested(conn: Connection, handler: str, written: dict[str, int]) -> None:
    """Record the keys events were written under; a key recorded already (a concurrent
    producer's) fails the transaction with the primary key's IntegrityError."""
    conn.execute(
        insert(schema.ingest_keys),
        [{"handler": handler, "key": k, "event_id": n} for k, n in written.items()],
    )


def delete_old_ingest_keys(conn: Connection, older_than_seconds: float, limit: int) -> int:
    """Delete up to ``limit`` idempotency keys older than ``older_than_seconds``."""
    ingest = schema.ingest_keys
    keys = conn.execute(
        select(ingest.c.handler, ingest.c.key)
        .where(ingest.c.received_at < db_now_plus(-older_than_seconds))
        .order_by(ingest.c.received_at)
        .limit(limit)
    ).all()
    if not keys:
        return 0
    picked = tuple_(ingest.c.handler, ingest.c.key).in_([tuple(k) for k in keys])
    return conn.execute(ingest.delete().where(picked)).rowcount
