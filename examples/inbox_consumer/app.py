"""A shop and its billing, across Redis Streams: the shop's orders go out through the outbox
and a Redis sink; billing consumes the stream into an inbox, so that each order is billed once
however many times its message arrives.

``place_order`` adds an ``Order`` and its ``OrderPlaced`` event in the caller's transaction;
the handler ``orders`` appends each event to the stream (at least once: a lost reply sends it
again, with the same ``id``). ``bill`` is billing's effect: it adds an ``Invoice`` per new
message, in the transaction in which the consumer records the messages' ids.

Run it with ``python -m examples.inbox_consumer.run`` (a Redis at ``REDIS_URL``, default
``redis://127.0.0.1:6379/0``).
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import BufferMixin, Outbox
from outbox.inbox.redis import Message
from outbox.sinks.redis import RedisStreamSink

HERE = Path(__file__).resolve().parent
DEFAULT_DATABASE_URL = f"sqlite:///{HERE / 'inbox_consumer.sqlite3'}"
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
STREAM = os.environ.get("EXAMPLE_STREAM", "shop-orders")


class Base(DeclarativeBase):
    """The application's declarative base."""


class Order(Base):
    """The shop's business row."""

    __tablename__ = "example_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    amount_cents: Mapped[int]


class OrderPlaced(BufferMixin, Base):
    """The shop's event: an order was placed."""

    __tablename__ = "example_order_placed"
    order_id: Mapped[int]
    amount_cents: Mapped[int]


class Invoice(Base):
    """Billing's row: one per order, whatever arrives twice."""

    __tablename__ = "example_invoices"
    order_id: Mapped[int] = mapped_column(primary_key=True)
    amount_cents: Mapped[int]


app = Outbox(os.environ.get("OUTBOX_DATABASE_URL", DEFAULT_DATABASE_URL))
# The shop's handler: each event appended to the stream, its message id in the ``id`` field.
app.handler(OrderPlaced, name="orders", batch_size=100)(RedisStreamSink(REDIS_URL, stream=STREAM))
# Billing's inbox: it keeps an id at least as long as the shop's handler may send it again.
billing_in = app.inbox("billing-orders", sender="orders")


def place_order(session: Session, order_id: int, customer: str, amount_cents: int) -> None:
    """Add an order and its event to the caller's transaction."""
    session.add(Order(id=order_id, customer=customer, amount_cents=amount_cents))
    session.add(OrderPlaced(order_id=order_id, amount_cents=amount_cents))


def bill(session: Session, messages: list[Message]) -> None:
    """Billing's effect: an invoice per new message, in the consumer's transaction (no
    commit here: the consumer commits, then acknowledges)."""
    for message in messages:
        placed = message.json()
        session.add(Invoice(order_id=placed["order_id"], amount_cents=placed["amount_cents"]))
