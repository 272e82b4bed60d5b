"""Timestamps to the microsecond on MariaDB and MySQL

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26 11:20:00.000000

MariaDB's and MySQL's plain DATETIME keeps whole seconds, which cut leases short by up to a
second; there every timestamp becomes DATETIME(6). Nothing changes on other databases.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy.dialects import mysql

from outbox._db.dialects import db_now

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# (table, column, nullable, set by the database clock)
TIMESTAMPS = (
    ("outbox_jobs", "run_at", False, True),
    ("outbox_jobs", "lease_expires_at", True, False),
    ("outbox_jobs", "created_at", False, True),
    ("outbox_archive", "created_at", True, False),
    ("outbox_archive", "archived_at", False, True),
    ("outbox_workers", "started_at", False, True),
    ("outbox_workers", "heartbeat_at", False, True),
)


def _alter(precision: int) -> None:
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return
    # One ALTER per table, all its columns in it: each ALTER that changes a column's type copies
    # the whole table, so one per column would copy outbox_archive twice. MODIFY restates the
    # whole column: its nullability and default are given again.
    type_ = mysql.DATETIME(fsp=precision).compile(dialect=bind.dialect)
    now = db_now().compile(dialect=bind.dialect)
    columns: dict[str, list[str]] = {}
    for table, column, nullable, clocked in TIMESTAMPS:
        spec = f"MODIFY {column} {type_} {'NULL' if nullable else 'NOT NULL'}"
        columns.setdefault(table, []).append(spec + (f" DEFAULT {now}" if clocked else ""))
    for table, specs in columns.items():
        op.execute(f"ALTER TABLE {table} {', '.join(specs)}")


def upgrade() -> None:
    _alter(6)


def downgrade() -> None:
    _alter(0)
