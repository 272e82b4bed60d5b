"""Two handlers, two promises: REALTIME fraud alerts next to a DAY analytics export.

The analytics buffer holds a large backlog; alerts keep arriving. Work is taken by band
priority first, and the analytics handler is capped at one group in flight fleet-wide, so the
backlog never delays an alert.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, Outbox, Urgency

DEFAULT_DATABASE_URL = f"sqlite:///{Path(__file__).with_name('timeliness.sqlite3')}"
EXPORT_SECONDS_PER_BATCH = 0.05
ALERT_SECONDS_PER_BATCH = 0.005


class Base(DeclarativeBase):
    pass


class FraudAlertEvent(BufferMixin, Base):
    """A card payment that looks wrong: someone must hear of it within a minute."""

    __tablename__ = "example_fraud_alert_events"
    payment_id: Mapped[int]


class AnalyticsEvent(BufferMixin, Base):
    """A page view for tomorrow's report: within a day is fine."""

    __tablename__ = "example_analytics_events"
    page: Mapped[str] = mapped_column(String(100))


app = Outbox(os.environ.get("OUTBOX_DATABASE_URL", DEFAULT_DATABASE_URL))
alert_ages: list[float] = []
exported: list[int] = []
_lock = threading.Lock()


@app.handler(FraudAlertEvent, batch_size=100, urgency=Urgency.REALTIME)
def page_on_call(batch: Batch[FraudAlertEvent]) -> None:
    """Send the alerts to the on-call pager in one call."""
    import datetime as dt

    now = dt.datetime.now(dt.UTC)
    time.sleep(ALERT_SECONDS_PER_BATCH)
    with _lock:
        alert_ages.extend(
            (now - e.created_at.replace(tzinfo=e.created_at.tzinfo or dt.UTC)).total_seconds()
            for e in batch.events
        )


@app.handler(AnalyticsEvent, batch_size=1000, urgency=Urgency.DAY, concurrency=1)
def export_page_views(batch: Batch[AnalyticsEvent]) -> None:
    """Upload a file of page views to the warehouse; one upload at a time, fleet-wide."""
    time.sleep(EXPORT_SECONDS_PER_BATCH)
    with _lock:
        exported.append(len(batch.events))
