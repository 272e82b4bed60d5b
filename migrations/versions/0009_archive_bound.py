"""The archive's rows so far are bounded in time

Revision ID: 0009
Revises: 0008
Create Date: 2027-01-05 10:00:00.000000

PostgreSQL only: ``ck_outbox_archive_before``, ``archived_at`` before the start of the UTC day
after tomorrow (or of the day after the newest row's, if later), added ``NOT VALID``: the
constraint is recorded at once (a lock of a few milliseconds) and checked only for rows written
from now on. Revision 0010 validates it, which reads the archive without blocking its writers,
and then makes the table the first partition of a partitioned archive: the validated constraint
proves that its rows lie before that day, so attaching it reads nothing under lock
(docs/design.md, "Retention by day").

``outbox migrate`` applies 0009 and 0010 one after the other. The bound leaves at least a day
between them: a database left at 0009 past it refuses to archive (migrate to 0010, or down to
0008).

Only a constraint every row meets: workers of every generation keep working.
"""

from __future__ import annotations

import datetime as dt

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

generation = 9
"""The schema generation this revision brings."""
workers_from = 1
"""The oldest worker generation that works correctly on it: all of them."""


def upgrade() -> None:
    from outbox._db.postgresql import partitions

    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    today = dt.datetime.now(dt.UTC).date()
    partitions.bound_archive(
        bind, dt.datetime.combine(today + dt.timedelta(days=2), dt.time(), dt.UTC)
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE outbox_archive DROP CONSTRAINT IF EXISTS ck_outbox_archive_before")
