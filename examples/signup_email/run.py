"""Run the signup example end to end: ``python examples/signup_email/run.py``.

1. create the tables (outbox's and the example's; the example's are dropped first);
2. sign users up, one transaction each; one signup in 25 reuses an email address that is
   already taken, so its COMMIT fails on the unique constraint and takes the email's event
   with it;
3. drain the buffer with ``outbox.testing.drain``: the emails go out in bulk;
4. print what happened.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: import the example as the package it is (from the repository root), not
    # as loose modules of this folder, so there is exactly one `app` with its handlers.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import structlog
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from examples.signup_email.app import Base, EmailConfirmationEvent, User, app, mailer, sign_up
from outbox import schema
from outbox.testing import drain

DUPLICATE_EVERY = 25


def main(database_url: str | None = None, signups: int = 1000) -> dict[str, int | float]:
    """Attempt ``signups`` signups (some fail), send the emails, return a summary.

    ``database_url``: where to run (default: the app's, from ``OUTBOX_DATABASE_URL`` or a SQLite
    file next to the example).
    """
    if database_url is not None:
        app.use_database(database_url)
    started = time.monotonic()
    mailer.clear()
    try:
        reset_tables()
        created, failed = simulate_signups(signups)
        # Before any delivery: exactly one event per user, none for the failed signups.
        buffered = count(EmailConfirmationEvent)
        result = drain(app)
        return {
            "signups_attempted": signups,
            "users_created": created,
            "signups_failed": failed,
            "users_in_database": count(User),
            "events_buffered": buffered,
            "emails_sent": len(mailer.sent),
            "bulk_sends": len(mailer.batches),
            "groups_handled": result.stats.groups_succeeded,
            "events_pending": count(EmailConfirmationEvent),
            "seconds": round(time.monotonic() - started, 2),
        }
    finally:
        app.engine.dispose()


def reset_tables() -> None:
    """Create outbox's tables if missing; drop and create the example's, and forget its jobs.

    A real project runs ``outbox migrate`` and its own migrations instead.
    """
    schema.metadata.create_all(app.engine)
    with app.engine.begin() as conn:
        for table in (schema.jobs, schema.archive):
            conn.execute(delete(table).where(table.c.handler.in_(list(app.handlers))))
        Base.metadata.drop_all(conn)
        Base.metadata.create_all(conn)


def simulate_signups(signups: int) -> tuple[int, int]:
    """One transaction per signup, as a web request would do: (created, failed)."""
    created = failed = 0
    for n in range(1, signups + 1):
        # Every 25th signup tries an address an earlier user already has.
        address = n - 1 if n % DUPLICATE_EVERY == 0 else n
        try:
            with Session(app.engine) as session, session.begin():
                sign_up(session, f"user{address}@example.com", f"User {n}")
        except IntegrityError:
            # The COMMIT failed; whichever INSERT had already run (SQLAlchemy happens to write
            # the event first) is taken back by the ROLLBACK: no user, no email.
            failed += 1
        else:
            created += 1
    return created, failed


def count(model: type[Base]) -> int:
    """Rows of one of the example's tables."""
    with app.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(model)).scalar_one()


if __name__ == "__main__":
    # outbox only emits; the application decides what to show. This one uses structlog, and
    # outbox's events follow its configuration (without one, they go to `logging`).
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    print(f"signup email on {app.url.render_as_string(hide_password=True)}")
    summary = main()
    width = max(len(key) for key in summary)
    for key, value in summary.items():
        print(f"  {key:<{width}}  {value}")
