"""The tables: products and orders (business rows), and the ``OrderPlaced`` buffer."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import DateTime, String, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import BufferMixin


class Base(DeclarativeBase):
    """The application's declarative base: business tables and buffer tables alike."""


class Product(Base):
    """What can be ordered, and how many are left."""

    __tablename__ = "shop_products"

    sku: Mapped[str] = mapped_column(String(40), primary_key=True)
    stock: Mapped[int]


class Order(Base):
    """The business row: an order a customer placed."""

    __tablename__ = "shop_orders"

    # Chosen by the application, so the event can carry it before anything is flushed.
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    sku: Mapped[str] = mapped_column(String(40))
    quantity: Mapped[int]
    country: Mapped[str] = mapped_column(String(2))
    placed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class OrderPlaced(BufferMixin, Base):
    """The buffer row: "tell the fulfilment service about this order".

    ``BufferMixin`` adds ``id``, ``group_id``, ``created_at`` and the indexes outbox needs. The
    event carries everything the fulfilment call needs, so the handler reads no other table.
    """

    __tablename__ = "order_placed_events"

    order_id: Mapped[uuid.UUID]
    customer: Mapped[str] = mapped_column(String(100))
    sku: Mapped[str] = mapped_column(String(40))
    quantity: Mapped[int]
    country: Mapped[str] = mapped_column(String(2))
