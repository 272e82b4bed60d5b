"""The archive's partitions on MariaDB and MySQL: one per UTC day, by ``RANGE COLUMNS
(archived_at)`` (docs/design.md, "Retention by day").

The partition key must be in every unique key: the primary key is ``(id, archived_at)``.
Partitions: ``p_before`` (the archive as it was before revision 0010), ``dYYYYMMDD`` (one UTC
day), ``p_future`` (``MAXVALUE``: the rows of days with no partition, and where the next day is
split off). No partition by status: MariaDB subpartitions only by hash, so a day whose dead
letters must stay is emptied by exchanging it with an empty table, whose dead letters are then
written back (:func:`retire_day`).

Each statement that takes the table's metadata lock runs with ``lock_wait_timeout`` bounded: it
gives up rather than queue the workers behind it.
"""

from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import Connection, text

from outbox._db.dialects.interface import ArchivePartition, DayRetired

ROOT = "outbox_archive"
BEFORE = "p_before"
FUTURE = "p_future"
RETIRED = "outbox_archive_retired_"
_DAY = re.compile(r"^d(\d{8})$")
_DEAD = "'dead'"


def day_name(day: dt.date) -> str:
    """The name of ``day``'s partition."""
    return f"d{day:%Y%m%d}"


def has_day(conn: Connection, day: dt.date) -> bool:
    """Whether ``day``'s partition exists."""
    found = conn.execute(
        text(
            "SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = :root AND PARTITION_NAME = :name"
        ),
        {"root": ROOT, "name": day_name(day)},
    ).scalar_one()
    return int(found) > 0


def is_partitioned(conn: Connection) -> bool:
    """Whether ``outbox_archive`` is partitioned here (revision 0010 made it so)."""
    found = conn.execute(
        text(
            "SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = :root AND PARTITION_NAME IS NOT NULL"
        ),
        {"root": ROOT},
    ).scalar_one()
    return int(found) > 0


def partitions(conn: Connection) -> list[ArchivePartition]:
    """The archive's partitions, oldest first: estimated rows (InnoDB's), their size with
    indexes; dead letters are not estimated here (-1)."""
    rows = conn.execute(
        text(
            "SELECT PARTITION_NAME AS name, TABLE_ROWS AS n, DATA_LENGTH + INDEX_LENGTH AS size "
            "FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = :root AND PARTITION_NAME IS NOT NULL "
            "ORDER BY PARTITION_ORDINAL_POSITION"
        ),
        {"root": ROOT},
    ).all()
    found = []
    for row in rows:
        match = _DAY.match(row.name)
        day = _day_of(match.group(1)) if match else None
        found.append(ArchivePartition(row.name, day, int(row.n or 0), -1, int(row.size or 0)))
    return found


def days(conn: Connection) -> list[dt.date]:
    """The days the archive has a partition of, from their names alone."""
    names = conn.execute(
        text(
            "SELECT PARTITION_NAME FROM information_schema.PARTITIONS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :root "
            "AND PARTITION_NAME IS NOT NULL"
        ),
        {"root": ROOT},
    ).scalars()
    return [_day_of(m.group(1)) for name in names if (m := _DAY.match(name))]


def _day_of(digits: str) -> dt.date:
    return dt.datetime.strptime(digits, "%Y%m%d").date()


def first_day(conn: Connection) -> dt.date | None:
    """The first day a day partition may hold: where ``p_before`` ends; None without it."""
    bound = conn.execute(
        text(
            "SELECT PARTITION_DESCRIPTION FROM information_schema.PARTITIONS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :root AND PARTITION_NAME = :name"
        ),
        {"root": ROOT, "name": BEFORE},
    ).scalar_one_or_none()
    if bound is None:
        return None
    return dt.datetime.fromisoformat(str(bound).strip("'")).date()


def bound_lock_waits(conn: Connection, seconds: float) -> None:
    """Wait at most ``seconds`` (whole, at least one) for the table's metadata lock, until
    :func:`unbound_lock_waits` (the setting is the session's, and the session the pool's:
    the session's own value is kept to be put back)."""
    conn.execute(
        text(
            "SET @outbox_lock_wait_timeout = @@SESSION.lock_wait_timeout, "
            f"SESSION lock_wait_timeout = {max(int(seconds), 1)}"
        )
    )


def unbound_lock_waits(conn: Connection) -> None:
    """Wait for metadata locks as the session did before :func:`bound_lock_waits`."""
    conn.execute(text("SET SESSION lock_wait_timeout = @outbox_lock_wait_timeout"))


def make_day(conn: Connection, day: dt.date) -> None:
    """Split ``day``'s partition off ``p_future``: ``REORGANIZE`` copies ``p_future``'s rows,
    none while the days are made ahead. Only for a day after every day partition."""
    end = day + dt.timedelta(days=1)
    conn.execute(
        text(
            f"ALTER TABLE {ROOT} REORGANIZE PARTITION {FUTURE} INTO ("
            f"PARTITION {day_name(day)} VALUES LESS THAN ('{end.isoformat()}'), "
            f"PARTITION {FUTURE} VALUES LESS THAN (MAXVALUE))"
        )
    )


def _has(conn: Connection, partition: str, condition: str) -> bool:
    # Per handler, so that the (handler, status) index serves each probe; the handlers come
    # from a loose scan of the same index.
    handlers = conn.execute(
        text(f"SELECT handler FROM {ROOT} PARTITION ({partition}) GROUP BY handler")
    ).scalars()
    for handler in handlers:
        found = conn.execute(
            text(
                f"SELECT 1 FROM {ROOT} PARTITION ({partition}) "
                f"WHERE handler = :handler AND {condition} LIMIT 1"
            ),
            {"handler": handler},
        ).first()
        if found is not None:
            return True
    return False


def retire_day(conn: Connection, day: dt.date) -> DayRetired:
    """Take ``day``'s history out of the archive and keep its dead letters. A day with no dead
    letter is dropped (``DROP PARTITION``); a day with some is exchanged with an empty table
    (a swap of files under the metadata lock), its dead letters written back, the table
    dropped. A pass that stops between the two finishes at the next (:func:`recover`)."""
    name = day_name(day)
    if not _has(conn, name, f"status = {_DEAD}"):
        conn.execute(text(f"ALTER TABLE {ROOT} DROP PARTITION {name}"))
        return DayRetired.DROPPED
    if not _has(conn, name, f"status <> {_DEAD}"):
        return DayRetired.KEPT
    retired = RETIRED + name
    conn.execute(text(f"DROP TABLE IF EXISTS {retired}"))
    conn.execute(text(f"CREATE TABLE {retired} LIKE {ROOT}"))
    conn.execute(text(f"ALTER TABLE {retired} REMOVE PARTITIONING"))
    # Outside a transaction: in one (autocommit off, as SQLAlchemy runs), MariaDB 10.11's
    # exchange waits on its own check of the rows until the lock wait times out.
    conn.execute(text("SET autocommit = 1"))
    try:
        conn.execute(text(f"ALTER TABLE {ROOT} EXCHANGE PARTITION {name} WITH TABLE {retired}"))
    finally:
        conn.execute(text("SET autocommit = 0"))
    _write_back(conn, retired)
    return DayRetired.EMPTIED


def recover(conn: Connection) -> int:
    """Finish the days a pass exchanged out and did not finish with: write their dead letters
    back, drop them. The number finished."""
    names = conn.execute(
        text(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME LIKE :prefix"
        ),
        {"prefix": RETIRED.replace("_", "\\_") + "%"},
    ).scalars()
    found = list(names)
    for retired in found:
        _write_back(conn, retired)
    return len(found)


def _write_back(conn: Connection, retired: str) -> None:
    # IGNORE: a pass stopped after writing them back and before the drop writes them again.
    conn.execute(text(f"INSERT IGNORE INTO {ROOT} SELECT * FROM {retired} WHERE status = {_DEAD}"))
    # DDL: MariaDB commits the rows written back first.
    conn.execute(text(f"DROP TABLE {retired}"))


def try_lock(conn: Connection, key: str) -> bool:
    """Take the named lock ``key`` if no other session holds it."""
    return bool(conn.execute(text("SELECT GET_LOCK(:key, 0)"), {"key": key}).scalar())


def unlock(conn: Connection, key: str) -> None:
    """Release the named lock ``key``."""
    conn.execute(text("SELECT RELEASE_LOCK(:key)"), {"key": key})


def partition_archive(conn: Connection, first: dt.date, days_ahead: int) -> None:
    """Partition ``outbox_archive`` by day: ``p_before`` for the rows before ``first``, a
    partition for each of the ``days_ahead`` days from ``first`` on, ``p_future``. The
    partition key must be in every unique key: the primary key becomes ``(id, archived_at)``
    in the same ``ALTER TABLE``, which copies the table once. Run again after it stopped
    half-way (MariaDB commits each DDL statement), it makes only what is missing."""
    if is_partitioned(conn):
        have = {p.day for p in partitions(conn)}
        last = max((d for d in have if d is not None), default=None)
        for offset in range(days_ahead):
            day = first + dt.timedelta(days=offset)
            if last is None or day > last:
                make_day(conn, day)
        return
    conn.execute(
        text(
            f"ALTER TABLE {ROOT} DROP PRIMARY KEY, ADD PRIMARY KEY (id, archived_at) "
            "PARTITION BY RANGE COLUMNS (archived_at) ("
            f"PARTITION {BEFORE} VALUES LESS THAN ('{first.isoformat()}'), "
            f"PARTITION {FUTURE} VALUES LESS THAN (MAXVALUE))"
        )
    )
    for offset in range(days_ahead):
        make_day(conn, first + dt.timedelta(days=offset))


def unpartition_archive(conn: Connection) -> None:
    """Undo :func:`partition_archive`: one table again, its primary key ``(id)`` (a copy)."""
    if not is_partitioned(conn):
        return
    conn.execute(
        text(f"ALTER TABLE {ROOT} DROP PRIMARY KEY, ADD PRIMARY KEY (id) REMOVE PARTITIONING")
    )


def count_history(conn: Connection, day: dt.date) -> int:
    """The rows of ``day`` that are not dead letters."""
    found = conn.execute(
        text(f"SELECT COUNT(*) FROM {ROOT} PARTITION ({day_name(day)}) WHERE status <> {_DEAD}")
    )
    return int(found.scalar_one())
