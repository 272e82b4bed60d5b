"""outbox_throughput: counts added to a handler's minute, made when missing, read and pruned
by age; on every database."""

from __future__ import annotations

import datetime as dt

from outbox._db import queries
from tests.conformance._database import Database


def _now_minute() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)


def _row(handler: str, minute: dt.datetime, succeeded: int, dead: int = 0) -> dict[str, object]:
    return {"handler": handler, "minute": minute, "succeeded": succeeded, "dead": dead, "failed": 0}


def test_counts_of_one_minute_add_up(db: Database) -> None:
    """Two writes to one handler's minute add; another handler and another minute stay
    apart."""
    now = _now_minute()
    before = now - dt.timedelta(minutes=1)
    db.run(lambda conn: queries.add_throughput(conn, db.dialect, [_row("a", now, 5, 1)]))
    db.run(
        lambda conn: queries.add_throughput(
            conn, db.dialect, [_row("a", now, 7), _row("b", now, 2), _row("a", before, 3)]
        )
    )
    with db.engine.connect() as conn:
        found = queries.throughput_since(conn, 600)
    assert [("a", before, 3, 0), ("a", now, 12, 1), ("b", now, 2, 0)] == [
        (r.handler, r.minute, r.succeeded, r.dead) for r in found
    ]


def test_old_minutes_are_not_read_and_are_pruned(db: Database) -> None:
    """A minute two hours old is past an hour's read, and the prune of an hour deletes it."""
    now = _now_minute()
    old = now - dt.timedelta(hours=2)
    db.run(
        lambda conn: queries.add_throughput(
            conn, db.dialect, [_row("a", now, 1), _row("a", old, 1)]
        )
    )
    with db.engine.connect() as conn:
        read = [r.minute for r in queries.throughput_since(conn, 3600)]
    deleted = db.run(lambda conn: queries.delete_old_throughput(conn, 3600, 100))
    with db.engine.connect() as conn:
        left = [r.minute for r in queries.throughput_since(conn, 86_400)]
    assert ([now], 1, [now]) == (read, deleted, left)


def test_minutes_are_summed_into_buckets_counted_back_from_now(db: Database) -> None:
    """Hour buckets of a day: this minute and the one before in bucket 0, a minute three hours
    back in bucket 2 or 3 (by where in the hour now is) with its neighbour, one two days back
    outside the day; only the handlers asked for, each on its own."""
    now = _now_minute()
    three = now - dt.timedelta(hours=3)
    rows = [
        _row("a", now, 5, 1),
        _row("a", now - dt.timedelta(minutes=1), 2),
        _row("a", three, 4),
        _row("a", three + dt.timedelta(minutes=1), 6),
        _row("a", now - dt.timedelta(days=2), 100),
        _row("b", now, 7),
        _row("c", now, 9),
    ]
    db.run(lambda conn: queries.add_throughput(conn, db.dialect, rows))
    with db.engine.connect() as conn:
        found = queries.throughput_buckets(conn, ["a", "b"], 86_400, 3600)
    by = {(b.handler, b.ago): (b.succeeded, b.dead, b.failed) for b in found}
    three_back = {k: v for k, v in by.items() if k[0] == "a" and k[1] != 0}
    assert ((7, 1, 0), (7, 0, 0), 10, True) == (
        by[("a", 0)],
        by[("b", 0)],
        sum(v[0] for v in three_back.values()),
        set(three_back) <= {("a", 2), ("a", 3)} and len(by) == 2 + len(three_back),
    )
