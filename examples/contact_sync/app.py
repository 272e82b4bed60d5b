"""Contact sync: a CRM receives each contact's latest state, once per sync, however many times
the contact changed since the last one.

``rename`` changes a ``Contact`` and, in the same transaction, writes a ``ContactChanged``
event carrying the state it left the contact in. ``sync_contacts`` is a coalescing handler
(``ordering_key="contact_id", coalesce=True``): each group hands it only the latest event of
each contact, and the events that one stands for are archived as ``superseded``. A contact
renamed ten times while the CRM was unreachable costs one record in the next bulk call, and
the CRM never receives an older name after a newer one.

Run it with ``python -m examples.contact_sync.run``.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import Batch, BufferMixin, Outbox

HERE = Path(__file__).resolve().parent
DEFAULT_DATABASE_URL = f"sqlite:///{HERE / 'contact_sync.sqlite3'}"


class Base(DeclarativeBase):
    """The application's declarative base."""


class Contact(Base):
    """The business row."""

    __tablename__ = "sync_contacts"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100))


class ContactChanged(BufferMixin, Base):
    """The buffer row: the state a change left the contact in."""

    __tablename__ = "contact_changed_events"

    contact_id: Mapped[int]
    name: Mapped[str] = mapped_column(String(100))


app = Outbox(os.environ.get("OUTBOX_DATABASE_URL", DEFAULT_DATABASE_URL))

# The CRM: contact id -> the name it holds, and each bulk call's size. In production, its API.
crm: dict[int, str] = {}
calls: list[int] = []


def rename(session: Session, contact_id: int, name: str) -> None:
    """The application's write path: the change and its event, in the caller's transaction.

    The contact's row is locked first (``FOR UPDATE``, which the update takes anyway on
    PostgreSQL and MariaDB): two renames of one contact then commit in the order of their
    events' ids, which is the order the coalescing handler relies on.
    """
    contact = session.scalars(
        select(Contact).where(Contact.id == contact_id).with_for_update()
    ).one()
    contact.name = name
    session.add(ContactChanged(contact_id=contact_id, name=name))


# The CRM's bulk API takes up to 1,000 records a call.
@app.handler(ContactChanged, batch_size=1000, ordering_key="contact_id", coalesce=True)
def sync_contacts(batch: Batch[ContactChanged]) -> None:
    """One bulk call per group, one record per contact: its latest state."""
    calls.append(len(batch))
    for event in batch.events:
        crm[event.contact_id] = event.name
