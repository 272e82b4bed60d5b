"""outbox tables

Revision ID: 0001
Revises:
Create Date: 2026-11-22 14:37:24.139350
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# The database clock, rendered per dialect (statement_timestamp() on PostgreSQL, strftime on
# SQLite), so one migration serves every supported database.
from outbox.schema import db_now

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outbox_archive",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("handler", sa.String(length=200), nullable=False),
        sa.Column(
            "buffer",
            sa.String(length=200),
            nullable=False,
            comment="the buffer table the event came from",
        ),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("group_id", sa.Uuid(), nullable=True),
        sa.Column(
            "status",
            sa.String(length=16),
            nullable=False,
            comment="succeeded, dead, expired or discarded",
        ),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "archived_at", sa.DateTime(timezone=True), server_default=db_now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox_archive")),
    )
    op.create_index(
        op.f("ix_outbox_archive_archived_at"), "outbox_archive", ["archived_at"], unique=False
    )
    op.create_index(
        op.f("ix_outbox_archive_group_id"), "outbox_archive", ["group_id"], unique=False
    )
    op.create_index(
        op.f("ix_outbox_archive_handler_status"),
        "outbox_archive",
        ["handler", "status"],
        unique=False,
    )
    op.create_table(
        "outbox_jobs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("kind", sa.String(length=8), nullable=False, comment="'claim' or 'batch'"),
        sa.Column("handler", sa.String(length=200), nullable=False),
        sa.Column(
            "slot", sa.SmallInteger(), nullable=True, comment="claim jobs: 0 .. max_batches - 1"
        ),
        sa.Column(
            "group_id", sa.Uuid(), nullable=True, comment="batch jobs: the group they handle"
        ),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("run_at", sa.DateTime(timezone=True), server_default=db_now(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_token", sa.Uuid(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=db_now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox_jobs")),
    )
    op.create_index(
        op.f("ix_outbox_jobs_lease_expires_at"), "outbox_jobs", ["lease_expires_at"], unique=False
    )
    op.create_index(
        "ix_outbox_jobs_ready",
        "outbox_jobs",
        ["priority", "run_at", "id"],
        unique=False,
        postgresql_where=sa.text("lease_token IS NULL"),
        sqlite_where=sa.text("lease_token IS NULL"),
    )
    op.create_index("uq_outbox_jobs_claim_slot", "outbox_jobs", ["handler", "slot"], unique=True)
    op.create_index("uq_outbox_jobs_group_id", "outbox_jobs", ["group_id"], unique=True)
    op.create_table(
        "outbox_workers",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column(
            "started_at", sa.DateTime(timezone=True), server_default=db_now(), nullable=False
        ),
        sa.Column(
            "heartbeat_at", sa.DateTime(timezone=True), server_default=db_now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox_workers")),
    )
    op.create_index(
        op.f("ix_outbox_workers_heartbeat_at"), "outbox_workers", ["heartbeat_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_outbox_workers_heartbeat_at"), table_name="outbox_workers")
    op.drop_table("outbox_workers")
    op.drop_index("uq_outbox_jobs_group_id", table_name="outbox_jobs")
    op.drop_index("uq_outbox_jobs_claim_slot", table_name="outbox_jobs")
    op.drop_index(
        "ix_outbox_jobs_ready",
        table_name="outbox_jobs",
        postgresql_where=sa.text("lease_token IS NULL"),
        sqlite_where=sa.text("lease_token IS NULL"),
    )
    op.drop_index(op.f("ix_outbox_jobs_lease_expires_at"), table_name="outbox_jobs")
    op.drop_table("outbox_jobs")
    op.drop_index(op.f("ix_outbox_archive_handler_status"), table_name="outbox_archive")
    op.drop_index(op.f("ix_outbox_archive_group_id"), table_name="outbox_archive")
    op.drop_index(op.f("ix_outbox_archive_archived_at"), table_name="outbox_archive")
    op.drop_table("outbox_archive")
