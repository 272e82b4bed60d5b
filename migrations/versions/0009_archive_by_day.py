"""The archive partitioned by day, its rows so far kept apart

Revision ID: 0009
Revises: 0008
Create Date: 2027-01-05 10:00:00.000000

PostgreSQL: under the lock a rename takes (catalogue changes only, milliseconds whatever the
archive's size), the archive is renamed ``outbox_archive_before`` with its indexes, recording
the cut (the database's clock) as a check constraint ``archived_at < cut``, ``NOT VALID``
(nothing writes to that table any more: the constraint can never refuse a row), and a table
partitioned by range of ``archived_at`` takes its place: its columns, defaults, id sequence
and indexes, a default partition, the cut's day from the cut on, and the next three days.
Writers go on into it at once. Revision 0010 attaches ``outbox_archive_before``: until then
the rows archived before the cut are kept but not read through ``outbox_archive``, so
``outbox migrate`` applies both, one after the other (docs/design.md, "Retention by day").

The primary key is per partition (a unique index on ``id`` in each): PostgreSQL allows no
unique index across partitions without the partition key; ``id`` still comes from one
sequence. The downgrade copies the rows archived since into ``outbox_archive_before`` and
renames it back.

MariaDB, MySQL and SQLite: nothing (revision 0010 partitions MariaDB's archive).

Workers of every generation write and read the archive as before: the same table name and
columns.
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

generation = 9
"""The schema generation this revision brings."""
workers_from = 1
"""The oldest worker generation that works correctly on it: all of them."""

_DAYS_AHEAD = 3


def upgrade() -> None:
    from outbox._db.postgresql import partitions

    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        partitions.split_archive(bind, _DAYS_AHEAD)


def downgrade() -> None:
    from outbox._db.postgresql import partitions

    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        partitions.unsplit_archive(bind)
