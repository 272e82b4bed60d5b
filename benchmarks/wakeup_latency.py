"""Wake-up latency: from an event's commit to the start of its handler, with and without NOTIFY.

``--producers`` processes (default 1) commit one event per transaction each, together
``--rate`` events per second, steadily: each commits ``rate / producers`` per second, and their
schedules are offset by ``1 / rate`` so that the commits are spread evenly. A worker (4 threads)
handles them with a REALTIME handler. At handler start, each event's age is taken against its
``created_at`` (the database clock at insert, a moment before commit, on the same machine).

    python -m benchmarks.wakeup_latency --rate 200 --seconds 20 --runs 3
    python -m benchmarks.wakeup_latency --rate 1000 --producers 8 --seconds 20 --runs 3
    python -m benchmarks.wakeup_latency --rate 1000 --producers 8 --plain-producers --runs 3

One producer connection commits only about 200 transactions a second on a 2-CPU machine, so
1,000 events a second need several. Producers write through a SQLAlchemy Session, as an
application does; with ``--plain-producers`` they send a plain psycopg INSERT and COMMIT
instead, which leaves more of a small machine's CPU to the database and the worker when the
Session-based producers cannot keep the rate up (the path measured, commit to handler, is the
same). Each run stores its target rate, the rate the producers actually committed (events
committed over the window), the number of producers and the latency summary; a run whose
producers fell more than 5% short of the target is flagged ``rate_short`` and a warning is
printed, since its latencies were measured under a lighter load than asked.

Modes: ``notify`` (triggers + LISTEN, the default on PostgreSQL) and ``polling`` (listen off;
the worker polls every ``--poll-interval`` seconds and distributes as often).
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import threading
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier, Event
from typing import Any

import psycopg
from sqlalchemy import String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from benchmarks._common import (
    command_line,
    libpq_url,
    machine,
    scratch_database,
    summary,
    write,
)
from outbox import Batch, BufferMixin, Outbox, Settings, Urgency, schema
from outbox.ops import notify
from outbox.worker import Worker


class Base(DeclarativeBase):
    pass


class PingEvent(BufferMixin, Base):
    __tablename__ = "bench_ping_events"
    note: Mapped[str] = mapped_column(String(16), default="ping")


# How far below the target the committed rate may fall before a run is flagged.
RATE_TOLERANCE = 0.05


def produce(
    url: str,
    rate: float,
    seconds: float,
    phase: float,
    ready: Barrier,
    go: Event,
    start: Synchronized[float],
    report: Queue[tuple[int, float]],
    plain: bool,
) -> None:
    """Commit one event per transaction, ``rate`` per second, for ``seconds``.

    The clock is shared: every producer starts at the wall-clock instant the parent puts in
    ``start`` and commits at ``start + phase + k / rate``. It reports how many events it
    committed and the wall-clock time it finished.
    """
    commit_one, close = _committer(url, plain)
    ready.wait(timeout=60)
    go.wait(timeout=60)
    # The shared start is wall-clock time (comparable across processes); the schedule runs
    # on the monotonic clock, which does not jump.
    t0 = time.monotonic() + (start.value - time.time())
    end = t0 + seconds
    interval = 1.0 / rate
    n = 0
    due = t0 + phase
    while due < end:
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        elif time.monotonic() >= end:
            break  # behind schedule and the window has closed: what is left was not committed
        commit_one()
        n += 1
        due = t0 + phase + n * interval
    report.put((n, time.time()))
    close()


def _committer(url: str, plain: bool) -> tuple[Callable[[], None], Callable[[], None]]:
    """A producer's commit of one event, and how to let go of its connection. It connects at
    once, before the clock starts, so that the first commits do not pay for it."""
    if plain:
        raw = psycopg.connect(libpq_url(url))

        def commit_plain() -> None:
            raw.execute("INSERT INTO bench_ping_events (note) VALUES ('ping')")
            raw.commit()

        return commit_plain, raw.close
    app = Outbox(url)
    with app.engine.connect():
        pass

    def commit_in_session() -> None:
        with Session(app.engine) as session:
            session.add(PingEvent())
            session.commit()

    return commit_in_session, app.engine.dispose


def produce_all(
    url: str, rate: float, seconds: float, producers: int, plain: bool
) -> dict[str, Any]:
    """Run ``producers`` processes committing ``rate`` events per second between them.

    Returns the events committed and the rate achieved over the window (or over the time the
    producers actually took, if they overran it).
    """
    ready = multiprocessing.Barrier(producers + 1)
    go = multiprocessing.Event()
    start: Synchronized[float] = multiprocessing.Value("d", 0.0)
    report: Queue[tuple[int, float]] = multiprocessing.Queue()
    each = rate / producers
    processes = [
        multiprocessing.Process(
            target=produce,
            # Producer i starts i / rate after the first: together they commit every 1 / rate.
            args=(url, each, seconds, i / rate, ready, go, start, report, plain),
        )
        for i in range(producers)
    ]
    for process in processes:
        process.start()
    ready.wait(timeout=60)  # every producer connected: start them together
    start.value = time.time() + 0.1
    go.set()
    results = [report.get(timeout=seconds + 120) for _ in processes]
    for process in processes:
        process.join()
    committed = sum(n for n, _ in results)
    elapsed = max(seconds, max(finished for _, finished in results) - start.value)
    return {"committed": committed, "achieved_rate": round(committed / elapsed, 1)}


def run(
    url: str,
    mode: str,
    rate: float,
    seconds: float,
    poll_interval: float,
    producers: int,
    plain: bool,
) -> dict[str, Any]:
    """One measured run; returns the rates and the latency summary."""
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
    produced = produce_all(url, rate, seconds, producers, plain)
    deadline = time.monotonic() + 30
    while _remaining(app) and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.stop()
    thread.join(30)
    app.engine.dispose()
    return {
        "target_rate": rate,
        **produced,
        "producers": producers,
        "rate_short": produced["achieved_rate"] < (1 - RATE_TOLERANCE) * rate,
        **summary(latencies),
    }


def _remaining(app: Outbox) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(PingEvent)).scalar_one())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="events per second")
    parser.add_argument(
        "--producers", type=int, default=1, help="producer processes sharing the rate"
    )
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--modes", default="notify,polling")
    parser.add_argument(
        "--plain-producers", action="store_true", help="producers use psycopg, not a Session"
    )
    args = parser.parse_args()
    if args.producers < 1:
        parser.error("--producers must be at least 1")
    if args.rate <= 0:
        parser.error("--rate must be positive")
    url = scratch_database("outbox_bench_latency")
    results: dict[str, Any] = {
        "benchmark": "wakeup_latency",
        "command": command_line("benchmarks.wakeup_latency", args),
        "machine": machine(),
        "rate_per_second": args.rate,
        "producers": args.producers,
        "plain_producers": args.plain_producers,
        "seconds": args.seconds,
        "poll_interval": args.poll_interval,
        "runs": {},
    }
    for mode in args.modes.split(","):
        results["runs"][mode] = []
        for n in range(args.runs):
            figures = run(
                url,
                mode,
                args.rate,
                args.seconds,
                args.poll_interval,
                args.producers,
                args.plain_producers,
            )
            results["runs"][mode].append(figures)
            print(f"{mode} run {n + 1}: {figures}", flush=True)
            if figures["rate_short"]:
                print(
                    f"WARNING: {mode} run {n + 1} committed {figures['achieved_rate']} events/s,"
                    f" more than {RATE_TOLERANCE:.0%} short of the target {args.rate:g}/s;"
                    " its latencies were measured under a lighter load (try more --producers)",
                    flush=True,
                )
    path = write(f"wakeup_latency_{int(args.rate)}", results)
    print(f"results in {path}")


if __name__ == "__main__":
    main()
