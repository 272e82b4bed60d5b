"""``outbox demo``: the whole pipeline on an embedded SQLite file, in a few seconds.

Simulated application transactions write orders and their events together (some roll back);
a worker distributes, claims and hands groups to a handler that plays a flaky bulk API: some
calls fail and are retried with backoff, some events are rejected and discarded, a few are
poison and end as dead letters. Then it prints what happened.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import click
from sqlalchemy import String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import schema
from outbox.app import Outbox, Settings
from outbox.batch import Batch
from outbox.buffer import BufferMixin
from outbox.ops import database
from outbox.ops.migrate import upgrade
from outbox.results import BatchResult
from outbox.retry import RetryPolicy
from outbox.urgency import Urgency
from outbox.worker import Worker

EVENTS_PER_TRANSACTION = 10
ROLLBACK_RATE = 0.1
FLAKY_CALL_RATE = 0.08
REJECTED_RATE = 0.01
POISON_RATE = 0.002
BATCH_SIZE = 250
API_LATENCY_SECONDS = 0.01
DEMO_RETRY = RetryPolicy(max_attempts=3, scale=0.0, base_delay=0.2, jitter=0.2)
DEMO_TIMEOUT_SECONDS = 300.0


class DemoBase(DeclarativeBase):
    pass


class DemoOrder(DemoBase):
    """The business row each simulated transaction writes."""

    __tablename__ = "demo_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(64))


class DemoOrderEvent(BufferMixin, DemoBase):
    """An event for the bulk API, written in the same transaction as its order."""

    __tablename__ = "demo_order_events"
    order_id: Mapped[int]
    kind: Mapped[str] = mapped_column(String(16))


@dataclass
class _Api:
    """A bulk API that is sometimes unavailable and rejects some records."""

    calls: int = 0
    failed_calls: int = 0
    records: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bulk_send(self, batch: Batch[DemoOrderEvent]) -> None:
        time.sleep(API_LATENCY_SECONDS)
        with self.lock:
            self.calls += 1
            if random.random() < FLAKY_CALL_RATE:
                self.failed_calls += 1
                raise ConnectionError("bulk API unavailable (simulated)")
        rejected = [e for e in batch.events if e.kind == "rejected"]
        poison = [e for e in batch.events if e.kind == "poison"]
        if rejected:
            batch.discard(rejected, "rejected by the API: invalid record")
        if poison:
            batch.retry(poison, "API error 500 for this record")
        with self.lock:
            self.records += len(batch.events) - len(rejected) - len(poison)


def run_demo(
    *,
    events: int = 5000,
    database_url: str | None = None,
    interrupted: threading.Event | None = None,
) -> dict[str, float]:
    """Run the demo and print its summary; returns the figures. ``interrupted``: once set
    (Ctrl-C), the demo stops at its next step with KeyboardInterrupt."""
    folder = None
    if database_url is None:
        folder = tempfile.mkdtemp(prefix="outbox-demo-")
        database_url = f"sqlite:///{Path(folder) / 'demo.sqlite3'}"
    app = Outbox(database_url, settings=Settings(poll_interval=0.05, rescue_interval=1.0))
    try:
        return _run(app, events, interrupted or threading.Event())
    finally:
        # Interrupted too (Ctrl-C): the throwaway database goes with the demo.
        if folder is not None:
            app.engine.dispose()
            shutil.rmtree(folder, ignore_errors=True)


def _run(app: Outbox, events: int, interrupted: threading.Event) -> dict[str, float]:
    api = _Api()
    app.handler(DemoOrderEvent, batch_size=BATCH_SIZE, urgency=Urgency.MINUTES, retry=DEMO_RETRY)(
        api.bulk_send
    )

    click.echo(f"outbox demo on {app.url.render_as_string(hide_password=True)}")
    database.check_connection(app.engine)
    upgrade(app.engine)
    with app.engine.begin() as conn:
        DemoBase.metadata.drop_all(conn)
        DemoBase.metadata.create_all(conn)

    committed, rolled_back = _write_events(app, events, interrupted)
    click.echo(
        f"wrote {committed} events in application transactions "
        f"({rolled_back} more were rolled back with their orders and never exist)"
    )

    handled = 0
    progress_lock = threading.Lock()
    started = time.monotonic()
    with click.progressbar(length=committed, label="draining", show_pos=True) as bar:

        def on_result(result: BatchResult) -> None:
            nonlocal handled
            done = result.succeeded + result.discarded + result.dead
            with progress_lock:
                handled += done
                bar.update(done)

        worker = Worker(app, concurrency=4, distribute_every=0.2, on_result=on_result)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + DEMO_TIMEOUT_SECONDS
        try:
            while _remaining(app) and time.monotonic() < deadline:
                _stop_if(interrupted)
                time.sleep(0.05)
        finally:
            worker.stop()
            thread.join()
    elapsed = time.monotonic() - started
    return _summarise(app, api, worker, committed, rolled_back, elapsed)


def _stop_if(interrupted: threading.Event) -> None:
    if interrupted.is_set():
        raise KeyboardInterrupt


def _write_events(app: Outbox, events: int, interrupted: threading.Event) -> tuple[int, int]:
    committed = rolled_back = 0
    rng = random.Random(7)
    while committed < events:
        _stop_if(interrupted)
        size = min(EVENTS_PER_TRANSACTION, events - committed)
        with Session(app.engine) as session:
            order = DemoOrder(customer=f"customer-{rng.randrange(1000)}")
            session.add(order)
            session.flush()
            for _ in range(size):
                roll = rng.random()
                kind = (
                    "poison"
                    if roll < POISON_RATE
                    else "rejected"
                    if roll < POISON_RATE + REJECTED_RATE
                    else "created"
                )
                session.add(DemoOrderEvent(order_id=order.id, kind=kind))
            if rng.random() < ROLLBACK_RATE:
                session.rollback()
                rolled_back += size
                continue
            session.commit()
            committed += size
    return committed, rolled_back


def _remaining(app: Outbox) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(DemoOrderEvent)).scalar_one())


def _summarise(
    app: Outbox, api: _Api, worker: Worker, committed: int, rolled_back: int, elapsed: float
) -> dict[str, float]:
    with app.engine.connect() as conn:
        archived: dict[str, int] = dict(
            conn.execute(
                select(schema.archive.c.status, func.count()).group_by(schema.archive.c.status)
            ).all()
        )
    stats = worker.stats
    figures: dict[str, float] = {
        "events_committed": committed,
        "events_rolled_back": rolled_back,
        "groups": stats.groups_succeeded + stats.groups_dead,
        "handler_calls": api.calls,
        "failed_calls_retried": stats.groups_retried,
        "events_delivered": api.records,
        "events_discarded": archived.get(schema.ArchiveStatus.DISCARDED, 0),
        "events_dead": archived.get(schema.ArchiveStatus.DEAD, 0),
        "events_left": _remaining(app),
        "seconds": round(elapsed, 2),
        "events_per_second": round(committed / elapsed, 1) if elapsed else 0.0,
    }
    click.echo("")
    click.echo(f"  events committed        {committed}")
    click.echo(f"  events rolled back      {rolled_back} (never handled)")
    click.echo(f"  handler calls           {api.calls} (one bulk call per group, ≤ {BATCH_SIZE})")
    click.echo(f"  calls failed, retried   {stats.groups_retried}")
    click.echo(f"  events delivered        {api.records}")
    click.echo(f"  events discarded        {figures['events_discarded']:.0f} (archived)")
    click.echo(f"  dead letters            {figures['events_dead']:.0f} (archived with the error)")
    click.echo(f"  events left in buffer   {figures['events_left']:.0f}")
    click.echo(
        f"  drained in {elapsed:.2f} s: {figures['events_per_second']:.0f} events/s "
        f"(with {API_LATENCY_SECONDS * 1000:.0f} ms simulated API latency per call)"
    )
    return figures
