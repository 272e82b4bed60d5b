"""Flow control: handler states and deferred attempts

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26 14:40:00.000000

``outbox_handlers`` holds what the whole fleet must agree on about a handler: whether it is
paused (by an operator, a downstream's Retry-After or its circuit breaker), until when, and its
breaker's counts. ``outbox_rate_limits`` holds the state of each handler's shared rate limits.
``outbox_held_keys`` holds the ordering keys a dead group holds back.
``outbox_jobs.deferrals`` counts the attempts put off for a Retry-After, which do not use up
``attempts``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.schema import db_now, timestamp

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outbox_handlers",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column(
            "paused_at", timestamp(), nullable=True, comment="set while the handler is paused"
        ),
        sa.Column(
            "paused_until",
            timestamp(),
            nullable=True,
            comment="when the pause ends by itself; NULL while paused: until resumed",
        ),
        sa.Column(
            "pause_cause",
            sa.String(16),
            nullable=True,
            comment="operator, retry_after or breaker",
        ),
        sa.Column("pause_reason", sa.Text(), nullable=True),
        sa.Column(
            "failures",
            sa.Integer(),
            nullable=False,
            server_default=sa.text("0"),
            comment="consecutive failed groups (circuit breaker)",
        ),
        sa.Column(
            "trips",
            sa.Integer(),
            nullable=False,
            server_default=sa.text("0"),
            comment="consecutive openings of the circuit breaker; > 0 while it probes",
        ),
        sa.PrimaryKeyConstraint("name", name="pk_outbox_handlers"),
    )
    op.create_table(
        "outbox_rate_limits",
        sa.Column("handler", sa.String(200), nullable=False),
        sa.Column("key", sa.String(200), nullable=False, comment="'calls' or 'events'"),
        sa.Column(
            "tat",
            timestamp(),
            nullable=True,
            comment="the theoretical arrival time of the next call (GCRA); NULL: now",
        ),
        sa.PrimaryKeyConstraint("handler", "key", name="pk_outbox_rate_limits"),
    )
    op.create_table(
        "outbox_held_keys",
        sa.Column("handler", sa.String(200), nullable=False),
        sa.Column(
            "key", sa.String(400), nullable=False, comment="the ordering key's value, as text"
        ),
        sa.Column(
            "group_id", sa.Uuid(), nullable=False, comment="the dead group that holds the key"
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("held_at", timestamp(), server_default=db_now(), nullable=False),
        sa.PrimaryKeyConstraint("handler", "key", name="pk_outbox_held_keys"),
    )
    op.add_column(
        "outbox_jobs",
        sa.Column(
            "deferrals",
            sa.Integer(),
            nullable=False,
            server_default=sa.text("0"),
            comment="attempts put off for the downstream's Retry-After, not counted in attempts",
        ),
    )


def downgrade() -> None:
    with op.batch_alter_table("outbox_jobs") as batch:
        batch.drop_column("deferrals")
    op.drop_table("outbox_held_keys")
    op.drop_table("outbox_rate_limits")
    op.drop_table("outbox_handlers")
