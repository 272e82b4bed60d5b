"""The shop each host runs: two handlers whose batches log at INFO and at WARNING.

``welcome`` succeeds (``outbox.batch.handled`` at INFO); ``invoice`` fails its first attempt
(at WARNING, ``outcome=retrying``; the retry is due later, so a burst run ends before it). A
claim logs ``outbox.group.claimed`` at DEBUG. ``run_burst`` is what each host calls: a worker in
burst mode, the public way to run everything due now from inside another process.
"""

from __future__ import annotations

import logging
import os

from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import Batch, BufferMixin, Outbox, RetryPolicy, schema
from outbox.worker import Worker

log = logging.getLogger(__name__)

DATABASE_URL_ENV = "SHOP_DATABASE_URL"
# The retry is an hour away: nothing of it is due in the run that failed.
LATER = RetryPolicy(max_attempts=3, base_delay=3600.0, jitter=0.0)


class Base(DeclarativeBase):
    """The shop's declarative base."""


class Signup(BufferMixin, Base):
    """A signup to welcome."""

    __tablename__ = "host_signups"

    email: Mapped[str] = mapped_column(String(100))


class Invoice(BufferMixin, Base):
    """An invoice to send to a billing service that is down."""

    __tablename__ = "host_invoices"

    amount: Mapped[int]


outbox = Outbox(os.environ.get(DATABASE_URL_ENV, "sqlite://"))


@outbox.handler(Signup)
def welcome(batch: Batch[Signup]) -> None:
    """Succeeds."""


@outbox.handler(Invoice, retry=LATER)
def invoice(batch: Batch[Invoice]) -> None:
    """Fails: the billing service is down."""
    raise RuntimeError("billing service unavailable")


def create(url: str, signups: int = 2, invoices: int = 1) -> None:
    """The shop's and outbox's tables on ``url``, with events waiting."""
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    schema.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add_all(Signup(email=f"user{n}@example.com") for n in range(signups))
        session.add_all(Invoice(amount=n) for n in range(invoices))
    engine.dispose()


def run_burst() -> dict[str, int]:
    """Handle everything due now, as a worker in burst mode; the groups that succeeded and
    the groups that will be retried."""
    worker = Worker(outbox, concurrency=1, burst=True)
    worker.run()
    return {"succeeded": worker.stats.groups_succeeded, "retried": worker.stats.groups_retried}
