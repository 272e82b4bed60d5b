"""Cost of enqueue: what one event adds to an application's transaction.

1. An application transaction through a SQLAlchemy session inserts a business row, with and
   without one event: the statements each sends are counted (the event must add exactly one
   INSERT), and both transaction rates are measured.
2. 100 events in one transaction with ``outbox.add_events`` against raw SQLAlchemy Core
   ``executemany`` of the same rows, both on a Connection; ``add_events`` through a Session,
   as applications usually call it, is measured beside them. The transactions of 1 and 2
   take turns, 25 at a time, within each run.
3. Concurrent writers: ``--writers`` connections (plain psycopg, a thread each) commit one
   event per transaction side by side for ``--seconds``, without and with the notify trigger,
   taking turns run by run. A notifying transaction queues its notification at commit under
   a lock that PostgreSQL holds across the whole cluster, so the trigger's cost shows when
   many transactions commit at once, not in one connection's rate.

    python -m benchmarks.enqueue_cost --transactions 2000 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import psycopg
from sqlalchemy import String, event, insert
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from benchmarks._common import command_line, libpq_url, machine, scratch_database, write
from outbox import BufferMixin, Outbox, add_events, schema
from outbox._db import queries
from outbox.ops import notify


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "bench_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(String(32))


class OrderEvent(BufferMixin, Base):
    __tablename__ = "bench_order_events"
    order_reference: Mapped[str] = mapped_column(String(32))


def statements_of(app: Outbox, work: Any) -> list[str]:
    """The SQL statements (first word) that one call of ``work`` sends."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement.split()[0].upper())

    event.listen(app.engine, "before_cursor_execute", record)
    try:
        work()
    finally:
        event.remove(app.engine, "before_cursor_execute", record)
    return sent


def business(app: Outbox, with_event: bool) -> None:
    """One application transaction: an order, and optionally its event."""
    with Session(app.engine) as session:
        session.add(Order(reference="order"))
        if with_event:
            session.add(OrderEvent(order_reference="order"))
        session.commit()


# Transactions of one work timed before the next takes its turn.
TURN = 25


def rates_taking_turns(works: dict[str, tuple[Any, int]]) -> dict[str, float]:
    """Transactions per second of each work, given as (work, transactions). The works take
    turns, ``TURN`` transactions at a time, so that the machine's slower and faster spells
    weigh on all of them alike; a work run as one block would meet a different spell than
    the work it is compared with."""
    spent = dict.fromkeys(works, 0.0)
    left = {name: count for name, (_, count) in works.items()}
    while any(left.values()):
        for name, (work, _) in works.items():
            turn = min(TURN, left[name])
            started = time.perf_counter()
            for _ in range(turn):
                work()
            spent[name] += time.perf_counter() - started
            left[name] -= turn
    return {name: count / spent[name] for name, (_, count) in works.items()}


def concurrent_rate(dsn: str, writers: int, seconds: float) -> float:
    """Transactions/s of ``writers`` connections each committing one event per transaction,
    while one more connection listens on outbox's channel and reads what it is sent, as a
    worker does."""
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {queries.NOTIFY_CHANNEL}")
        stop = threading.Event()

        def listen() -> None:
            while not stop.is_set():
                for _ in listener.notifies(timeout=0.2):
                    pass

        reader = threading.Thread(target=listen)
        reader.start()
        try:
            return _commit_side_by_side(dsn, writers, seconds)
        finally:
            stop.set()
            reader.join()


def _commit_side_by_side(dsn: str, writers: int, seconds: float) -> float:
    committed = [0] * writers
    deadline: list[float] = []
    # The window opens once every writer is connected (the barrier's action runs before any
    # writer is let through).
    ready = threading.Barrier(writers, action=lambda: deadline.append(time.monotonic() + seconds))

    def write_events(n: int) -> None:
        with psycopg.connect(dsn) as conn:
            ready.wait(timeout=60)
            while time.monotonic() < deadline[0]:
                conn.execute("INSERT INTO bench_order_events (order_reference) VALUES ('o')")
                conn.commit()
                committed[n] += 1

    threads = [threading.Thread(target=write_events, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(committed) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    if args.writers < 1 or args.seconds <= 0:
        parser.error("--writers takes at least 1 and --seconds a positive number")
    url = scratch_database("outbox_bench_enqueue")
    app = Outbox(url)
    app.handler(OrderEvent, name="orders")(lambda batch: None)
    with app.engine.begin() as conn:
        schema.metadata.create_all(conn)
        Base.metadata.create_all(conn)
    results: dict[str, Any] = {
        "benchmark": "enqueue_cost",
        "command": command_line("benchmarks.enqueue_cost", args),
        "machine": machine(),
    }

    without = statements_of(app, lambda: business(app, False))
    with_one = statements_of(app, lambda: business(app, True))
    results["statements"] = {"without_event": without, "with_event": with_one}
    print(f"statements without an event: {without}; with one: {with_one}")

    rows = [{"order_reference": f"o{n}"} for n in range(100)]
    table = OrderEvent.__table__

    # The helper and Core run in the same kind of transaction, so that their ratio is the
    # helper's own cost; the helper through a Session (as an application writes) is reported
    # beside them.
    def helper() -> None:
        with app.engine.begin() as conn:
            add_events(conn, OrderEvent, rows)

    def helper_session() -> None:
        with Session(app.engine) as session:
            add_events(session, OrderEvent, rows)
            session.commit()

    def core() -> None:
        with app.engine.begin() as conn:
            conn.execute(insert(table), rows)

    for trigger in (False, True):
        if trigger:
            notify.install(app)
        rates: dict[str, list[float]] = {
            "without": [],
            "with": [],
            "helper": [],
            "core": [],
            "helper_session": [],
        }
        works = {
            "without": (lambda: business(app, False), args.transactions),
            "with": (lambda: business(app, True), args.transactions),
            "helper": (helper, args.transactions // 2),
            "core": (core, args.transactions // 2),
            "helper_session": (helper_session, args.transactions // 2),
        }
        for _ in range(args.runs):
            for name, measured in rates_taking_turns(works).items():
                rates[name].append(measured)
        medians = {k: round(statistics.median(v), 1) for k, v in rates.items()}
        label = "notify_trigger" if trigger else "no_trigger"
        results[label] = {
            "rates": {k: [round(r, 1) for r in v] for k, v in rates.items()},
            "medians": medians,
            "event_transaction_ratio": round(medians["with"] / medians["without"], 3),
            "helper_vs_core": round(medians["helper"] / medians["core"], 3),
        }
        print(label, results[label], flush=True)

    concurrent: dict[str, list[float]] = {"no_trigger": [], "notify_trigger": []}
    for _ in range(args.runs):
        for label in concurrent:
            (notify.install if label == "notify_trigger" else notify.remove)(app)
            rate_now = concurrent_rate(libpq_url(url), args.writers, args.seconds)
            concurrent[label].append(round(rate_now, 1))
    results["concurrent_writers"] = {
        "writers": args.writers,
        "seconds": args.seconds,
        "rates": concurrent,
        "trigger_over_plain": round(
            statistics.median(concurrent["notify_trigger"])
            / statistics.median(concurrent["no_trigger"]),
            3,
        ),
    }
    print("concurrent_writers", results["concurrent_writers"], flush=True)
    print(f"results in {write('enqueue_cost', results)}")


if __name__ == "__main__":
    main()
