"""Order fan-out: one event written with each shipped order, handed to three consumers that
know nothing of each other: a search index, a partner's bulk API and an analytics store.

``ship`` marks an ``Order`` shipped and writes one ``OrderShipped`` event in the same
transaction. ``app.fanout`` copies each event into a buffer per consumer (``SearchCopy``,
``PartnerCopy``, ``AnalyticsCopy``, the same columns through ``ShipmentColumns``), in the
transaction that removes it from ``OrderShipped``; each copy is drained by its own handler,
with its own retries, pause and limits. The partner's API being down or paused holds back
neither the search index nor analytics.

Run it with ``python -m examples.order_fanout.run``.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import Batch, BufferMixin, Outbox, RetryPolicy

HERE = Path(__file__).resolve().parent
DEFAULT_DATABASE_URL = f"sqlite:///{HERE / 'order_fanout.sqlite3'}"


class Base(DeclarativeBase):
    """The application's declarative base."""


class Order(Base):
    """The business row."""

    __tablename__ = "fanout_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(20), default="placed")


class ShipmentColumns(BufferMixin):
    """The event's columns, shared by the buffer the application writes and its copies."""

    order_id: Mapped[int]
    carrier: Mapped[str] = mapped_column(String(40))


class OrderShipped(ShipmentColumns, Base):
    """The one buffer the application writes."""

    __tablename__ = "order_shipped_events"


class SearchCopy(ShipmentColumns, Base):
    __tablename__ = "order_shipped_search"


class PartnerCopy(ShipmentColumns, Base):
    __tablename__ = "order_shipped_partner"


class AnalyticsCopy(ShipmentColumns, Base):
    __tablename__ = "order_shipped_analytics"


app = Outbox(os.environ.get("OUTBOX_DATABASE_URL", DEFAULT_DATABASE_URL))
app.fanout(OrderShipped, to=[SearchCopy, PartnerCopy, AnalyticsCopy])

# What each consumer holds, by order id. In production: the index, the partner, the warehouse.
search_index: dict[int, str] = {}
partner_orders: list[int] = []
analytics_rows: list[int] = []
partner_down = {"calls left": 0}


def ship(session: Session, order_id: int, carrier: str) -> None:
    """The application's write path: the order and its one event, in the caller's transaction."""
    order = session.get_one(Order, order_id)
    order.status = "shipped"
    session.add(OrderShipped(order_id=order_id, carrier=carrier))


@app.handler(SearchCopy, batch_size=500)
def index_shipments(batch: Batch[SearchCopy]) -> None:
    for event in batch.events:
        search_index[event.order_id] = event.carrier


# The partner's bulk API takes 100 records a call and is sometimes down: its groups retry.
@app.handler(PartnerCopy, batch_size=100, retry=RetryPolicy(scale=0.0, base_delay=0.0, jitter=0.0))
def send_to_partner(batch: Batch[PartnerCopy]) -> None:
    if partner_down["calls left"] > 0:
        partner_down["calls left"] -= 1
        raise ConnectionError("partner API unreachable")
    partner_orders.extend(event.order_id for event in batch.events)


@app.handler(AnalyticsCopy, batch_size=1000)
def record_shipments(batch: Batch[AnalyticsCopy]) -> None:
    analytics_rows.extend(batch.ids)
