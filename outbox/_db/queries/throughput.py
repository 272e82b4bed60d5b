"""Statements on ``outbox_throughput``: what each handler handled, minute by minute."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, func, select

from outbox import schema
from outbox._db import dialects
from outbox._db.dialects.clock import age_seconds, db_now_plus, whole_buckets
from outbox._db.types import ThroughputBucket, ThroughputRow

_throughput = schema.throughput
THROUGHPUT_COUNTERS = ("succeeded", "dead", "failed", "satisfied", "tolerating")


def add_throughput(conn: Connection, dialect: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Add counts to their (handler, minute) rows, made when missing: one statement. ``rows``:
    ``handler``, ``minute`` (UTC, whole minutes) and the ``THROUGHPUT_COUNTERS``."""
    if rows:
        dialects.statements(dialect).add_counts(conn, _throughput, rows, THROUGHPUT_COUNTERS)


def throughput_since(conn: Connection, seconds: float) -> list[ThroughputRow]:
    """The rows of the last ``seconds``, by handler and minute; served by the primary key."""
    rows = conn.execute(
        select(_throughput)
        .where(_throughput.c.minute >= db_now_plus(-seconds))
        .order_by(_throughput.c.handler, _throughput.c.minute)
    )
    return [
        ThroughputRow(r.handler, _utc(r.minute), int(r.succeeded), int(r.dead), int(r.failed))
        for r in rows
    ]


def throughput_buckets(
    conn: Connection, handlers: Sequence[str], seconds: float, bucket_seconds: int
) -> list[ThroughputBucket]:
    """The counts of ``handlers`` over the last ``seconds``, summed in SQL into buckets of
    ``bucket_seconds`` counted back from now (``ago`` 0: the newest); the buckets with no row
    are absent. Each handler's minutes are a range of the primary key (handler, minute): a
    week reads at most 10,080 rows a handler, however long the table is kept."""
    ago = whole_buckets(age_seconds(_throughput.c.minute), bucket_seconds).label("ago")
    rows = conn.execute(
        select(
            _throughput.c.handler,
            ago,
            func.sum(_throughput.c.succeeded).label("succeeded"),
            func.sum(_throughput.c.dead).label("dead"),
            func.sum(_throughput.c.failed).label("failed"),
        )
        .where(
            _throughput.c.handler.in_(list(handlers)),
            _throughput.c.minute >= db_now_plus(-seconds),
        )
        .group_by(_throughput.c.handler, ago)
    )
    return [
        ThroughputBucket(r.handler, int(r.ago), int(r.succeeded), int(r.dead), int(r.failed))
        for r in rows
    ]


def delete_old_throughput(conn: Connection, older_than_seconds: float, limit: int) -> int:
    """Delete up to ``limit`` minutes older than ``older_than_seconds`` (one statement with
    the age as the only condition: the table holds a row per handler and minute)."""
    old = conn.execute(
        select(_throughput.c.handler, _throughput.c.minute)
        .where(_throughput.c.minute < db_now_plus(-older_than_seconds))
        .limit(limit)
    ).all()
    deleted = 0
    for handler, minute in old:
        deleted += conn.execute(
            _throughput.delete().where(
                _throughput.c.handler == handler, _throughput.c.minute == minute
            )
        ).rowcount
    return deleted


def _utc(moment: dt.datetime) -> dt.datetime:
    # SQLite and MariaDB give the stored UTC back without its zone.
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
