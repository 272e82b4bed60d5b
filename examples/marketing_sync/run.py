"""Run the marketing-sync example end to end: ``python examples/marketing_sync/run.py``.

1. create the tables (outbox's and the example's; the example's are dropped first, so a second
   run starts clean);
2. simulate application transactions: each records a few activities of one contact and their
   events together; one in eight fails and rolls back, events included;
3. drain the buffer with a worker, against a local fake bulk API that rate-limits;
4. print what happened.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: import the example as the package it is (from the repository root), not
    # as loose modules of this folder, so there is exactly one `app` with its handlers.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import structlog
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from examples.marketing_sync.app import (
    HANDLER_NAME,
    MARKETING_API_URL_ENV,
    Base,
    Contact,
    ContactActivityEvent,
    app,
    record_activities,
)
from examples.marketing_sync.fake_api import FakeMarketingAPI
from outbox import schema
from outbox.worker import Worker

CONTACTS = 300
NO_EMAIL_EVERY = 40  # one contact in 40 signed up by phone: the API rejects its activities
MAX_ACTIVITIES_PER_TRANSACTION = 12
ROLLBACK_EVERY = 8
KINDS = ("page_viewed", "email_opened", "link_clicked", "form_submitted", "trial_started")
DEFAULT_RATE_LIMIT = 3  # calls per second: four workers hit it, so some groups are retried
WORKER_CONCURRENCY = 4
DISTRIBUTE_EVERY_SECONDS = 1.0
DRAIN_TIMEOUT_SECONDS = 120.0
SEED = 42


class PaymentDeclinedError(Exception):
    """A failure later in the request, after the activities were added to the session."""


def main(
    database_url: str | None = None,
    events: int = 5000,
    *,
    api: FakeMarketingAPI | None = None,
    deliver: bool = True,
) -> dict[str, int | float]:
    """Write ``events`` committed events (plus some rolled back), drain them, return a summary.

    ``database_url``: where to run (default: the app's, from ``OUTBOX_DATABASE_URL`` or a SQLite
    file next to the example). ``api``: a running fake API to deliver to (default: one started
    here, rate-limited). ``deliver=False`` only writes the events, for ``outbox work``.
    """
    if database_url is not None:
        app.use_database(database_url)
    started = time.monotonic()
    try:
        reset_tables()
        committed, rolled_back = simulate_transactions(events)
        summary: dict[str, int | float] = {
            "events_written": committed,
            "events_rolled_back": rolled_back,
        }
        if deliver:
            if api is None:
                with FakeMarketingAPI(rate_limit=DEFAULT_RATE_LIMIT) as own_api:
                    summary |= deliver_all(own_api)
            else:
                summary |= deliver_all(api)
        summary["events_pending"] = pending_events()
        summary["seconds"] = round(time.monotonic() - started, 2)
        return summary
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
    with Session(app.engine) as session, session.begin():
        session.add_all(
            Contact(
                id=n,
                name=f"Contact {n}",
                email=None if n % NO_EMAIL_EVERY == 0 else f"contact{n}@example.com",
            )
            for n in range(1, CONTACTS + 1)
        )


def simulate_transactions(events: int) -> tuple[int, int]:
    """Application transactions until ``events`` events are committed: (committed, rolled back).

    Each transaction records a few activities of one contact with ``record_activities`` and
    commits them together with their events, or fails and takes them all back.
    """
    rng = random.Random(SEED)
    committed = rolled_back = 0
    transaction = 0
    while committed < events:
        transaction += 1
        contact_id = rng.randint(1, CONTACTS)
        count = min(rng.randint(1, MAX_ACTIVITIES_PER_TRANSACTION), events - committed)
        kinds = [rng.choice(KINDS) for _ in range(count)]
        try:
            with Session(app.engine) as session, session.begin():
                record_activities(session, contact_id, kinds)
                if transaction % ROLLBACK_EVERY == 0:
                    raise PaymentDeclinedError("card declined")
        except PaymentDeclinedError:
            rolled_back += count  # the activities and their events are gone together
        else:
            committed += count
    return committed, rolled_back


def deliver_all(api: FakeMarketingAPI) -> dict[str, int | float]:
    """Drain the buffer into ``api``; what the API saw."""
    with _environ(MARKETING_API_URL_ENV, api.url):
        drain_until_empty()
    calls = api.calls
    return {
        "api_calls": len(calls),
        "api_calls_rate_limited": sum(call.status == 429 for call in calls),
        "most_calls_in_a_second": api.most_calls_in_a_second(),
        "largest_call": max((call.records for call in calls), default=0),
        "records_received": sum(api.received.values()),
        "records_rejected": len(api.rejected),
        "discarded": archived("discarded"),
        "dead": archived("dead"),
    }


def drain_until_empty(timeout: float = DRAIN_TIMEOUT_SECONDS) -> None:
    """Run a worker (what ``outbox work`` runs) until the buffer is empty, then stop it.

    Not a burst worker: a group that failed waits for its backoff (6 s after the first
    attempt), and a running worker picks it up when it is due.
    """
    worker = Worker(app, concurrency=WORKER_CONCURRENCY, distribute_every=DISTRIBUTE_EVERY_SECONDS)
    thread = threading.Thread(target=worker.run, name="marketing-sync-worker")
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while pending_events():
            if not thread.is_alive():
                raise RuntimeError("the worker stopped before the buffer was empty")
            if time.monotonic() > deadline:
                raise RuntimeError(f"events still pending after {timeout} s")
            time.sleep(0.2)
    finally:
        worker.stop()  # graceful: in-flight groups finish first
        thread.join()


def pending_events() -> int:
    """Events still in the buffer: not yet handled, or in a group waiting for a retry."""
    with app.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(ContactActivityEvent)).scalar_one()


def archived(status: str) -> int:
    """Events of this example's handler archived with ``status``."""
    archive = schema.archive
    with app.engine.connect() as conn:
        return conn.execute(
            select(func.count()).where(
                archive.c.handler == HANDLER_NAME, archive.c.status == status
            )
        ).scalar_one()


@contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for the duration of the block."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous


if __name__ == "__main__":
    # outbox only emits; the application decides what to show. This one uses structlog, and
    # outbox's events follow its configuration (without one, they go to `logging`).
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    parser = argparse.ArgumentParser(description="The marketing-sync example of outbox.")
    parser.add_argument("--events", type=int, default=5000, help="committed events to write")
    parser.add_argument(
        "--write-only",
        action="store_true",
        help="only write the events; drain them with `outbox ... work --burst`",
    )
    options = parser.parse_args()
    print(f"marketing sync on {app.url.render_as_string(hide_password=True)}")
    result = main(events=options.events, deliver=not options.write_only)
    width = max(len(key) for key in result)
    for key, value in result.items():
        print(f"  {key:<{width}}  {value}")
