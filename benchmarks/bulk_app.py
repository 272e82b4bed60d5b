"""The application ``benchmarks.drain_rate_limited`` drains: one bulk call per group to the fake
bulk API at ``BULK_API_URL``, under a fleet-wide ``RateLimit`` of ``BULK_CALLS_PER_SECOND``,
``RetryAfter`` on a 429. Groups of ``BULK_BATCH_SIZE`` events. With ``BULK_ACCOUNT_CALLS`` (calls
a second), each account's groups (``group_by``) are also limited per account; with
``BULK_BURST``, the fleet's calls are spaced out (``RateLimit.burst``)."""

from __future__ import annotations

import os
import time

import httpx
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from examples.marketing_sync.fake_api import BULK_PATH
from outbox import Batch, BufferMixin, Outbox, RateLimit, RetryAfter

BATCH_SIZE = int(os.environ.get("BULK_BATCH_SIZE", "500"))
CALLS_PER_SECOND = float(os.environ.get("BULK_CALLS_PER_SECOND", "10"))
ACCOUNT_CALLS = int(os.environ.get("BULK_ACCOUNT_CALLS") or 0)
BURST = int(os.environ.get("BULK_BURST") or 0) or None
LIMITS = [RateLimit(calls_per_second=CALLS_PER_SECOND, burst=BURST)]
if ACCOUNT_CALLS:
    LIMITS.append(RateLimit(calls=ACCOUNT_CALLS, key="account"))


class Base(DeclarativeBase):
    """The bulk app's tables."""


class BulkEvent(BufferMixin, Base):
    """One record for the bulk API."""

    __tablename__ = "bench_bulk_events"
    email: Mapped[str] = mapped_column(String(100))
    account: Mapped[int] = mapped_column(default=0)


app = Outbox()
_client = httpx.Client(timeout=30)


@app.handler(
    BulkEvent,
    batch_size=BATCH_SIZE,
    rate_limit=LIMITS,
    group_by="account" if ACCOUNT_CALLS else None,
)
def send_bulk(batch: Batch[BulkEvent]) -> None:
    """One call per group; its group id is the idempotency key. With ``BULK_STARTS_FILE``, the
    Unix time of each call's start is appended to that file."""
    starts = os.environ.get("BULK_STARTS_FILE")
    if starts:
        with open(starts, "a", encoding="utf-8") as file:
            file.write(f"{time.time():.6f}\n")
    records = [{"id": str(row.id), "email": row.email} for row in batch.rows]
    response = _client.post(
        os.environ["BULK_API_URL"] + BULK_PATH,
        json={"records": records},
        headers={"Idempotency-Key": str(batch.group_id)},
    )
    if response.status_code == 429:
        raise RetryAfter(response.headers.get("Retry-After", "1"))
    response.raise_for_status()
