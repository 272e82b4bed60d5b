"""Asking one worker to drain or stop (``fleet.ask``), on every database: the request is left
in the worker's row with who asked and recorded in ``outbox_operations``, in one transaction;
the worker's heartbeat reads it; what cannot be asked is refused with nothing written; a
request a worker does not know leaves it working."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import insert, select, text, update
from structlog.testing import capture_logs

from outbox import Batch, Outbox, Settings, schema
from outbox._services.heartbeat import Heartbeat
from outbox.exceptions import ConfigurationError, OutboxError
from outbox.ops import fleet
from outbox.worker import Worker
from tests._support import wait_for
from tests.models import ActivityEvent

# Heartbeats, and so reads its row and the schema, every half second.
FAST = Settings(poll_interval=0.05, rescue_interval=0.2, lease_seconds=1.5, worker_stale_after=1.5)


def _app(make_app: Callable[[str], Outbox], url: str) -> Outbox:
    app = make_app(url)
    app.with_settings(lease_seconds=3.0)
    app.handler(ActivityEvent, name="record")(_ok)
    return app


def _ok(batch: Batch[Any]) -> None:
    return None


def _beat(app: Outbox, worker_id: str = "host:1:a") -> Heartbeat:
    return Heartbeat(app, worker_id, 1, running=list, stopping=lambda: False)


def _asked(app: Outbox) -> tuple[list[tuple[str, str | None]], list[tuple[str, str, str | None]]]:
    """Each worker row's request and who asked; each operation's action, actor and detail."""
    workers, ops = schema.workers, schema.operations
    with app.engine.connect() as conn:
        rows = conn.execute(
            select(workers.c.request, workers.c.requested_by).order_by(workers.c.id)
        )
        done = conn.execute(select(ops.c.action, ops.c.actor, ops.c.detail).order_by(ops.c.id))
        return [(r.request, r.requested_by) for r in rows], [tuple(r) for r in done]


def test_a_request_is_left_in_the_row_recorded_with_its_actor_and_read_by_the_heartbeat(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Drain, asked by olga: the row says so, the operation names her and the worker's host
    and pid, and the worker's next heartbeat reads it."""
    app = _app(make_app, database_url)
    beat = _beat(app)
    beat.run_once()
    quiet = beat.asked()
    found = fleet.ask(app, "host:1:a", "drain", actor="olga").worker
    beat.run_once()
    asked = beat.asked()
    host = found.hostname
    assert (
        None,
        ("drain", "olga"),
        [("drain", "olga")],
        [("drain", "olga", f"{host} pid {found.pid}")],
    ) == (
        quiet,
        None if asked is None else (asked.request, asked.requested_by),
        _asked(app)[0],
        _asked(app)[1],
    )


@pytest.mark.parametrize(
    ("worker_id", "asked", "error", "message"),
    [
        (
            "host:1:a",
            "restart",
            ConfigurationError,
            "request: expected one of drain, stop, got 'restart'",
        ),
        ("nobody:2:b", "drain", ConfigurationError, "worker 'nobody:2:b': no such worker"),
        ("gone:3:c", "stop", ConfigurationError, "worker 'gone:3:c' is gone (last heartbeat"),
        (
            "old:4:d",
            "drain",
            OutboxError,
            "worker 'old:4:d' runs outbox 0.2.0, older than schema 0007",
        ),
        (
            "older:5:e",
            "drain",
            OutboxError,
            "runs older than 0.2 (no version recorded), older than",
        ),
    ],
    ids=["unknown-request", "unknown-worker", "gone-worker", "generation-6", "no-generation"],
)
def test_what_cannot_be_asked_is_refused_and_nothing_is_written(
    database_url: str,
    make_app: Callable[[str], Outbox],
    worker_id: str,
    asked: str,
    error: type[Exception],
    message: str,
) -> None:
    """An unknown request, worker or a gone one; a worker too old to read requests: refused in
    one line, no row asked, no operation recorded."""
    app = _app(make_app, database_url)
    _beat(app).run_once()
    with app.engine.begin() as conn:
        conn.execute(
            insert(schema.workers),
            [
                {
                    "id": "old:4:d",
                    "hostname": "h",
                    "pid": 4,
                    "concurrency": 1,
                    "version": "0.2.0",
                    "generation": 6,
                },
                {
                    "id": "older:5:e",
                    "hostname": "h",
                    "pid": 5,
                    "concurrency": 1,
                    "version": None,
                    "generation": None,
                },
                {
                    "id": "gone:3:c",
                    "hostname": "h",
                    "pid": 3,
                    "concurrency": 1,
                    "version": "9",
                    "generation": 7,
                },
            ],
        )
        conn.execute(
            update(schema.workers)
            .where(schema.workers.c.id == "gone:3:c")
            .values(heartbeat_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        )
    with pytest.raises(error) as raised:
        fleet.ask(app, worker_id, asked, actor="olga")
    assert (True, [(None, None)] * 4, []) == (message in str(raised.value), *_asked(app))


def test_a_request_the_worker_does_not_know_leaves_it_working(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A request of a newer outbox in its row: the worker logs it, keeps working and handles
    what comes; a stop afterwards stops it."""
    app = _app(make_app, database_url)
    worker = Worker(app)
    thread = threading.Thread(target=worker.run, daemon=True)
    with capture_logs() as logs:
        thread.start()
        try:
            wait_for(lambda: fleet.workers(app), "the worker's row")
            with app.engine.begin() as conn:
                conn.execute(update(schema.workers).values(request="restart", requested_by="x"))
            wait_for(lambda: _asked_logs(logs), "the heartbeat to read the request")
            commit_events(app.engine, 3)
            wait_for(lambda: worker.stats.events_succeeded == 3, "the worker to handle 3 events")
            still = thread.is_alive()
            fleet.ask(app, worker.id, "stop", actor="olga")
            thread.join(timeout=30)
        finally:
            worker.stop()
            thread.join(timeout=30)
    assert (True, False, [], [("restart", False), ("stop", True)]) == (
        still,
        thread.is_alive(),
        fleet.workers(app),
        _asked_logs(logs),
    )


def _asked_logs(logs: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    return [(e["request"], e["known"]) for e in logs if e["event"] == "outbox.worker.asked"]


def test_a_schema_downgraded_below_the_requests_still_stops_the_worker_on_its_fence(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """The tables taken back to generation 6 under a running worker (its request columns
    gone): its heartbeats go on, it stops as the schema watch says, and no database error is
    logged."""
    app = make_app(database_url, FAST)
    app.handler(ActivityEvent, name="record")(_ok)
    worker = Worker(app)
    thread = threading.Thread(target=worker.run, daemon=True)
    with capture_logs() as logs:
        thread.start()
        try:
            wait_for(lambda: fleet.workers(app), "the worker's row")
            with app.engine.begin() as conn:
                conn.execute(update(schema.schema_state).values(generation=6))
            with app.engine.begin() as conn:
                conn.execute(text("ALTER TABLE outbox_workers DROP COLUMN requested_by"))
            with app.engine.begin() as conn:
                conn.execute(text("ALTER TABLE outbox_workers DROP COLUMN request"))
            wait_for(lambda: worker.schema_incompatible, "the worker to see the schema")
            thread.join(timeout=30)
        finally:
            worker.stop()
            thread.join(timeout=30)
    events = [e["event"] for e in logs]
    assert (False, True, False) == (
        thread.is_alive(),
        "outbox.worker.schema_incompatible" in events,
        "outbox.worker.database_error" in events,
    )
