"""The archive's rows before the cut attached; MariaDB's archive partitioned by day

Revision ID: 0010
Revises: 0009
Create Date: 2027-01-05 10:01:00.000000

Retention then takes a day out of the archive in one statement, and keeps its dead letters
(docs/design.md, "Retention by day").

PostgreSQL: ``outbox_archive_before`` (0009) becomes the partition of every row before the
cut, without a row copied and without a long read under a lock anyone waits for: its check
constraint is validated (a read of a table nothing else uses), the rows stamped before the cut
by transactions that began before 0009 move from the default partition to it, and it is
attached ``FROM (MINVALUE) TO (cut)`` (the constraint proves its rows belong; only the default
partition is read, under its lock). Readers of the archive wait for those milliseconds;
writers do not. The downgrade detaches it.

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
        postgresql.attach_before(bind)
    elif bind.dialect.name in ("mysql", "mariadb"):
        today = dt.datetime.now(dt.UTC).date()
        mysql.partition_archive(bind, today, _DAYS_AHEAD + 1)


def downgrade() -> None:
    from outbox._db.mysql import partitions as mysql
    from outbox._db.postgresql import partitions as postgresql

    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        postgresql.detach_before(bind)
    elif bind.dialect.name in ("mysql", "mariadb"):
        mysql.unpartition_archive(bind)
