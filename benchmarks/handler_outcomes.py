"""Handler outcomes on a running worker: when a deferred group comes back, and how long good
events wait while bisection isolates poison events under a circuit breaker.

Deferral return time: ``--groups`` groups of one event each on PostgreSQL, each deferred once
by its handler with ``batch.retry(events, after=A)`` (a per-record 429: no pause), for each A
in ``--afters``; an in-process ``Worker`` with the default settings (a poll of 1 s per live
worker) runs them. Measured per group: from the call that deferred it to the call that takes it
back, against the documented bound ``A * 1.1 + 0.5 s``.

Good events during bisection: ``--events`` events wait, ``--poison`` of them poison (the
handler raises a plain, unmarked ``ValueError`` for any call that carries one, as a bulk API's
whole-call 400 does), in groups of ``--batch-size``, on a handler with ``bisect=True`` and a
``CircuitBreaker`` opening after ``--breaker-failures`` failures in a row, as
docs/flow-control.md pairs them; meanwhile a writer commits ``--rate`` good events a second for
``--seconds``. Measured: from each written event's commit
to the call that delivers it (p50, p99, max), whether the breaker opened, and where the poison
events ended.

    python -m benchmarks.handler_outcomes --groups 40 --afters 1,2,5 \\
        --events 4749 --poison 3 --batch-size 100 --rate 5 --seconds 30 --breaker-failures 2

``--label L`` stores the results as ``results/handler_outcomes_L.json``: the same benchmark run
from a checkout of an older revision, to compare.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import MutableMapping
from typing import Any

import structlog
from sqlalchemy import func, insert, select
from sqlalchemy.orm import DeclarativeBase, Mapped

from benchmarks._common import (
    command_line,
    fresh_tables,
    machine,
    percentile,
    scratch_database,
    write,
)
from outbox import Batch, BufferMixin, CircuitBreaker, Outbox, RetryPolicy, Urgency, schema
from outbox.worker import Worker

DATABASE = "outbox_bench_handler_outcomes"
BOUND_FACTOR, BOUND_SLACK = 1.1, 0.5
# Bisection's backoff: a few seconds between halvings, as an impatient user would set.
BISECT_POLICY = RetryPolicy(max_attempts=10, scale=0.0, base_delay=2.0)


class Base(DeclarativeBase):
    """The benchmark's buffer."""


class OutcomeEvent(BufferMixin, Base):
    """One event; ``written`` is when its writer committed it (``time.time()``)."""

    __tablename__ = "bench_outcome_events"
    written: Mapped[float]
    poison: Mapped[bool]


def _run_worker(app: Outbox, until: Any, timeout: float) -> None:
    worker = Worker(app, concurrency=4, distribute_every=0.5)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not until() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.stop()
        thread.join(60)


def deferral_return(url: str, groups: int, after: float) -> dict[str, Any]:
    """Seconds from each group's deferring call to the call that takes it back."""
    fresh_tables(url, Base.metadata)
    app = Outbox(url)
    first: dict[int, float] = {}
    back: dict[int, float] = {}
    lock = threading.Lock()

    @app.handler(OutcomeEvent, batch_size=1, urgency=Urgency.MINUTES)
    def deferring(batch: Batch[OutcomeEvent]) -> None:
        now = time.monotonic()
        (event_id,) = batch.ids
        with lock:
            if event_id in first:
                back.setdefault(event_id, now)
                return
            first[event_id] = now
        batch.retry(batch.events, "429 for this record", after=after)

    with app.engine.begin() as conn:
        conn.execute(insert(OutcomeEvent), [{"written": 0.0, "poison": False}] * groups)
    _run_worker(app, lambda: len(back) == groups, timeout=after * 3 + 60)
    app.engine.dispose()
    returns = [back[i] - first[i] for i in back]
    bound = after * BOUND_FACTOR + BOUND_SLACK
    return {
        "after": after,
        "groups": groups,
        "returned": len(returns),
        "bound_seconds": bound,
        "min_seconds": round(min(returns), 3),
        "p50_seconds": round(percentile(returns, 0.5), 3),
        "p99_seconds": round(percentile(returns, 0.99), 3),
        "max_seconds": round(max(returns), 3),
        "within_bound": sum(r <= bound for r in returns),
        "earlier_than_after": sum(r < after for r in returns),
    }


def bisection_latency(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Commit-to-delivery seconds of good events written while poison events are isolated."""
    fresh_tables(url, Base.metadata)
    app = Outbox(url)
    delivered: dict[int, float] = {}
    opened: list[dict[str, Any]] = []
    lock = threading.Lock()

    @app.handler(
        OutcomeEvent,
        batch_size=args.batch_size,
        urgency=Urgency.MINUTES,
        retry=BISECT_POLICY,
        bisect=True,
        circuit_breaker=CircuitBreaker(
            failures=args.breaker_failures, probe_after=5.0, max_probe_after=60.0
        ),
        archive=True,
    )
    def bulk(batch: Batch[OutcomeEvent]) -> None:
        if any(row.poison for row in batch.rows):
            raise ValueError("400: one record cannot be read")
        now = time.time()
        with lock:
            for row in batch.rows:
                delivered[row.id] = now - row.written if row.written else 0.0

    step = max(args.events // max(args.poison, 1), 1)
    backlog = [
        {"written": 0.0, "poison": n % step == step // 2 and n // step < args.poison}
        for n in range(args.events)
    ]
    with app.engine.begin() as conn:
        conn.execute(insert(OutcomeEvent), backlog)
    written: list[int] = []

    def writer() -> None:
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            with app.engine.begin() as conn:
                row = conn.execute(
                    insert(OutcomeEvent).returning(OutcomeEvent.id),
                    {"written": time.time(), "poison": False},
                )
                written.append(row.scalar_one())
            time.sleep(1 / args.rate)

    def remember_openings(_: Any, method: str, event: MutableMapping[str, Any]) -> Any:
        if event.get("event") == "outbox.breaker.opened":
            opened.append({k: v for k, v in event.items() if k in ("seconds", "trips", "why")})
        raise structlog.DropEvent

    def dead() -> int:
        with app.engine.connect() as conn:
            query = select(func.count()).where(schema.archive.c.status == "dead")
            return int(conn.execute(query).scalar_one())

    structlog.configure(processors=[remember_openings])
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    _run_worker(
        app,
        lambda: (
            not thread.is_alive() and all(i in delivered for i in written) and dead() >= args.poison
        ),
        timeout=args.seconds + 600,
    )
    dead_at_end = dead()
    structlog.reset_defaults()
    app.engine.dispose()
    latencies = [delivered[i] for i in written if i in delivered]
    return {
        "events": args.events,
        "poison": args.poison,
        "batch_size": args.batch_size,
        "written_during_run": len(written),
        "delivered_of_those": len(latencies),
        "p50_seconds": round(percentile(latencies, 0.5), 3),
        "p99_seconds": round(percentile(latencies, 0.99), 3),
        "max_seconds": round(max(latencies), 3),
        "promise_seconds": Urgency.MINUTES.promise,
        "breaker_failures": args.breaker_failures,
        "breaker_openings": opened,
        "dead": dead_at_end,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=40)
    parser.add_argument("--afters", default="1,2,5", help="deferrals to measure, in seconds")
    parser.add_argument("--events", type=int, default=4749)
    parser.add_argument("--poison", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--rate", type=float, default=5.0, help="good events written a second")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the writer writes")
    parser.add_argument(
        "--breaker-failures", type=int, default=2, help="the circuit breaker's failures in a row"
    )
    parser.add_argument(
        "--label", default=None, help="stored as results/handler_outcomes_LABEL.json (a revision)"
    )
    args = parser.parse_args()
    url = scratch_database(DATABASE)
    deferrals = [deferral_return(url, args.groups, float(a)) for a in args.afters.split(",")]
    for d in deferrals:
        print(
            f"after {d['after']:g} s: p50 {d['p50_seconds']} s, max {d['max_seconds']} s, "
            f"{d['within_bound']}/{d['returned']} within {d['bound_seconds']:g} s"
        )
    bisection = bisection_latency(url, args)
    print(
        f"bisection: good events p50 {bisection['p50_seconds']} s, p99 "
        f"{bisection['p99_seconds']} s, max {bisection['max_seconds']} s; breaker openings "
        f"{len(bisection['breaker_openings'])}; dead {bisection['dead']}"
    )
    write(
        "handler_outcomes" + (f"_{args.label}" if args.label else ""),
        {
            "benchmark": "handler_outcomes",
            "label": args.label,
            "command": command_line("benchmarks.handler_outcomes", args),
            "machine": machine(),
            "deferrals": deferrals,
            "bisection": bisection,
        },
    )


if __name__ == "__main__":
    main()
