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
    if op.get_bind().dialect.name != "mysql":
        return
    for table, column, nullable, clocked in TIMESTAMPS:
        # MODIFY restates the whole column: its nullability and default must be given again.
        op.alter_column(
            table,
            column,
            type_=mysql.DATETIME(fsp=precision),
            existing_nullable=nullable,
            existing_server_default=db_now() if clocked else None,
        )


def upgrade() -> None:
    _alter(6)


def downgrade() -> None:
    _alter(0)
