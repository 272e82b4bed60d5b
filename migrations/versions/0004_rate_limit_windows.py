"""Rate limits kept as exact sliding windows

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27 10:00:00.000000

``outbox_rate_limits.starts`` keeps the recent starts each limit's window counts, and
``starts_until`` when the last of them leaves it (so that idle rows are forgotten only once
their window has passed). Both are nullable and only added: workers of the previous version
go on reading and writing ``tat`` alone, which the new ones honour as the earliest next start.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.schema import timestamp

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "outbox_rate_limits",
        sa.Column(
            "starts",
            sa.Text(),
            nullable=True,
            comment="the recent starts the limit's window counts; NULL: none",
        ),
    )
    op.add_column(
        "outbox_rate_limits",
        sa.Column(
            "starts_until",
            timestamp(),
            nullable=True,
            comment="when the last of the recent starts leaves the window",
        ),
    )


def downgrade() -> None:
    with op.batch_alter_table("outbox_rate_limits") as batch:
        batch.drop_column("starts_until")
        batch.drop_column("starts")
