"""The RabbitMQ sink against a raw pika loop, and drained end to end from PostgreSQL.

In one run, on this machine's RabbitMQ (``OUTBOX_BENCH_RABBITMQ_URL``, default guest on
127.0.0.1:5672), with an exchange and a queue of its own, deleted at the end:

(a) raw: a hand-written loop on pika's asyncio adapter (the sink's client) publishes
    ``--messages`` events in groups of ``--group-size``, as a user's handler would: each
    event's columns written as JSON, its ``message_id``, persistent, ``mandatory``, on a
    channel with publisher confirms, every message of a group written first and the confirms
    awaited together (the sink's pipelining; ``benchmarks.amqp_clients`` compares the clients);
(b) sink: ``AsyncRabbitMQSink.send`` publishes the same events in the same groups;
(c) drain: ``--events`` events committed to a PostgreSQL buffer (a scratch database of its
    own) are drained into RabbitMQ by one in-process worker (burst, default concurrency) with
    the sink as the handler at ``--batch-size``: events per second from the worker's start to
    an empty buffer, and the database statements per published message (every statement the
    worker's engine sends, counted by a ``before_cursor_execute`` listener).

(a) and (b) take turns, ``--runs`` times each; medians are compared (sink / raw, aim ≥ 0.8;
statements per message, aim ≤ 0.05), with this process's CPU per message.

    python -m benchmarks.sink_rabbitmq --messages 20000 --group-size 1000 \\
        --events 50000 --batch-size 1000 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from decimal import Decimal
from typing import Any

import aio_pika
import pika
from sqlalchemy import Numeric, String, create_engine, event, insert, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from benchmarks._common import ADMIN_URL, command_line, machine, scratch_database, write
from benchmarks.amqp_clients import PikaPublisher
from outbox import Batch, BufferMixin, Outbox, schema
from outbox.sinks.base import json_default
from outbox.sinks.rabbitmq import AsyncRabbitMQSink
from outbox.worker import Worker

DATABASE = "outbox_bench_sink_rabbitmq"
RABBITMQ_URL = os.environ.get("OUTBOX_BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
ROUTING_KEY = "events"
HANDLER = "to_rabbitmq"


class Base(DeclarativeBase):
    """The benchmark's buffer."""


class OrderEvent(BufferMixin, Base):
    """An order event: a few columns of the common types."""

    __tablename__ = "bench_rabbitmq_events"
    account: Mapped[str] = mapped_column(String(40))
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    note: Mapped[str] = mapped_column(String(200))


def _rows(count: int) -> list[dict[str, Any]]:
    return [
        {"account": f"account-{n % 50}", "amount": Decimal(f"{n}.{n % 100:02d}"), "note": f"#{n}"}
        for n in range(count)
    ]


def _fresh(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        Base.metadata.drop_all(conn)
        schema.metadata.drop_all(conn)
        schema.metadata.create_all(conn)
        Base.metadata.create_all(conn)
    engine.dispose()


def _drop(name: str) -> None:
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


async def _destination(name: str) -> None:
    connection = await aio_pika.connect(RABBITMQ_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.DIRECT)
        queue = await channel.declare_queue(name)
        await queue.bind(exchange, ROUTING_KEY)


async def _purge(name: str, delete: bool = False) -> int:
    """Empty the queue (delete both, with ``delete``); how many messages it held."""
    connection = await aio_pika.connect(RABBITMQ_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(name, ensure=True)
        held = queue.declaration_result.message_count or 0
        await queue.purge()
        if delete:
            await channel.queue_delete(name)
            await channel.exchange_delete(name)
        return held


def _groups(url: str, messages: int, size: int) -> list[list[OrderEvent]]:
    """``messages`` events committed, then read back as detached instances, in groups."""
    _fresh(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(insert(OrderEvent), _rows(messages))
    with Session(engine) as session:
        events = list(session.query(OrderEvent).order_by(OrderEvent.id))
        session.expunge_all()
    engine.dispose()
    return [events[i : i + size] for i in range(0, len(events), size)]


async def raw(name: str, groups: list[list[OrderEvent]]) -> tuple[float, float]:
    """Seconds a hand-written pika loop takes to publish every group, confirmed, and the CPU
    seconds of this process meanwhile."""
    publisher = await PikaPublisher().open()
    try:
        table = OrderEvent.__tablename__
        started, cpu = time.perf_counter(), time.process_time()
        for group in groups:
            for e in group:
                body = json.dumps(
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
                properties = pika.BasicProperties(
                    message_id=f"{table}-{e.id}",
                    content_type="application/json",
                    delivery_mode=2,
                )
                publisher.publish(name, ROUTING_KEY, body, properties)
            await publisher.confirmed()
        return time.perf_counter() - started, time.process_time() - cpu
    finally:
        await publisher.close()


async def sink(name: str, groups: list[list[OrderEvent]]) -> tuple[float, float]:
    """Seconds ``AsyncRabbitMQSink.send`` takes to publish every group, confirmed, and the CPU
    seconds of this process meanwhile."""
    publisher = AsyncRabbitMQSink(RABBITMQ_URL, exchange=name, routing_key=ROUTING_KEY)
    await publisher.connect()
    try:
        started, cpu = time.perf_counter(), time.process_time()
        for group in groups:
            batch = Batch(group, group_id=uuid.uuid4(), attempt=1, handler=HANDLER)
            rejected = await publisher.send(batch)
            if rejected:
                raise RuntimeError(f"{len(rejected)} not confirmed: {rejected[0].reason}")
        return time.perf_counter() - started, time.process_time() - cpu
    finally:
        await publisher.close()


def drain(url: str, name: str, events: int, batch_size: int) -> dict[str, Any]:
    """Events per second drained from PostgreSQL into RabbitMQ by one worker, and database
    statements per published message."""
    _fresh(url)
    app = Outbox(url)
    app.handler(OrderEvent, name=HANDLER, batch_size=batch_size)(
        AsyncRabbitMQSink(RABBITMQ_URL, exchange=name, routing_key=ROUTING_KEY)
    )
    with app.engine.begin() as conn:
        conn.execute(insert(OrderEvent), _rows(events))
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
    published = asyncio.run(_purge(name))
    return {
        "events": events,
        "batch_size": batch_size,
        "seconds": round(seconds, 3),
        "events_per_second": round(events / seconds),
        "cpu_us_per_event": round(1e6 * cpu / events, 1),
        "left_in_buffer": left,
        "published": published,
        "statements": statements,
        "statements_per_message": round(statements / max(published, 1), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per run, (a), (b)")
    parser.add_argument("--group-size", type=int, default=1000, help="messages per group")
    parser.add_argument("--events", type=int, default=50_000, help="events drained, (c)")
    parser.add_argument("--batch-size", type=int, default=1000, help="the handler's, (c)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    url = scratch_database(DATABASE)
    name = f"outbox-bench-{uuid.uuid4().hex[:12]}"
    asyncio.run(_destination(name))
    try:
        groups = _groups(url, args.messages, args.group_size)
        rates: dict[str, list[float]] = {"raw": [], "sink": []}
        cpu: dict[str, list[float]] = {"raw": [], "sink": []}
        for run in range(args.runs):
            # Taking turns, the first side alternating: the machine's drift hits both alike.
            sides = ("raw", "sink") if run % 2 == 0 else ("sink", "raw")
            for side in sides:
                seconds, spent = asyncio.run(
                    raw(name, groups) if side == "raw" else sink(name, groups)
                )
                published = asyncio.run(_purge(name))
                if published != args.messages:
                    raise RuntimeError(f"{side}: {published} in the queue, not {args.messages}")
                rates[side].append(round(args.messages / seconds))
                cpu[side].append(round(1e6 * spent / args.messages, 1))
                print(
                    f"run {run + 1} {side}: {rates[side][-1]:,} messages/s, "
                    f"{cpu[side][-1]} µs CPU per message"
                )
        raw_rate = statistics.median(rates["raw"])
        sink_rate = statistics.median(rates["sink"])
        ratio = round(sink_rate / raw_rate, 3)
        print(
            f"sink / raw: {sink_rate:,.0f} / {raw_rate:,.0f} messages/s = {ratio} (aim ≥ 0.8); "
            f"CPU per message {statistics.median(cpu['sink'])} / "
            f"{statistics.median(cpu['raw'])} µs"
        )
        drained = drain(url, name, args.events, args.batch_size)
        print(
            f"drain: {drained['events_per_second']:,} events/s ({args.events:,} events, batch "
            f"{args.batch_size:,}, {drained['seconds']} s, {drained['cpu_us_per_event']} µs "
            f"CPU per event); "
            f"{drained['statements_per_message']} statements per message (aim ≤ 0.05)"
        )
    finally:
        asyncio.run(_purge(name, delete=True))
        _drop(DATABASE)
    write(
        "sink_rabbitmq",
        {
            "benchmark": "sink_rabbitmq",
            "command": command_line("benchmarks.sink_rabbitmq", args),
            "machine": machine(),
            "messages": args.messages,
            "group_size": args.group_size,
            "raw_messages_per_second": rates["raw"],
            "sink_messages_per_second": rates["sink"],
            "raw_median": raw_rate,
            "sink_median": sink_rate,
            "sink_over_raw": ratio,
            "raw_cpu_us_per_message": cpu["raw"],
            "sink_cpu_us_per_message": cpu["sink"],
            "drain": drained,
        },
    )


if __name__ == "__main__":
    main()
