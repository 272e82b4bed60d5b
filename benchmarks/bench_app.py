"""The application the throughput benchmarks drain: one buffer, a no-op handler.

Steered by the environment: ``BENCH_BATCH_SIZE`` (default 1000), ``BENCH_ARCHIVE`` (1: archive
succeeded groups), ``BENCH_MAX_BATCHES`` (default 64).
"""

from __future__ import annotations

import os

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, Outbox, Urgency


class Base(DeclarativeBase):
    pass


class BenchEvent(BufferMixin, Base):
    __tablename__ = "bench_events"
    account_id: Mapped[int]
    kind: Mapped[str] = mapped_column(String(32))


app = Outbox()


@app.handler(
    BenchEvent,
    batch_size=int(os.environ.get("BENCH_BATCH_SIZE", "1000")),
    urgency=Urgency.HOUR,
    archive=os.environ.get("BENCH_ARCHIVE") == "1",
    max_batches=int(os.environ.get("BENCH_MAX_BATCHES", "64")),
)
def noop(batch: Batch[BenchEvent]) -> None:
    """Accept every event."""
