"""Marketing sync: every contact activity reaches the marketing platform, 1,000 per API call.

The application records activities (a contact viewed the pricing page, opened an email, ...)
and, in the same transaction, one ``ContactActivityEvent`` row per activity in a buffer table.
``sync_marketing``, a ready-made bulk HTTP sink (``outbox.sinks.http``), receives those events
in groups of up to 1,000 and sends each group in ONE bulk HTTP call: 100,000 activities cost 100
calls instead of 100,000 jobs, and stay far below the platform's rate limit. The application
writes only the request body (``activity_records``).

Run it with ``python examples/marketing_sync/run.py``, or drain the buffer with the CLI:
``outbox --app examples.marketing_sync.app:app work --burst``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import DateTime, ForeignKey, String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import BufferMixin, Outbox, RateLimit, RetryPolicy, Urgency
from outbox.sinks.http import BulkHTTPSink, StatusList

HERE = Path(__file__).resolve().parent
DEFAULT_DATABASE_URL = f"sqlite:///{HERE / 'marketing_sync.sqlite3'}"

MARKETING_API_URL_ENV = "MARKETING_API_URL"
# Where `python -m examples.marketing_sync.fake_api` listens by default.
DEFAULT_MARKETING_API_URL = "http://127.0.0.1:8025"
BULK_PATH = "/v1/activities/bulk"
# The platform accepts at most 1,000 records per call: the handler's batch_size matches it.
API_MAX_RECORDS = 1000
API_TIMEOUT_SECONDS = 30.0
# The platform's documented limit is 5 calls a second; the fleet keeps a little under it.
API_CALLS_PER_SECOND = 5
FLEET_CALLS_PER_SECOND = 4.5


class Base(DeclarativeBase):
    """The application's declarative base: business tables and buffer tables alike."""


class Contact(Base):
    """A person the marketing platform knows about."""

    __tablename__ = "marketing_contacts"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    # Contacts who signed up by phone have no email; the platform refuses their activities.
    email: Mapped[str | None] = mapped_column(String(320))


class ContactActivity(Base):
    """The business row: something a contact did."""

    __tablename__ = "marketing_contact_activities"

    # Chosen by the application, so the event can point at it before anything is flushed.
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    contact_id: Mapped[int] = mapped_column(ForeignKey("marketing_contacts.id"))
    kind: Mapped[str] = mapped_column(String(40))
    occurred_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class ContactActivityEvent(BufferMixin, Base):
    """The buffer row: "tell the marketing platform about this activity".

    ``BufferMixin`` adds ``id``, ``group_id``, ``created_at`` and the indexes outbox needs.
    The event carries what the API call needs and nothing secret: rows of failed groups are
    kept in ``outbox_archive``.
    """

    __tablename__ = "contact_activity_events"

    activity_id: Mapped[uuid.UUID]
    contact_id: Mapped[int]
    kind: Mapped[str] = mapped_column(String(40))


# The URL comes from OUTBOX_DATABASE_URL (the CLI's --database-url replaces it); by default, a
# SQLite file next to this module.
app = Outbox(os.environ.get("OUTBOX_DATABASE_URL", DEFAULT_DATABASE_URL))


def record_activities(session: Session, contact_id: int, kinds: Iterable[str]) -> list[uuid.UUID]:
    """The application's write path: activities and their events, in the caller's transaction.

    Nothing is committed here. The events exist if and only if the caller's transaction commits,
    so the marketing platform never hears of an activity that was rolled back, and never misses
    one that was committed.
    """
    ids = []
    for kind in kinds:
        activity = ContactActivity(id=uuid.uuid4(), contact_id=contact_id, kind=kind)
        session.add(activity)
        session.add(ContactActivityEvent(activity_id=activity.id, contact_id=contact_id, kind=kind))
        ids.append(activity.id)
    return ids


def marketing_api_url() -> str:
    """The bulk API's base URL, read at call time so a worker can be pointed anywhere."""
    return os.environ.get(MARKETING_API_URL_ENV, DEFAULT_MARKETING_API_URL)


def activity_records(events: Sequence[ContactActivityEvent]) -> dict[str, Any]:
    """The request body for one group: the platform's records, the contacts' emails looked up
    in one query for the whole group."""
    emails = _emails_of({event.contact_id for event in events})
    return {
        "records": [
            {
                "id": str(event.activity_id),
                "contact_id": event.contact_id,
                "email": emails.get(event.contact_id),
                "kind": event.kind,
                "occurred_at": event.created_at.isoformat(),
            }
            for event in events
        ]
    }


HANDLER_NAME = "sync_marketing"

# The ready-made bulk HTTP sink sends each group in ONE call, with the group id as its
# Idempotency-Key: a group's events never change, so every attempt at it is the same request,
# and after a crash between the call and outbox's bookkeeping the platform answers the repeat
# without applying it twice. It maps the answer onto outbox's outcomes: a 429 makes the handler
# wait as long as the platform says, on every worker (without using an attempt); a 5xx or a
# timeout fails the attempt (backoff, and the breaker); a 400 refusing the whole call is the
# data's fault, and with bisect=True the group is retried in halves until the bad record is
# alone; a record refused on its own (the platform lists each record's status) is discarded,
# archived with the platform's reason, while the rest of the group succeeds.
sync_marketing = BulkHTTPSink(
    lambda events: marketing_api_url() + BULK_PATH,
    allowed_hosts=[httpx.URL(marketing_api_url()).host],
    body=activity_records,
    result=StatusList(),
    timeout=API_TIMEOUT_SECONDS,
)

app.handler(
    ContactActivityEvent,
    name=HANDLER_NAME,
    batch_size=API_MAX_RECORDS,
    urgency=Urgency.HOUR,  # marketing can wait an hour; signups and payments go first
    retry=RetryPolicy(max_attempts=8),  # 6 s, 21 s, 86 s, ... about 1.3 h before giving up
    # Every worker of every process together: no more calls than the platform allows.
    rate_limit=RateLimit(calls_per_second=FLEET_CALLS_PER_SECOND),
    # A call the platform refuses whole (one record it cannot read) is retried in halves,
    # until the bad record is alone and the others are delivered.
    bisect=True,
)(sync_marketing)


def _emails_of(contact_ids: set[int]) -> dict[int, str | None]:
    """The current email of each contact, in one query for the whole group.

    The handler runs with no outbox transaction open; this short read is its own.
    """
    with Session(app.engine) as session:
        rows = session.execute(select(Contact.id, Contact.email).where(Contact.id.in_(contact_ids)))
        return {contact_id: email for contact_id, email in rows}
