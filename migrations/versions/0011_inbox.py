"""The inbox: the message ids a receiver has had an effect for

Revision ID: 0011
Revises: 0010
Create Date: 2027-01-20 10:00:00.000000

``outbox_inbox``: each row is a message id (as its sender sent it) that an inbox (``Outbox.inbox``)
recorded in the transaction of the message's effect, kept until ``expires_at``, the time it
was received plus the inbox's horizon. MariaDB keeps the inbox's name and the id as bytes,
compared exactly.

MariaDB also compares the ingest's idempotency keys exactly from here on
(``outbox_ingest_keys.key`` in the ``utf8mb4_nopad_bin`` collation, still text): "K" and "k",
or "k " and "k", were one key, and a batch holding both was refused.

Only an addition and a collation: workers of every generation go on as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from outbox._db.migration import folded_ingest_keys
from outbox.schema import EXACT_VARCHAR_200, db_now, timestamp

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

generation = 11
"""The schema generation this revision brings."""
workers_from = 1
"""The oldest worker generation that works correctly on it: all of them (only an addition)."""


def upgrade() -> None:
    op.create_table(
        "outbox_inbox",
        sa.Column(
            "inbox",
            sa.String(200).with_variant(mysql.VARBINARY(800), "mysql", "mariadb"),
            nullable=False,
        ),
        sa.Column(
            "message_id",
            sa.String(400).with_variant(mysql.VARBINARY(1600), "mysql", "mariadb"),
            nullable=False,
            comment="the sender's message id",
        ),
        sa.Column("received_at", timestamp(), server_default=db_now(), nullable=False),
        sa.Column(
            "expires_at",
            timestamp(),
            nullable=False,
            comment="received_at plus the inbox's horizon: pruned once past",
        ),
        sa.PrimaryKeyConstraint("inbox", "message_id", name="pk_outbox_inbox"),
    )
    op.create_index("ix_outbox_inbox_expires_at", "outbox_inbox", ["expires_at"])
    _ingest_key(EXACT_VARCHAR_200, sa.String(200))


def _ingest_key(to: sa.types.TypeEngine[str], existing: sa.types.TypeEngine[str]) -> None:
    if op.get_context().dialect.name not in ("mysql", "mariadb"):
        return
    op.alter_column(
        "outbox_ingest_keys",
        "key",
        type_=to,
        existing_type=existing,
        existing_nullable=False,
        existing_comment="the producer's idempotency key",
    )


def downgrade() -> None:
    # Keys the old collation takes for one another cannot all stay: the smallest of each does
    # (counted among the downgrade's losses beforehand).
    folded_ingest_keys(op.get_bind(), delete=True)
    _ingest_key(sa.String(200), EXACT_VARCHAR_200)
    op.drop_index("ix_outbox_inbox_expires_at", table_name="outbox_inbox")
    op.drop_table("outbox_inbox")
