"""Distribution ticks and the Apdex counts

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-29 10:00:00.000000

``outbox_handlers.distributed_tick``: the newest distribution tick taken for the handler. A
caller distributing on a schedule (cron, three Celery beats, the fleet's leader) takes the tick
by moving the column forward in one conditional UPDATE; the callers that lose on the same tick
learn it from the row count and distribute nothing, so any number of schedulers may call.

``outbox_throughput.satisfied`` and ``.tolerating``: of the events handled in the minute, how
many within their band's promise, and how many within four times it (Apdex).
``outbox_throughput.busy_seconds``: the seconds worker slots spent running the handler's groups
in the minute, so that the rate of one slot (desired workers) is what was handled over the time
spent handling it, however many slots sat idle.

Only additions: an older worker never reads or writes the columns (its events count in neither
Apdex column, its minutes have no busy time, and its distributions take no tick).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

generation = 8
"""The schema generation this revision brings."""
workers_from = 1
"""The oldest worker generation that works correctly on it: all of them (only additions)."""


def upgrade() -> None:
    op.add_column(
        "outbox_handlers",
        sa.Column(
            "distributed_tick",
            sa.BigInteger,
            nullable=True,
            comment="the newest distribution tick taken for the handler; NULL: none yet",
        ),
    )
    for column, comment in _APDEX.items():
        op.add_column(
            "outbox_throughput",
            sa.Column(
                column, sa.BigInteger, nullable=False, server_default=sa.text("0"), comment=comment
            ),
        )
    op.add_column(
        "outbox_throughput",
        sa.Column(
            "busy_seconds",
            sa.Double,
            nullable=False,
            server_default=sa.text("0"),
            comment="seconds worker slots spent running this handler's groups in the minute",
        ),
    )


def downgrade() -> None:
    with op.batch_alter_table("outbox_throughput") as batch:
        batch.drop_column("busy_seconds")
        for column in reversed(list(_APDEX)):
            batch.drop_column(column)
    with op.batch_alter_table("outbox_handlers") as batch:
        batch.drop_column("distributed_tick")


_APDEX = {
    "satisfied": "events handled within their band's promise",
    "tolerating": "events handled later than their band's promise, within four times it",
}
