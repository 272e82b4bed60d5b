"""Operators ask a worker to drain or stop

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-15 10:00:00.000000

``outbox_workers.request`` and ``.requested_by``: what an operator asked of one worker
(``drain``: finish what it holds, take no more, exit; ``stop``: as SIGTERM), and who. Workers
run on other hosts: the request travels through the worker's own row, which it reads at each
heartbeat; each request is also recorded in ``outbox_operations``.

Only additions: an older worker never reads the columns and goes on as before (``outbox
workers drain`` and ``stop`` refuse to ask it).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

generation = 7
"""The schema generation this revision brings."""
workers_from = 1
"""The oldest worker generation that works correctly on it: all of them (only additions)."""

_ACTIONS = "replay, edit, discard, pause, resume, release, drain or stop"
_ACTIONS_BEFORE = "replay, edit, discard, pause, resume or release"


def upgrade() -> None:
    op.add_column(
        "outbox_workers",
        sa.Column(
            "request",
            sa.String(8),
            nullable=True,
            comment="what an operator asked of the worker: drain or stop; NULL: nothing",
        ),
    )
    op.add_column(
        "outbox_workers",
        sa.Column("requested_by", sa.String(200), nullable=True, comment="who asked it"),
    )
    _comment_actions(_ACTIONS, _ACTIONS_BEFORE)


def downgrade() -> None:
    _comment_actions(_ACTIONS_BEFORE, _ACTIONS)
    with op.batch_alter_table("outbox_workers") as batch:
        batch.drop_column("requested_by")
        batch.drop_column("request")


def _comment_actions(comment: str, existing: str) -> None:
    # SQLite keeps no comments: altering one there would copy the table.
    if op.get_context().dialect.name == "sqlite":
        return
    op.alter_column(
        "outbox_operations",
        "action",
        existing_type=sa.String(16),
        existing_nullable=False,
        comment=comment,
        existing_comment=existing,
    )
