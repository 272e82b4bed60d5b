"""Operators' records: attempts, operations, replays kept

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-08 10:00:00.000000

``outbox_attempts``: each attempt of a group that did not end in success (failed, dead,
deferred, lease expired, refused), with its worker and its error, for ``outbox show``.
``outbox_operations``: each replay, edit and discard an operator made: who, when, which filter,
how many. ``outbox_throughput``: events handled per handler and minute, for the dashboard's
charts. ``outbox_ingest_keys``: the idempotency keys of events written over HTTP, so that a
producer's retry writes nothing twice. ``outbox_archive.operation_id`` and
``.replay_event_id``: a replayed event stays in the archive, marked ``replayed``, pointing at
the operation and at the event it became.

Only additions: older workers go on as before (they record no attempts, and an older ``outbox
replay`` deletes the rows it replays, as it always did).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.schema import db_now, timestamp

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

generation = 6
"""The schema generation this revision brings."""
workers_from = 1
"""The oldest worker generation that works correctly on it: all of them (only additions)."""

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "outbox_attempts",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("handler", sa.String(200), nullable=False),
        sa.Column("group_id", sa.Uuid(), nullable=False),
        sa.Column(
            "attempt", sa.Integer(), nullable=False, comment="the group's attempts when it ended"
        ),
        sa.Column(
            "outcome",
            sa.String(16),
            nullable=False,
            comment="failed, dead, deferred, lease_expired or refused",
        ),
        sa.Column(
            "worker",
            sa.String(200),
            nullable=True,
            comment="the worker that held it; NULL: not known",
        ),
        sa.Column("error", sa.Text(), nullable=True, comment="type, message and traceback"),
        sa.Column("finished_at", timestamp(), server_default=db_now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_outbox_attempts"),
    )
    op.create_index("ix_outbox_attempts_group_id", "outbox_attempts", ["group_id"])
    op.create_index("ix_outbox_attempts_finished_at", "outbox_attempts", ["finished_at"])
    op.create_table(
        "outbox_operations",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column(
            "action",
            sa.String(16),
            nullable=False,
            comment="replay, edit, discard, pause, resume or release",
        ),
        sa.Column(
            "actor",
            sa.String(200),
            nullable=False,
            comment="who did it: user@host, or a login",
        ),
        sa.Column(
            "selection", sa.Text(), nullable=True, comment="the filter it was given, as JSON"
        ),
        sa.Column("groups", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("events", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("done_at", timestamp(), server_default=db_now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_outbox_operations"),
    )
    op.create_index("ix_outbox_operations_done_at", "outbox_operations", ["done_at"])
    op.create_table(
        "outbox_ingest_keys",
        sa.Column("handler", sa.String(200), nullable=False),
        sa.Column("key", sa.String(200), nullable=False, comment="the producer's idempotency key"),
        sa.Column(
            "event_id",
            sa.BigInteger(),
            nullable=False,
            comment="the event it wrote, in its buffer",
        ),
        sa.Column("received_at", timestamp(), server_default=db_now(), nullable=False),
        sa.PrimaryKeyConstraint("handler", "key", name="pk_outbox_ingest_keys"),
    )
    op.create_index("ix_outbox_ingest_keys_received_at", "outbox_ingest_keys", ["received_at"])
    op.create_table(
        "outbox_throughput",
        sa.Column("handler", sa.String(200), nullable=False),
        sa.Column("minute", timestamp(), nullable=False, comment="the minute counted, UTC"),
        sa.Column("succeeded", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("dead", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "failed", sa.BigInteger(), server_default=sa.text("0"), nullable=False, comment="groups"
        ),
        sa.PrimaryKeyConstraint("handler", "minute", name="pk_outbox_throughput"),
    )
    op.add_column(
        "outbox_archive",
        sa.Column(
            "operation_id",
            sa.BigInteger(),
            nullable=True,
            comment="the operation (outbox_operations) that replayed or discarded it",
        ),
    )
    op.add_column(
        "outbox_archive",
        sa.Column(
            "replay_event_id",
            sa.BigInteger(),
            nullable=True,
            comment="the id of the event a replay made of it, in its buffer",
        ),
    )
    _comment_status(
        "succeeded, dead, expired, discarded or replayed", "succeeded, dead, expired or discarded"
    )


def downgrade() -> None:
    # Rows marked replayed were put back into their buffers: below this revision the archive
    # holds no such status, and an older replay would send them again.
    op.execute(sa.text("DELETE FROM outbox_archive WHERE status = 'replayed'"))
    _comment_status(
        "succeeded, dead, expired or discarded", "succeeded, dead, expired, discarded or replayed"
    )
    with op.batch_alter_table("outbox_archive") as batch:
        batch.drop_column("replay_event_id")
        batch.drop_column("operation_id")
    op.drop_table("outbox_throughput")
    op.drop_index("ix_outbox_ingest_keys_received_at", table_name="outbox_ingest_keys")
    op.drop_table("outbox_ingest_keys")
    op.drop_index("ix_outbox_operations_done_at", table_name="outbox_operations")
    op.drop_table("outbox_operations")
    op.drop_index("ix_outbox_attempts_finished_at", table_name="outbox_attempts")
    op.drop_index("ix_outbox_attempts_group_id", table_name="outbox_attempts")
    op.drop_table("outbox_attempts")


def _comment_status(comment: str, existing: str) -> None:
    # SQLite keeps no comments: altering one there would copy the whole archive table.
    if op.get_context().dialect.name == "sqlite":
        return
    op.alter_column(
        "outbox_archive",
        "status",
        existing_type=sa.String(16),
        existing_nullable=False,
        comment=comment,
        existing_comment=existing,
    )
