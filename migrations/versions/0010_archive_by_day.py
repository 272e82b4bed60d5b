"""The archive partitioned by day on PostgreSQL and MariaDB

Revision ID: 0010
Revises: 0009
Create Date: 2027-01-05 10:01:00.000000

PostgreSQL only (docs/design.md, "Retention by day"). ``outbox_archive`` becomes a table
partitioned by range of ``archived_at``, without a row copied:

1. ``ck_outbox_archive_before`` (0009) is validated: a read of the archive that blocks neither
   its readers nor its writers (``SHARE UPDATE EXCLUSIVE``).
2. The table is renamed ``outbox_archive_before``, its indexes too; a partitioned
   ``outbox_archive`` takes its place, with its columns, its id's sequence and its indexes.
3. ``outbox_archive_before`` is attached as the partition of every row before the constraint's
   bound: the constraint proves it, so attaching reads nothing, and its indexes become the
   partitions of the new table's. A default partition and the first three days follow.

The writers wait only for steps 2 and 3: catalogue changes, milliseconds whatever the archive's
size. Workers of every generation write and read the archive as before: the partitioned table
has the same name and columns. Its primary key is per partition (a unique index on ``id`` in
each), as PostgreSQL allows no unique index across partitions without the partition key;
``id`` still comes from one sequence.

The downgrade copies the rows archived in the day partitions back into
``outbox_archive_before`` and renames it back: it reads and writes what was archived since.

MariaDB (and MySQL) allow no partition key outside a unique key, and change partitioning by
copying the table: the primary key becomes ``(id, archived_at)`` and the table is partitioned
by ``RANGE COLUMNS (archived_at)`` in one ``ALTER TABLE``, which copies the archive once, its
writers waiting meanwhile (prune it first, as before 0002). ``p_before`` holds the rows before
today, a partition per day from today on follows, ``p_future`` the rows of days with no
partition. The downgrade copies it back to one table with the primary key ``(id)``.

SQLite: nothing changes; retention deletes rows there.
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

_CONSTRAINT = "ck_outbox_archive_before"
_INDEXES = ("handler_status", "archived_at", "group_id")
_DAYS_AHEAD = 3


def upgrade() -> None:
    from outbox._db.postgresql import partitions

    bind = op.get_bind()
    if bind.dialect.name in ("mysql", "mariadb"):
        _upgrade_mysql()
        return
    if bind.dialect.name != "postgresql":
        return
    op.execute(f"ALTER TABLE outbox_archive VALIDATE CONSTRAINT {_CONSTRAINT}")
    op.execute("ALTER TABLE outbox_archive RENAME TO outbox_archive_before")
    op.execute("ALTER INDEX pk_outbox_archive RENAME TO pk_outbox_archive_before")
    for index in _INDEXES:
        op.execute(
            f"ALTER INDEX ix_outbox_archive_{index} RENAME TO ix_outbox_archive_before_{index}"
        )
    op.execute(
        "CREATE TABLE outbox_archive (LIKE outbox_archive_before INCLUDING DEFAULTS "
        "INCLUDING COMMENTS) PARTITION BY RANGE (archived_at)"
    )
    op.execute("ALTER SEQUENCE outbox_archive_id_seq OWNED BY outbox_archive.id")
    op.execute("CREATE INDEX ix_outbox_archive_handler_status ON outbox_archive (handler, status)")
    op.execute("CREATE INDEX ix_outbox_archive_archived_at ON outbox_archive (archived_at)")
    op.execute("CREATE INDEX ix_outbox_archive_group_id ON outbox_archive (group_id)")
    bound = bind.exec_driver_sql(
        "SELECT (regexp_match(pg_get_constraintdef(oid), '''([^'']+)'''))[1]::timestamptz "
        "FROM pg_constraint WHERE conname = %(name)s",
        {"name": _CONSTRAINT},
    ).scalar_one()
    op.execute(
        "ALTER TABLE outbox_archive ATTACH PARTITION outbox_archive_before "
        f"FOR VALUES FROM (MINVALUE) TO ('{bound.isoformat()}')"
    )
    op.execute("CREATE TABLE outbox_archive_default PARTITION OF outbox_archive DEFAULT")
    op.execute("CREATE UNIQUE INDEX outbox_archive_default_id ON outbox_archive_default (id)")
    first = bound.astimezone(dt.UTC).date()
    for offset in range(_DAYS_AHEAD):
        partitions.make_day(bind, first + dt.timedelta(days=offset))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name in ("mysql", "mariadb"):
        op.execute(
            "ALTER TABLE outbox_archive DROP PRIMARY KEY, ADD PRIMARY KEY (id) "
            "REMOVE PARTITIONING"
        )
        return
    if bind.dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE outbox_archive DETACH PARTITION outbox_archive_before")
    # The rows archived since 0010 lie past the bound: the constraint goes, and comes back
    # as 0009 left it, checked for new rows only.
    op.execute(f"ALTER TABLE outbox_archive_before DROP CONSTRAINT {_CONSTRAINT}")
    op.execute("INSERT INTO outbox_archive_before SELECT * FROM outbox_archive")
    op.execute("ALTER SEQUENCE outbox_archive_id_seq OWNED BY outbox_archive_before.id")
    op.execute("DROP TABLE outbox_archive")
    op.execute("ALTER TABLE outbox_archive_before RENAME TO outbox_archive")
    op.execute("ALTER INDEX pk_outbox_archive_before RENAME TO pk_outbox_archive")
    for index in _INDEXES:
        op.execute(
            f"ALTER INDEX ix_outbox_archive_before_{index} RENAME TO ix_outbox_archive_{index}"
        )
    today = dt.datetime.now(dt.UTC).date()
    bound = dt.datetime.combine(today + dt.timedelta(days=2), dt.time(), dt.UTC)
    op.execute(
        f"ALTER TABLE outbox_archive ADD CONSTRAINT {_CONSTRAINT} "
        f"CHECK (archived_at < '{bound.isoformat()}') NOT VALID"
    )


def _upgrade_mysql() -> None:
    # The partition key must be in every unique key: the primary key becomes (id, archived_at),
    # in the same statement, so that the table is copied once.
    from outbox._db.mysql import partitions

    today = dt.datetime.now(dt.UTC).date()
    op.execute(
        "ALTER TABLE outbox_archive DROP PRIMARY KEY, ADD PRIMARY KEY (id, archived_at) "
        "PARTITION BY RANGE COLUMNS (archived_at) ("
        f"PARTITION {partitions.BEFORE} VALUES LESS THAN ('{today.isoformat()}'), "
        f"PARTITION {partitions.FUTURE} VALUES LESS THAN (MAXVALUE))"
    )
    for offset in range(_DAYS_AHEAD + 1):
        partitions.make_day(op.get_bind(), today + dt.timedelta(days=offset))
