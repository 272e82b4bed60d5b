"""What the broker sinks' benchmarks (``sink_nats``, ``sink_rabbitmq``) share: the buffer they
publish from, its events committed and read back in groups, the JSON a hand-written loop
writes for an event, a drain measured end to end, and their command line."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import Numeric, String, create_engine, event, insert, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from benchmarks._common import fresh_tables
from outbox import BufferMixin, Outbox
from outbox.sinks.base import AsyncSink
from outbox.sinks.encoding import json_default
from outbox.worker import Worker


def parse_arguments(description: str) -> argparse.Namespace:
    """The command line of a broker sink's benchmark: the loops' messages and groups, the
    drain's events and batch, the runs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--messages", type=int, default=20_000, help="messages per run, (a), (b)")
    parser.add_argument("--group-size", type=int, default=1000, help="messages per group")
    parser.add_argument("--events", type=int, default=50_000, help="events drained, (c)")
    parser.add_argument("--batch-size", type=int, default=1000, help="the handler's, (c)")
    parser.add_argument("--runs", type=int, default=3)
    return parser.parse_args()


class Base(DeclarativeBase):
    """The benchmarks' buffer."""


class OrderEvent(BufferMixin, Base):
    """An order event: a few columns of the common types."""

    __tablename__ = "bench_order_events"
    account: Mapped[str] = mapped_column(String(40))
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    note: Mapped[str] = mapped_column(String(200))


def order_rows(count: int) -> list[dict[str, Any]]:
    """``count`` events' values, over 50 accounts."""
    return [
        {"account": f"account-{n % 50}", "amount": Decimal(f"{n}.{n % 100:02d}"), "note": f"#{n}"}
        for n in range(count)
    ]


def hand_written_body(e: OrderEvent) -> bytes:
    """An event's columns as JSON, written as a user's handler would (the default payload's
    bytes, without the sink)."""
    return json.dumps(
        {
            "id": e.id,
            "created_at": e.created_at,
            "account": e.account,
            "amount": e.amount,
            "note": e.note,
        },
        default=json_default,
        separators=(",", ":"),
    ).encode()


@dataclass(frozen=True)
class Groups:
    """The same events in the same groups: as detached instances, for the raw loops, and as
    rows, as a worker hands them to a sink."""

    url: str
    events: list[list[OrderEvent]]
    rows: list[list[Any]]


def committed_groups(url: str, messages: int, size: int) -> Groups:
    """``messages`` events committed to fresh tables, then read back, in groups of ``size``."""
    fresh_tables(url, Base.metadata)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(insert(OrderEvent), order_rows(messages))
    with Session(engine) as session:
        events = list(session.query(OrderEvent).order_by(OrderEvent.id))
        session.expunge_all()
    with engine.connect() as conn:
        rows = list(conn.execute(select(OrderEvent.__table__).order_by(OrderEvent.id)))
    engine.dispose()
    return Groups(
        url,
        [events[i : i + size] for i in range(0, len(events), size)],
        [rows[i : i + size] for i in range(0, len(rows), size)],
    )


def measured_drain(
    url: str,
    sink: AsyncSink,
    handler: str,
    events: int,
    batch_size: int,
    published: Callable[[], int],
) -> dict[str, Any]:
    """Events per second drained from fresh tables into ``sink`` (registered as ``handler``
    at ``batch_size``) by one burst worker, and database statements per published message
    (``published``: how many messages the downstream holds once the buffer is empty)."""
    fresh_tables(url, Base.metadata)
    app = Outbox(url)
    app.handler(OrderEvent, name=handler, batch_size=batch_size)(sink)
    with app.engine.begin() as conn:
        conn.execute(insert(OrderEvent), order_rows(events))
    statements = 0

    def count(*_: Any) -> None:
        nonlocal statements
        statements += 1

    event.listen(app.engine, "before_cursor_execute", count)
    started, cpu = time.perf_counter(), time.process_time()
    Worker(app, burst=True).run()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    event.remove(app.engine, "before_cursor_execute", count)
    with app.engine.connect() as conn:
        left = conn.execute(text(f"SELECT count(*) FROM {OrderEvent.__tablename__}")).scalar_one()
    app.engine.dispose()
    stored = published()
    return {
        "events": events,
        "batch_size": batch_size,
        "seconds": round(seconds, 3),
        "events_per_second": round(events / seconds),
        "cpu_us_per_event": round(1e6 * cpu / events, 1),
        "left_in_buffer": left,
        "published": stored,
        "statements": statements,
        "statements_per_message": round(statements / max(stored, 1), 4),
    }
