"""Signup with email confirmation: the user and "send the confirmation email" commit together.

``sign_up`` adds a ``User`` and an ``EmailConfirmationEvent`` to the caller's session. Both rows
are written by the same COMMIT, so there is no window in which a user exists without their
email on its way (commit, then crash before enqueueing), and no email for a user who was never
created (enqueue, then the INSERT fails, e.g. on a duplicate email). ``send_confirmation_emails``
sends the pending emails in bulk: one provider call for up to 500 of them.

Run it with ``python examples/signup_email/run.py``.
"""

from __future__ import annotations

import os
import secrets
import uuid
from datetime import datetime
from pathlib import Path

from sqlalchemy import DateTime, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from examples.signup_email.mailer import MAX_MESSAGES_PER_CALL, FakeMailer, Message
from outbox import Batch, BufferMixin, Outbox, Urgency

HERE = Path(__file__).resolve().parent
DEFAULT_DATABASE_URL = f"sqlite:///{HERE / 'signup_email.sqlite3'}"
CONFIRM_URL = "https://app.example.com/confirm"


class Base(DeclarativeBase):
    """The application's declarative base."""


class User(Base):
    """The business row. Email addresses are unique: a second signup with one fails."""

    __tablename__ = "signup_users"

    # Chosen by the application, so the event can point at the user without a flush.
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    name: Mapped[str] = mapped_column(String(100))
    confirmation_token: Mapped[str] = mapped_column(String(64))
    confirmed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class EmailConfirmationEvent(BufferMixin, Base):
    """The buffer row: "send this user their confirmation email".

    Only the user's id: the token stays in the users table, never in the buffer or the archive,
    and the handler reads the user as they are when the email goes out.
    """

    __tablename__ = "email_confirmation_events"

    user_id: Mapped[uuid.UUID]


app = Outbox(os.environ.get("OUTBOX_DATABASE_URL", DEFAULT_DATABASE_URL))

# The email provider's client. Here a fake that records messages; in production, e.g. Postmark.
mailer = FakeMailer()


def sign_up(session: Session, email: str, name: str) -> User:
    """The application's write path: a user and their confirmation email's event.

    Nothing is flushed or committed here. If the caller's transaction fails (a duplicate email
    violates the unique constraint at COMMIT), both rows vanish together.
    """
    user = User(
        id=uuid.uuid4(),
        email=email,
        name=name,
        confirmation_token=secrets.token_urlsafe(24),
    )
    session.add(user)
    session.add(EmailConfirmationEvent(user_id=user.id))
    return user


@app.handler(
    EmailConfirmationEvent,
    batch_size=MAX_MESSAGES_PER_CALL,
    urgency=Urgency.REALTIME,  # someone is waiting for this email: the most urgent band
)
def send_confirmation_emails(batch: Batch[EmailConfirmationEvent]) -> None:
    """Send the confirmation emails of one group in one provider call.

    Raising (the provider is down) retries the whole group with backoff; the same
    ``(group_id, attempt)`` key makes a repeat of this very call send nothing twice.
    """
    user_ids = [event.user_id for event in batch.events]
    with Session(app.engine) as session:
        # Users who confirmed meanwhile (or were deleted) need no email: their events succeed.
        users = session.scalars(
            select(User).where(User.id.in_(user_ids), User.confirmed_at.is_(None))
        ).all()
        messages = [
            Message(
                to=user.email,
                subject="Confirm your email address",
                body=f"Hello {user.name},\n\nconfirm your address: "
                f"{CONFIRM_URL}?token={user.confirmation_token}\n",
            )
            for user in users
        ]
    if messages:
        mailer.send_batch(messages, idempotency_key=str(batch.group_id))
