"""The archive partitioned by day on PostgreSQL and MariaDB

Revision ID: 0010
Revises: 0009
Create Date: 2027-01-05 10:01:00.000000

Retention then takes a day out of the archive in one statement, and keeps its dead letters
(docs/design.md, "Retention by day").

PostgreSQL: ``outbox_archive`` becomes a table partitioned by range of ``archived_at``,
without a row copied:

1. ``ck_outbox_archive_before`` (0009) is validated: a read of the archive that blocks neither
   its readers nor its writers (``SHARE UPDATE EXCLUSIVE``).
2. The table is renamed ``outbox_archive_before``, its indexes too; a partitioned
   ``outbox_archive`` takes its place, with its columns, its id's sequence and its indexes.
3. ``outbox_archive_before`` is attached as the partition of every row before the constraint's
   bound: the constraint proves it, so attaching reads nothing, and its indexes become the
   partitions of the new table's. A default partition and the first three days follow.

The writers wait only for steps 2 and 3: catalogue changes, milliseconds whatever the archive's
size. The primary key is per partition (a unique index on ``id`` in each): PostgreSQL allows no
unique index across partitions without the partition key; ``id`` still comes from one sequence.
The downgrade copies the rows archived in the day partitions back into
``outbox_archive_before`` and renames it back.

MariaDB (and MySQL) allow no partition key outside a unique key, and change partitioning by
copying the table: the primary key becomes ``(id, archived_at)`` and the table is partitioned
by ``RANGE COLUMNS (archived_at)`` in one ``ALTER TABLE``, which copies the archive once, its
writers waiting meanwhile (prune it first, as before 0002). ``p_before`` holds the rows before
today, a partition per day from today on follows, ``p_future`` the rows of days with no
partition. The downgrade copies it back to one table with the primary key ``(id)``.

SQLite: nothing changes; retention deletes rows there.

Workers of every generation write and read the archive as before: the same table name and
columns.
"""

from __future__ import annotations

import datetime as dt

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

generation = 10
"""The schema generation this revision brings."""
workers_from = 1
"""The oldest worker generation that works correctly on it: all of them (same table, same
columns)."""

_DAYS_AHEAD = 3


def upgrade() -> None:
    from outbox._db.mysql import partitions as mysql
    from outbox._db.postgresql import partitions as postgresql

    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        postgresql.partition_archive(bind, _DAYS_AHEAD)
    elif bind.dialect.name in ("mysql", "mariadb"):
        today = dt.datetime.now(dt.UTC).date()
        mysql.partition_archive(bind, today, _DAYS_AHEAD + 1)


def downgrade() -> None:
    from outbox._db.mysql import partitions as mysql
    from outbox._db.postgresql import partitions as postgresql

    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        postgresql.unpartition_archive(bind)
        postgresql.bound_archive(bind, _bound())
    elif bind.dialect.name in ("mysql", "mariadb"):
        mysql.unpartition_archive(bind)


def _bound() -> dt.datetime:
    # As 0009 sets it: the start of the UTC day after tomorrow.
    today = dt.datetime.now(dt.UTC).date()
    return dt.datetime.combine(today + dt.timedelta(days=2), dt.time(), dt.UTC)
