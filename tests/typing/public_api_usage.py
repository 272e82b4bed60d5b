"""The public API as an application uses it; `mypy --strict` must accept this file as is."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import String
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import (
    Batch,
    BufferMixin,
    ConfigurationError,
    Outbox,
    OutboxError,
    RetryPolicy,
    Settings,
    Urgency,
    add_events,
    add_events_async,
)
from outbox.metrics import HandlerStatus, collect
from outbox.testing import DrainResult, drain
from outbox.worker import Worker


class Base(DeclarativeBase):
    pass


class ContactActivityEvent(BufferMixin, Base):
    __tablename__ = "typing_contact_activity_events"
    activity_id: Mapped[int]
    email: Mapped[str] = mapped_column(String(200))


app = Outbox("sqlite:///typing.sqlite3", settings=Settings(lease_seconds=30.0))
NIGHTLY = Urgency("NIGHTLY", priority=35, promise=43200.0)


@app.handler(
    ContactActivityEvent,
    batch_size=1000,
    urgency=Urgency.HOUR,
    retry=RetryPolicy(max_attempts=8),
    archive=False,
)
def sync_marketing(batch: Batch[ContactActivityEvent]) -> None:
    ids: list[int] = [e.activity_id for e in batch.events]
    key: tuple[uuid.UUID, int] = (batch.group_id, batch.attempt)
    bad = [e for e in batch.events if "@" not in e.email]
    batch.discard(bad, "no email address")
    batch.retry([e for e in batch.events if e.activity_id < 0], "rejected for now")
    del ids, key


class ContactEmailEvent(BufferMixin, Base):
    __tablename__ = "typing_contact_email_events"
    email: Mapped[str] = mapped_column(String(200))


@app.handler(ContactEmailEvent, batch_size=500, timeout=30.0)
async def push_emails(batch: Batch[ContactEmailEvent]) -> None:
    await asyncio.sleep(0)
    addresses: list[str] = [e.email for e in batch.events]
    batch.discard([e for e in batch.events if "@" not in e.email], "no email address")
    del addresses


def test_push_emails_directly(batch: Batch[ContactEmailEvent]) -> None:
    # The decorated function keeps its own type: still a coroutine function.
    asyncio.run(push_emails(batch))


def write(session: Session) -> int:
    session.add(ContactActivityEvent(activity_id=1, email="a@example.com"))
    return add_events(session, ContactActivityEvent, [{"activity_id": 2, "email": "b@x.org"}])


async def write_async(session: AsyncSession, conn: AsyncConnection) -> int:
    session.add(ContactActivityEvent(activity_id=3, email="c@example.com"))
    rows = [{"activity_id": 4, "email": "d@x.org"}]
    return await add_events_async(session, ContactActivityEvent, rows) + await add_events_async(
        conn, ContactActivityEvent, rows
    )


async_app = Outbox(engine=create_async_engine("postgresql+asyncpg://app@db/shop"))


def operate() -> None:
    result: DrainResult = drain(app)
    statuses: list[HandlerStatus] = collect(app)
    worker = Worker(app, concurrency=4, burst=True)
    clean: bool = worker.run()
    delay: float = RetryPolicy().delay(3)
    try:
        app.get_handler("nope")
    except ConfigurationError as error:
        root: OutboxError = error
        del root
    del result, statuses, clean, delay
