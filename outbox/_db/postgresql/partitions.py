"""The archive's partitions on PostgreSQL: one per UTC day, each split by status so that a
day's history goes in one statement and its dead letters stay (docs/design.md, "Retention by
day").

``outbox_archive`` is partitioned by range of ``archived_at``:

- ``outbox_archive_before``: the archive as it was before revision 0010, up to the bound its
  check constraint proves (``FROM (MINVALUE)``); pruned row by row, as before.
- ``outbox_archive_dYYYYMMDD``: one UTC day, itself partitioned by list of ``status``: its
  ``_dead`` leaf holds the dead letters, its ``_rest`` leaf (the default) everything else.
- ``outbox_archive_default``: rows of a day with no partition (the days are made ahead; this
  holds rows only when nothing made them); pruned row by row.

Every statement that takes a lock on a partition the workers write or read runs with a short
``lock_timeout``: it gives up rather than queue the workers behind it.
"""

from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import Connection, text

from outbox._db.dialects.interface import ArchivePartition, DayRetired

ROOT = "outbox_archive"
BEFORE = "outbox_archive_before"
DEFAULT = "outbox_archive_default"
_DAY = re.compile(r"^outbox_archive_d(\d{8})$")
_BOUND = re.compile(r"TO \('([^']+)'\)")
_DEAD = "dead"


def day_name(day: dt.date) -> str:
    """The name of ``day``'s partition."""
    return f"{ROOT}_d{day:%Y%m%d}"


def is_partitioned(conn: Connection) -> bool:
    """Whether ``outbox_archive`` is a partitioned table here (revision 0010 made it one)."""
    kind = conn.execute(
        text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:name)"), {"name": ROOT}
    ).scalar_one_or_none()
    return kind == "p"


def partitions(conn: Connection) -> list[ArchivePartition]:
    """The archive's partitions, oldest first, with their size and estimated rows."""
    rows = conn.execute(
        text(
            "SELECT c.relname AS name, "
            " (SELECT coalesce(sum(greatest(l.reltuples, 0)), 0)::bigint "
            "    FROM pg_partition_tree(c.oid) t JOIN pg_class l ON l.oid = t.relid "
            "   WHERE t.isleaf) AS rows, "
            " (SELECT coalesce(sum(greatest(l.reltuples, 0)), 0)::bigint "
            "    FROM pg_partition_tree(c.oid) t JOIN pg_class l ON l.oid = t.relid "
            "   WHERE t.isleaf AND l.relname = c.relname || '_dead') AS dead_rows, "
            " (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint "
            "    FROM pg_partition_tree(c.oid) t WHERE t.isleaf) AS bytes "
            "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(:root) ORDER BY c.relname"
        ),
        {"root": ROOT},
    ).all()
    found = []
    for row in rows:
        match = _DAY.match(row.name)
        day = dt.datetime.strptime(match.group(1), "%Y%m%d").date() if match else None
        found.append(
            ArchivePartition(
                row.name, day, int(row.rows), int(row.dead_rows) if day else -1, int(row.bytes)
            )
        )
    order = {BEFORE: 0, DEFAULT: 2}
    return sorted(found, key=lambda p: (order.get(p.name, 1), p.day or dt.date.min))


def first_day(conn: Connection) -> dt.date | None:
    """The first day a day partition may hold: where ``outbox_archive_before`` ends; None
    without it."""
    bound = conn.execute(
        text(
            "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class c "
            "WHERE c.oid = to_regclass(:name) AND c.relispartition"
        ),
        {"name": BEFORE},
    ).scalar_one_or_none()
    if bound is None:
        return None
    match = _BOUND.search(bound)
    if match is None:
        return None
    value = conn.execute(text("SELECT CAST(:v AS timestamptz)"), {"v": match.group(1)})
    found: dt.datetime = value.scalar_one()
    return found.astimezone(dt.UTC).date()


def bound_lock_waits(conn: Connection, seconds: float) -> None:
    """Wait at most ``seconds`` for each lock for the rest of the transaction."""
    conn.execute(text(f"SET LOCAL lock_timeout = '{int(seconds * 1000)}ms'"))


def unbound_lock_waits(conn: Connection) -> None:
    """Nothing: :func:`bound_lock_waits` ends with its transaction."""


def make_day(conn: Connection, day: dt.date) -> None:
    """Make ``day``'s partition: built apart, with its two leaves and their indexes, then
    attached. Attaching takes ``SHARE UPDATE EXCLUSIVE`` on the archive (its readers and
    writers go on) and reads only the default partition, to check it holds none of the day's
    rows."""
    name = day_name(day)
    start = dt.datetime.combine(day, dt.time(), dt.UTC)
    end = start + dt.timedelta(days=1)
    conn.execute(
        text(f"CREATE TABLE {name} (LIKE {ROOT} INCLUDING DEFAULTS) PARTITION BY LIST (status)")
    )
    conn.execute(text(f"CREATE TABLE {name}_dead PARTITION OF {name} FOR VALUES IN ('{_DEAD}')"))
    conn.execute(text(f"CREATE TABLE {name}_rest PARTITION OF {name} DEFAULT"))
    for leaf in (f"{name}_dead", f"{name}_rest"):
        # Per leaf, not on the archive: a unique index over partitions would have to hold
        # the partition key. Ids come from one sequence; the index serves lookups and order.
        conn.execute(text(f"CREATE UNIQUE INDEX {leaf}_id ON {leaf} (id)"))
    conn.execute(
        text(
            f"ALTER TABLE {ROOT} ATTACH PARTITION {name} "
            f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
        )
    )


def retire_day(conn: Connection, day: dt.date) -> DayRetired:
    """Take ``day``'s history out of the archive and keep its dead letters. A day with no dead
    letter is dropped whole (``ACCESS EXCLUSIVE`` on the archive, for the milliseconds a drop
    takes); a day with some has its ``_rest`` leaf truncated (``ACCESS EXCLUSIVE`` on that leaf
    alone) and stays, holding only them. Neither leaves a dead row behind to vacuum."""
    name = day_name(day)
    if not conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {name}_dead)")).scalar_one():
        conn.execute(text(f"DROP TABLE {name}"))
        return DayRetired.DROPPED
    if not conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {name}_rest)")).scalar_one():
        return DayRetired.KEPT
    conn.execute(text(f"TRUNCATE {name}_rest"))
    return DayRetired.EMPTIED


def try_lock(conn: Connection, key: str) -> bool:
    """Take the session's advisory lock ``key`` if no other session holds it."""
    got = conn.execute(text("SELECT pg_try_advisory_lock(hashtext(:key))"), {"key": key})
    return bool(got.scalar_one())


def unlock(conn: Connection, key: str) -> None:
    """Release the session's advisory lock ``key``."""
    conn.execute(text("SELECT pg_advisory_unlock(hashtext(:key))"), {"key": key})


_INDEXES = ("handler_status", "archived_at", "group_id")
BOUND_CONSTRAINT = "ck_outbox_archive_before"


def bound_archive(conn: Connection, bound: dt.datetime) -> None:
    """Record that every row of ``outbox_archive`` is archived before ``bound`` (or before the
    day after its newest row's, if later: a row dated ahead stays where it is): a check
    constraint, ``NOT VALID`` (checked for new rows only; a lock of milliseconds), which
    :func:`partition_archive` validates. An archive partitioned already, or bounded already,
    is left as it is (tables stamped at a revision rather than migrated to it)."""
    bounded = conn.execute(
        text("SELECT 1 FROM pg_constraint WHERE conname = :name"), {"name": BOUND_CONSTRAINT}
    ).first()
    if bounded is not None or is_partitioned(conn):
        return
    newest = conn.execute(text(f"SELECT max(archived_at) FROM {ROOT}")).scalar_one_or_none()
    if newest is not None:
        after = dt.datetime.combine(newest.astimezone(dt.UTC).date(), dt.time(), dt.UTC)
        bound = max(bound, after + dt.timedelta(days=1))
    conn.execute(
        text(
            f"ALTER TABLE {ROOT} ADD CONSTRAINT {BOUND_CONSTRAINT} "
            f"CHECK (archived_at < '{bound.isoformat()}') NOT VALID"
        )
    )


def partition_archive(conn: Connection, days_ahead: int) -> None:
    """Make ``outbox_archive`` (bounded by :func:`bound_archive`) the partition of every row
    before its bound in a new ``outbox_archive`` partitioned by day, without copying a row:
    the constraint is validated (a read that blocks no reader or writer), the table and its
    indexes renamed, the partitioned table made in its place with its columns, sequence and
    indexes, and the old one attached (the constraint proves its rows belong: nothing read
    under lock); then the default partition and ``days_ahead`` days from the bound. An
    archive partitioned already (tables stamped at a revision rather than migrated to it) is
    left as it is."""
    if is_partitioned(conn):
        return
    conn.execute(text(f"ALTER TABLE {ROOT} VALIDATE CONSTRAINT {BOUND_CONSTRAINT}"))
    conn.execute(text(f"ALTER TABLE {ROOT} RENAME TO {BEFORE}"))
    conn.execute(text(f"ALTER INDEX pk_{ROOT} RENAME TO pk_{BEFORE}"))
    for index in _INDEXES:
        conn.execute(text(f"ALTER INDEX ix_{ROOT}_{index} RENAME TO ix_{BEFORE}_{index}"))
    conn.execute(
        text(
            f"CREATE TABLE {ROOT} (LIKE {BEFORE} INCLUDING DEFAULTS INCLUDING COMMENTS) "
            "PARTITION BY RANGE (archived_at)"
        )
    )
    conn.execute(text(f"ALTER SEQUENCE {ROOT}_id_seq OWNED BY {ROOT}.id"))
    conn.execute(text(f"CREATE INDEX ix_{ROOT}_handler_status ON {ROOT} (handler, status)"))
    conn.execute(text(f"CREATE INDEX ix_{ROOT}_archived_at ON {ROOT} (archived_at)"))
    conn.execute(text(f"CREATE INDEX ix_{ROOT}_group_id ON {ROOT} (group_id)"))
    bound: dt.datetime = conn.execute(
        text(
            "SELECT (regexp_match(pg_get_constraintdef(oid), '''([^'']+)'''))[1]::timestamptz "
            "FROM pg_constraint WHERE conname = :name"
        ),
        {"name": BOUND_CONSTRAINT},
    ).scalar_one()
    conn.execute(
        text(
            f"ALTER TABLE {ROOT} ATTACH PARTITION {BEFORE} "
            f"FOR VALUES FROM (MINVALUE) TO ('{bound.isoformat()}')"
        )
    )
    conn.execute(text(f"CREATE TABLE {DEFAULT} PARTITION OF {ROOT} DEFAULT"))
    conn.execute(text(f"CREATE UNIQUE INDEX {DEFAULT}_id ON {DEFAULT} (id)"))
    first = bound.astimezone(dt.UTC).date()
    for offset in range(days_ahead):
        make_day(conn, first + dt.timedelta(days=offset))


def unpartition_archive(conn: Connection) -> None:
    """Undo :func:`partition_archive`: the rows archived in the other partitions are copied
    into ``outbox_archive_before``, which becomes ``outbox_archive`` again, bounded anew (its
    constraint ``NOT VALID``, as :func:`bound_archive` leaves it). An archive that is one
    table already (tables stamped at a revision rather than migrated to it) is left as it is."""
    if not is_partitioned(conn):
        return
    conn.execute(text(f"ALTER TABLE {ROOT} DETACH PARTITION {BEFORE}"))
    conn.execute(text(f"ALTER TABLE {BEFORE} DROP CONSTRAINT {BOUND_CONSTRAINT}"))
    conn.execute(text(f"INSERT INTO {BEFORE} SELECT * FROM {ROOT}"))
    conn.execute(text(f"ALTER SEQUENCE {ROOT}_id_seq OWNED BY {BEFORE}.id"))
    conn.execute(text(f"DROP TABLE {ROOT}"))
    conn.execute(text(f"ALTER TABLE {BEFORE} RENAME TO {ROOT}"))
    conn.execute(text(f"ALTER INDEX pk_{BEFORE} RENAME TO pk_{ROOT}"))
    for index in _INDEXES:
        conn.execute(text(f"ALTER INDEX ix_{BEFORE}_{index} RENAME TO ix_{ROOT}_{index}"))


def count_history(conn: Connection, day: dt.date) -> int:
    """The rows of ``day`` that are not dead letters (its ``_rest`` leaf)."""
    return int(conn.execute(text(f"SELECT count(*) FROM {day_name(day)}_rest")).scalar_one())
