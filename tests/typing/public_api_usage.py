"""The public API as an application uses it; `mypy --strict` must accept this file as is."""

from __future__ import annotations

import uuid

from sqlalchemy import String
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


def write(session: Session) -> int:
    session.add(ContactActivityEvent(activity_id=1, email="a@example.com"))
    return add_events(session, ContactActivityEvent, [{"activity_id": 2, "email": "b@x.org"}])


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
