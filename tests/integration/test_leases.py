"""Leases: extended while a handler runs, so a slow batch is never rescued from a live worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from outbox import Batch, Outbox
from outbox.results import BatchResult
from outbox.worker import Worker
from tests.models import ActivityEvent

LEASE_SECONDS = 1.0
HANDLER_SECONDS = 3.0


def test_slow_handler_keeps_its_lease(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """A handler running three leases long finishes once, with no rescue and no lost lease."""
    app = make_app(database_url)
    app.with_settings(lease_seconds=LEASE_SECONDS, rescue_interval=0.2, poll_interval=0.05)
    calls: list[int] = []

    @app.handler(ActivityEvent, batch_size=10)
    def slow(batch: Batch[ActivityEvent]) -> None:
        calls.append(batch.attempt)
        time.sleep(HANDLER_SECONDS)

    commit_events(app.engine, 5)
    results: list[BatchResult] = []
    worker = Worker(app, concurrency=2, burst=True, on_result=results.append)
    # A second worker rescuing all the time: it must find nothing expired.
    rescuer = Worker(app, concurrency=1)
    rescued: list[int] = []
    stop = threading.Event()

    def rescue_loop() -> None:
        while not stop.is_set():
            rescued.append(rescuer.rescue())
            stop.wait(0.1)

    thread = threading.Thread(target=rescue_loop, daemon=True)
    thread.start()
    try:
        worker.run()
    finally:
        stop.set()
        thread.join(timeout=5)
    assert ([1], ["succeeded"], 0) == (calls, [r.outcome for r in results], sum(rescued))


def test_rescue_skips_a_job_whose_completion_holds_its_row(postgres_database: str) -> None:
    """A rescue does not wait on a job row locked by an open transaction: it skips it."""
    import uuid

    from sqlalchemy import create_engine, text, update

    from outbox import schema
    from outbox._db import queries
    from outbox._db.dialects import db_now_plus

    engine = create_engine(postgres_database)
    with engine.begin() as conn:
        conn.execute(
            schema.jobs.insert().values(
                kind="batch", handler="h", group_id=uuid.uuid4(), priority=0,
                lease_owner="frozen", lease_token=uuid.uuid4(),
                lease_expires_at=db_now_plus(-5),
            )
        )  # fmt: skip
    holder = engine.connect()
    holder.begin()
    holder.execute(update(schema.jobs).values(last_error="completion in progress"))
    try:
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '2s'"))
            rescued = queries.rescue_expired_jobs(conn, "postgresql")
    finally:
        holder.rollback()
        holder.close()
        engine.dispose()
    assert 0 == rescued


def test_outbox_engine_keeps_the_url_options(postgres_database: str) -> None:
    """Options in the URL (?options=-c ...) survive next to the idle-transaction timeout."""
    from sqlalchemy import text

    from outbox import Outbox

    app = Outbox(f"{postgres_database}?options=-c%20statement_timeout%3D12345")
    with app.engine.connect() as conn:
        statement_timeout = conn.execute(text("SHOW statement_timeout")).scalar_one()
        idle_timeout = conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar_one()
    app.engine.dispose()
    assert ("12345ms", "1min") == (statement_timeout, idle_timeout)
