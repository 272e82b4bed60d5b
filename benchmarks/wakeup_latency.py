"""Wake-up latency: from an event's commit to the start of its handler, with and without NOTIFY.

A producer process commits one event per transaction at a steady rate; a worker (4 threads)
handles them with a REALTIME handler. At handler start, each event's age is taken against its
``created_at`` (the database clock at insert, a moment before commit, on the same machine).

    python -m benchmarks.wakeup_latency --rate 200 --seconds 20 --runs 3

Modes: ``notify`` (triggers + LISTEN, the default on PostgreSQL) and ``polling`` (listen off;
the worker polls every ``--poll-interval`` seconds and distributes as often).
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import threading
import time
from typing import Any

from sqlalchemy import String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from benchmarks._common import machine, scratch_database, summary, write
from outbox import Batch, BufferMixin, Outbox, Settings, Urgency, notify, schema
from outbox.worker import Worker


class Base(DeclarativeBase):
    pass


class PingEvent(BufferMixin, Base):
    __tablename__ = "bench_ping_events"
    note: Mapped[str] = mapped_column(String(16), default="ping")


def produce(url: str, rate: float, seconds: float) -> None:
    """Commit one event per transaction, ``rate`` per second, for ``seconds``."""
    app = Outbox(url)
    interval = 1.0 / rate
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        with Session(app.engine) as session:
            session.add(PingEvent())
            session.commit()
        n += 1
        pause = start + n * interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    app.engine.dispose()


def run(url: str, mode: str, rate: float, seconds: float, poll_interval: float) -> dict[str, Any]:
    """One measured run; returns the latency summary."""
    settings = Settings(poll_interval=poll_interval, listen=mode == "notify")
    app = Outbox(url, settings=settings)
    latencies: list[float] = []
    lock = threading.Lock()

    @app.handler(PingEvent, batch_size=100, urgency=Urgency.REALTIME)
    def ping(batch: Batch[PingEvent]) -> None:
        now = dt.datetime.now(dt.UTC)
        ages = [(now - e.created_at).total_seconds() for e in batch.events]
        with lock:
            latencies.extend(ages)

    with app.engine.begin() as conn:
        Base.metadata.drop_all(conn)
        schema.metadata.drop_all(conn)
        schema.metadata.create_all(conn)
        Base.metadata.create_all(conn)
    if mode == "notify":
        notify.install(app)
    worker = Worker(app, concurrency=4, distribute_every=poll_interval)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    time.sleep(1.0)  # let the worker register, lead and listen before the clock starts
    producer = multiprocessing.Process(target=produce, args=(url, rate, seconds))
    producer.start()
    producer.join()
    deadline = time.monotonic() + 30
    while _remaining(app) and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.stop()
    thread.join(30)
    app.engine.dispose()
    return {**summary(latencies), "achieved_rate": round(len(latencies) / seconds, 1)}


def _remaining(app: Outbox) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(PingEvent)).scalar_one())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="events per second")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--modes", default="notify,polling")
    args = parser.parse_args()
    url = scratch_database("outbox_bench_latency")
    results: dict[str, Any] = {
        "benchmark": "wakeup_latency",
        "machine": machine(),
        "rate_per_second": args.rate,
        "seconds": args.seconds,
        "poll_interval": args.poll_interval,
        "runs": {},
    }
    for mode in args.modes.split(","):
        results["runs"][mode] = []
        for n in range(args.runs):
            figures = run(url, mode, args.rate, args.seconds, args.poll_interval)
            results["runs"][mode].append(figures)
            print(f"{mode} run {n + 1}: {figures}", flush=True)
    path = write(f"wakeup_latency_{int(args.rate)}", results)
    print(f"results in {path}")


if __name__ == "__main__":
    main()
