"""Statements of the archive's retention by day, on the databases whose archive is
partitioned by day (PostgreSQL from revision 0009, MariaDB from 0010; docs/design.md, "Retention by
day"). Elsewhere, and on an archive made by ``metadata.create_all``, the archive is one table:
:func:`archive_partitioned` says so and retention deletes rows (``delete_old_archived``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from sqlalchemy import Connection

from outbox._db import dialects
from outbox._db.dialects.interface import ArchivePartition, DayRetired

RETENTION_LOCK = "outbox.archive.retention"
"""The name of the lock one retention pass holds, whoever runs it: one pass at a time."""


def _of(conn: Connection) -> ModuleType | None:
    return dialects.partitions(dialects.name_of(conn.dialect))


def archive_partitioned(conn: Connection) -> bool:
    """Whether the archive is partitioned by day here."""
    found = _of(conn)
    return found is not None and bool(found.is_partitioned(conn))


def archive_partitions(conn: Connection) -> list[ArchivePartition]:
    """The archive's partitions, oldest first (none where it is one table)."""
    found = _of(conn)
    if found is None or not found.is_partitioned(conn):
        return []
    parts: list[ArchivePartition] = found.partitions(conn)
    return parts


def archive_days(conn: Connection) -> list[dt.date] | None:
    """The days the archive has a partition of, oldest first; None where it is one table.
    Names only, for retention's passes, which :func:`archive_partitions`' sizes would make
    wait for every partition's lock."""
    found = _of(conn)
    if found is None or not found.is_partitioned(conn):
        return None
    return sorted(found.days(conn))


def archive_first_day(conn: Connection) -> dt.date | None:
    """The first day a day partition may hold (where the rows archived before the archive was
    partitioned end); None where the archive is one table."""
    found = _of(conn)
    day: dt.date | None = None if found is None else found.first_day(conn)
    return day


def make_archive_day(conn: Connection, day: dt.date, lock_wait: float) -> bool:
    """Make ``day``'s partition, waiting at most ``lock_wait`` seconds for each lock; False
    when it exists already (another cleaner made it)."""
    found = _of(conn)
    assert found is not None, "the archive is not partitioned here"
    if found.has_day(conn, day):
        return False
    found.bound_lock_waits(conn, lock_wait)
    try:
        found.make_day(conn, day)
    finally:
        found.unbound_lock_waits(conn)
    return True


def retire_archive_day(conn: Connection, day: dt.date, lock_wait: float) -> DayRetired | None:
    """Take ``day``'s history out of the archive, keeping its dead letters, waiting at most
    ``lock_wait`` seconds for each lock; None when the day's partition is gone already
    (another cleaner dropped it)."""
    found = _of(conn)
    assert found is not None, "the archive is not partitioned here"
    if not found.has_day(conn, day):
        return None
    found.bound_lock_waits(conn, lock_wait)
    try:
        retired: DayRetired = found.retire_day(conn, day)
    finally:
        found.unbound_lock_waits(conn)
    return retired


def count_archive_day_history(conn: Connection, day: dt.date) -> int:
    """The rows of ``day``'s partition that are not dead letters: what retiring it takes (0:
    no partition of the day)."""
    found = _of(conn)
    assert found is not None, "the archive is not partitioned here"
    return int(found.count_history(conn, day)) if found.has_day(conn, day) else 0


def recover_retired_days(conn: Connection) -> int:
    """Finish the days a stopped pass left half retired (MariaDB: exchanged out, their dead
    letters not yet written back); the number finished."""
    found = _of(conn)
    if found is None or not hasattr(found, "recover"):
        return 0
    return int(found.recover(conn))


@contextmanager
def retention_lock(conn: Connection) -> Iterator[bool]:
    """Whether the transaction ``conn`` is in holds the retention lock (one cleaner at a
    time), taken if no other session holds it. PostgreSQL's is the transaction's (it ends
    with it, so that a transaction pooler never hands it to another client); MariaDB's
    (``GET_LOCK``) is released on leaving. SQLite: always held (its one writer at a time
    serializes the deletes anyway)."""
    found = _of(conn)
    held = True if found is None else bool(found.try_lock(conn, RETENTION_LOCK))
    try:
        yield held
    finally:
        if held and found is not None:
            found.unlock(conn, RETENTION_LOCK)


@contextmanager
def bounded_archive_lock_waits(conn: Connection, seconds: float) -> Iterator[None]:
    """Each lock on the archive's tables waited for at most ``seconds`` within the block (a
    reader of the catalogue waits for a partition's DDL too), where the archive may be
    partitioned; nothing on SQLite."""
    found = _of(conn)
    if found is None:
        yield
        return
    found.bound_lock_waits(conn, seconds)
    try:
        yield
    finally:
        found.unbound_lock_waits(conn)
