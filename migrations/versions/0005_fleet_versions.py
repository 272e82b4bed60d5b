"""A fleet knows its versions

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 10:00:00.000000

``outbox_workers.version`` and ``.generation``: each worker records its outbox version and the
schema generation it understands (NULL: a worker older than this revision, which goes on
inserting its rows without them). ``outbox_schema`` holds one row: the generation the database
is at and ``workers_from``, the oldest worker generation that may work on it; each run of the
migrations rewrites it from the revision it ends at (``generation`` and ``workers_from`` below),
so that a worker too old for the schema can tell, without a revision script it does not ship.
Only additions: every older worker works on this schema as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.schema import db_now, timestamp

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

generation = 5
"""The schema generation this revision brings."""
workers_from = 1
"""The oldest worker generation that works correctly on it: all of them (only additions)."""


def upgrade() -> None:
    op.add_column(
        "outbox_workers",
        sa.Column(
            "version",
            sa.String(64),
            nullable=True,
            comment="the worker's outbox version; NULL: a worker older than outbox 0.2",
        ),
    )
    op.add_column(
        "outbox_workers",
        sa.Column(
            "generation",
            sa.Integer(),
            nullable=True,
            comment="the schema generation the worker understands; NULL: older than 5",
        ),
    )
    op.create_table(
        "outbox_schema",
        sa.Column(
            "id", sa.SmallInteger(), autoincrement=False, nullable=False, comment="1: one row"
        ),
        sa.Column(
            "generation",
            sa.Integer(),
            nullable=False,
            comment="the schema generation the database is at: its newest migration's number",
        ),
        sa.Column(
            "workers_from",
            sa.Integer(),
            nullable=False,
            comment="the oldest worker generation that may work on it; older ones stop",
        ),
        sa.Column("migrated_at", timestamp(), server_default=db_now(), nullable=False),
        sa.Column(
            "migrated_by", sa.String(64), nullable=True, comment="the outbox version that migrated"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_outbox_schema"),
    )


def downgrade() -> None:
    op.drop_table("outbox_schema")
    with op.batch_alter_table("outbox_workers") as batch:
        batch.drop_column("generation")
        batch.drop_column("version")
