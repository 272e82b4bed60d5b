"""The Flask-SQLAlchemy extension and the tables: products, orders, and the ``OrderPlaced`` buffer.

``db`` is made here, without an application: ``create_app`` binds it to each application it
builds (``db.init_app(app)``), the way Flask extensions are used with an app factory.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import DateTime, String, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import BufferMixin


class Base(DeclarativeBase):
    """The declarative base ``db.Model`` is built on: business tables and buffers alike."""


db = SQLAlchemy(model_class=Base)


class Product(db.Model):
    """What can be ordered, and how many are left."""

    __tablename__ = "flask_shop_products"

    sku: Mapped[str] = mapped_column(String(40), primary_key=True)
    stock: Mapped[int]


class Order(db.Model):
    """The business row: an order a customer placed."""

    __tablename__ = "flask_shop_orders"

    # Chosen by the application, so the event can carry it before anything is flushed.
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    sku: Mapped[str] = mapped_column(String(40))
    quantity: Mapped[int]
    country: Mapped[str] = mapped_column(String(2))
    placed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class OrderPlaced(BufferMixin, db.Model):
    """The buffer row: "tell the fulfilment service about this order".

    A ``db.Model`` like any other, so ``db.create_all()`` and the application's own migrations
    create it. ``BufferMixin`` adds ``id``, ``group_id``, ``created_at`` and the indexes outbox
    needs. The event carries everything the fulfilment call needs, so the handler reads no other
    table.
    """

    __tablename__ = "flask_order_placed_events"

    order_id: Mapped[uuid.UUID]
    customer: Mapped[str] = mapped_column(String(100))
    sku: Mapped[str] = mapped_column(String(40))
    quantity: Mapped[int]
    country: Mapped[str] = mapped_column(String(2))
