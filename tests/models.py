"""Buffer models the tests use."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from sqlalchemy import JSON, DateTime, Index, Numeric, String, Uuid, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import BufferMixin, FlaggedRowsMixin


class Base(DeclarativeBase):
    pass


class Order(Base):
    """A business row written next to events."""

    __tablename__ = "test_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(String(64))


class ActivityEvent(BufferMixin, Base):
    __tablename__ = "test_activity_events"
    activity_id: Mapped[int]
    kind: Mapped[str] = mapped_column(String(32), default="viewed")


class ContactChange(BufferMixin, Base):
    """A contact's state, coalesced at write time on ``contact_id``."""

    __tablename__ = "test_contact_changes"
    __table_args__ = (
        *BufferMixin.buffer_indexes("test_contact_changes", coalesce_on="contact_id"),
        BufferMixin.buffer_options(),
    )
    contact_id: Mapped[int]
    version: Mapped[int]


class EmailEvent(BufferMixin, Base):
    __tablename__ = "test_email_events"
    address: Mapped[str] = mapped_column(String(200))
    data: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)


class SinkEvent(BufferMixin, Base):
    """What the sinks send: columns of several types, whose values must arrive intact."""

    __tablename__ = "test_sink_events"
    account: Mapped[str] = mapped_column(String(40))
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    note: Mapped[str | None] = mapped_column(String(200), nullable=True)
    data: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)
    ref: Mapped[uuid.UUID] = mapped_column(Uuid())


class _ShipmentColumns(BufferMixin):
    """The columns of a shipment event, shared by its source buffer and its consumers'."""

    shipment_id: Mapped[int]
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    data: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)


class ShipmentEvent(_ShipmentColumns, Base):
    """The buffer the application writes, fanned out to the three below."""

    __tablename__ = "test_shipment_events"


class ShipmentSearch(_ShipmentColumns, Base):
    __tablename__ = "test_shipment_search"


class ShipmentPartner(_ShipmentColumns, Base):
    __tablename__ = "test_shipment_partner"


class ShipmentAnalytics(_ShipmentColumns, Base):
    __tablename__ = "test_shipment_analytics"


class Employee(Base):
    """A business table with a flag ("Using your database as a queue"): the application sets
    ``needs_work_done`` and bumps ``version`` with every change."""

    __tablename__ = "test_employees"
    __table_args__ = (
        Index(
            "ix_test_employees_flagged",
            "id",
            postgresql_where=text("needs_work_done"),
            sqlite_where=text("needs_work_done"),
        ),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    needs_work_done: Mapped[bool] = mapped_column(default=False)
    version: Mapped[int] = mapped_column(default=1)
    # A flag that is its own version: the time of the change that needs work, NULL when none.
    changed_at: Mapped[datetime | None] = mapped_column(DateTime(), nullable=True)


class EmployeeWork(FlaggedRowsMixin, Base):
    """The buffer of the employees' flag handler: outbox writes it, the application never."""

    __tablename__ = "test_employee_work"


class EmployeeChanges(FlaggedRowsMixin, Base):
    """The buffer of a flag handler on ``Employee.changed_at``."""

    __tablename__ = "test_employee_changes"
