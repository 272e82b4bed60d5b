"""The tables: orders (business rows) and the ``OrderPlaced`` buffer."""

from __future__ import annotations

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import BufferMixin


class Base(DeclarativeBase):
    """The application's declarative base: business tables and buffer tables alike."""


class Order(Base):
    """The business row: an order a customer placed."""

    __tablename__ = "celery_shop_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    total_cents: Mapped[int]


class OrderPlaced(BufferMixin, Base):
    """The event: written in the same transaction as its order, published to RabbitMQ."""

    __tablename__ = "celery_shop_order_placed"

    order_id: Mapped[int]
    customer: Mapped[str] = mapped_column(String(100))
    total_cents: Mapped[int]
