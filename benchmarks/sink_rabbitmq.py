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

import asyncio
import os
import statistics
import time
import uuid
from typing import Any

import aio_pika
import pika

from benchmarks._common import command_line, drop_database, machine, scratch_database, write
from benchmarks._sinks import (
    OrderEvent,
    committed_groups,
    hand_written_body,
    measured_drain,
    parse_arguments,
)
from benchmarks.amqp_clients import PikaPublisher
from outbox import Batch
from outbox.sinks.rabbitmq import AsyncRabbitMQSink

DATABASE = "outbox_bench_sink_rabbitmq"
RABBITMQ_URL = os.environ.get("OUTBOX_BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
ROUTING_KEY = "events"
HANDLER = "to_rabbitmq"


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


async def raw(name: str, groups: list[list[OrderEvent]]) -> tuple[float, float]:
    """Seconds a hand-written pika loop takes to publish every group, confirmed, and the CPU
    seconds of this process meanwhile."""
    publisher = await PikaPublisher().open()
    try:
        table = OrderEvent.__tablename__
        started, cpu = time.perf_counter(), time.process_time()
        for group in groups:
            for e in group:
                body = hand_written_body(e)
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
    sink = AsyncRabbitMQSink(RABBITMQ_URL, exchange=name, routing_key=ROUTING_KEY)
    return measured_drain(
        url, sink, HANDLER, events, batch_size, published=lambda: asyncio.run(_purge(name))
    )


def main() -> None:
    args = parse_arguments(__doc__.split("\n\n")[0])

    url = scratch_database(DATABASE)
    name = f"outbox-bench-{uuid.uuid4().hex[:12]}"
    asyncio.run(_destination(name))
    try:
        groups = committed_groups(url, args.messages, args.group_size).events
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
        drop_database(DATABASE)
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
