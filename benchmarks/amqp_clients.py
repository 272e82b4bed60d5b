"""AMQP 0.9.1 clients for Python publishing to RabbitMQ with publisher confirms, side by side.

In one run, on this machine's RabbitMQ (``OUTBOX_BENCH_RABBITMQ_URL``, default guest on
127.0.0.1:5672), with a durable exchange and a durable queue of its own (deleted at the end),
each client publishes the same ``--messages`` bodies (JSON of about 250 bytes, a
``message_id``, ``application/json``, persistent, ``mandatory``) in groups of
``--group-size``, pipelined as the RabbitMQ sink does: every message of a group written, then
the group's confirms awaited together; a nack, a return or a missing confirm fails the run.

- ``aio-pika``: ``Exchange.publish`` in one task per message;
- ``aiormq``: aio-pika's own transport, ``Channel.basic_publish`` in one task per message;
- ``aiormq-nowait``: the same with ``wait=False`` (the frame queued, not drained one by one);
- ``pika``: ``SelectConnection``, every publish written, the confirms counted by callback
  (pika's blocking adapter waits for each confirm, so it cannot pipeline);
- ``pika-asyncio`` (the sink's client): pika's ``AsyncioConnection`` on the running loop, a
  group's confirms awaited on a future that the confirm callback resolves;
- ``py-amqp`` (``amqp``, Celery's client, when installed): ``basic_publish`` on a channel in
  confirm mode, then ``drain_events`` until every confirm is in.

Clients take turns, ``--runs`` times each, the first alternating; the queue is counted and
purged after each. Reported: messages/s (median), this process's CPU per message (the
client's cost; the broker runs in another process) and each rate as a ratio to aio-pika's.

    python -m benchmarks.amqp_clients --messages 20000 --group-size 1000 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import aiormq
import pika
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.adapters.select_connection import SelectConnection

from benchmarks._common import command_line, machine, write

RABBITMQ_URL = os.environ.get("OUTBOX_BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
ROUTING_KEY = "events"
CONTENT_TYPE = "application/json"
CONFIRM_TIMEOUT_SECONDS = 30.0

Message = tuple[bytes, str]
"""A body and its message id."""


def bodies(count: int, table: str = "bench_rabbitmq_events") -> list[Message]:
    """``count`` JSON bodies of about 250 bytes, as the sink writes an event's columns."""
    messages = []
    for n in range(1, count + 1):
        body = json.dumps(
            {
                "id": n,
                "created_at": "2025-01-01T12:00:00.123456+00:00",
                "group_id": None,
                "account": f"account-{n % 50}",
                "region": ["eu-west", "us-east", "ap-south"][n % 3],
                "amount": f"{n}.{n % 100:02d}",
                "currency": "EUR",
                "note": f"order #{n} placed by account-{n % 50}; " + "x" * 40,
            },
            separators=(",", ":"),
        ).encode()
        messages.append((body, f"{table}-{n}"))
    return messages


async def _declare(name: str) -> None:
    connection = await aiormq.connect(RABBITMQ_URL)
    try:
        channel = await connection.channel()
        await channel.exchange_declare(name, exchange_type="direct", durable=True)
        await channel.queue_declare(name, durable=True)
        await channel.queue_bind(name, name, routing_key=ROUTING_KEY)
    finally:
        await connection.close()


async def _purge(name: str, delete: bool = False) -> int:
    """Empty the queue (delete it and the exchange, with ``delete``); how many it held."""
    connection = await aiormq.connect(RABBITMQ_URL)
    try:
        channel = await connection.channel()
        held = (await channel.queue_declare(name, passive=True)).message_count or 0
        await channel.queue_purge(name)
        if delete:
            await channel.queue_delete(name)
            await channel.exchange_delete(name)
        return held
    finally:
        await connection.close()


async def aio_pika_client(name: str, groups: Sequence[Sequence[Message]]) -> None:
    """``Exchange.publish`` per message, in tasks; the confirms awaited per group."""
    connection = await aio_pika.connect(RABBITMQ_URL)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.get_exchange(name, ensure=True)
        for group in groups:
            tasks = [
                asyncio.ensure_future(
                    exchange.publish(
                        aio_pika.Message(
                            body,
                            message_id=message_id,
                            content_type=CONTENT_TYPE,
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        ),
                        ROUTING_KEY,
                        mandatory=True,
                    )
                )
                for body, message_id in group
            ]
            _confirmed(await asyncio.gather(*tasks, return_exceptions=True))


async def aiormq_client(
    name: str, groups: Sequence[Sequence[Message]], *, wait: bool = True
) -> None:
    """``Channel.basic_publish`` per message, in tasks; the confirms awaited per group."""
    connection = await aiormq.connect(RABBITMQ_URL)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await channel.exchange_declare(name, passive=True)
        for group in groups:
            tasks = [
                asyncio.ensure_future(
                    channel.basic_publish(
                        body,
                        exchange=name,
                        routing_key=ROUTING_KEY,
                        properties=aiormq.spec.Basic.Properties(
                            message_id=message_id,
                            content_type=CONTENT_TYPE,
                            delivery_mode=2,
                        ),
                        mandatory=True,
                        wait=wait,
                    )
                )
                for body, message_id in group
            ]
            results = await asyncio.gather(*tasks, return_exceptions=True)
            _confirmed(results, ack=aiormq.spec.Basic.Ack)
    finally:
        await connection.close()


def _confirmed(results: Sequence[Any], ack: type | None = None) -> None:
    failed = [
        result
        for result in results
        if isinstance(result, BaseException) or (ack is not None and not isinstance(result, ack))
    ]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(results)} not confirmed: {failed[0]!r}")


def pika_client(name: str, groups: Sequence[Sequence[Message]]) -> None:
    """pika's ``SelectConnection``: a group written, the next one once every confirm is in."""
    remaining = list(groups)
    outstanding: set[int] = set()
    state: dict[str, Any] = {"tag": 0, "channel": None, "error": None}
    properties = pika.BasicProperties(content_type=CONTENT_TYPE, delivery_mode=2)

    def fail(connection: SelectConnection, error: str) -> None:
        state["error"] = state["error"] or error
        if connection.is_open:
            connection.close()

    def publish_next(connection: SelectConnection) -> None:
        if not remaining:
            connection.close()
            return
        channel = state["channel"]
        for body, message_id in remaining.pop(0):
            properties.message_id = message_id
            channel.basic_publish(name, ROUTING_KEY, body, properties, mandatory=True)
            state["tag"] += 1
            outstanding.add(state["tag"])

    def on_confirm(frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            fail(connection, f"nacked: {method.delivery_tag}")
            return
        if method.multiple:
            outstanding.difference_update([t for t in outstanding if t <= method.delivery_tag])
        else:
            outstanding.discard(method.delivery_tag)
        if not outstanding:
            publish_next(connection)

    def on_channel(channel: Any) -> None:
        state["channel"] = channel
        channel.add_on_return_callback(lambda *_: fail(connection, "returned"))
        channel.confirm_delivery(on_confirm, callback=lambda _: publish_next(connection))

    connection = SelectConnection(
        pika.URLParameters(RABBITMQ_URL),
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_open_error_callback=lambda c, e: fail(c, repr(e)),
        on_close_callback=lambda c, reason: c.ioloop.stop(),
    )
    connection.ioloop.start()
    if state["error"] or remaining or outstanding:
        raise RuntimeError(f"pika: {state['error'] or 'stopped early'}")


class PikaPublisher:
    """A hand-written publisher on pika's ``AsyncioConnection`` (the running loop): messages
    written with :meth:`publish`, then :meth:`confirmed` awaits every confirm, on a future
    that the confirm callback resolves; a nack, a return or a lost connection fails it."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[Any] = self.loop.create_future()
        self.closed: asyncio.Future[Any] = self.loop.create_future()
        self.outstanding: set[int] = set()
        self.tag = 0
        self.waiter: asyncio.Future[None] | None = None
        self.channel: Any = None
        self.connection = AsyncioConnection(
            pika.URLParameters(RABBITMQ_URL),
            on_open_callback=lambda c: c.channel(on_open_callback=self._on_channel),
            on_open_error_callback=lambda c, e: self.opened.set_exception(ConnectionError(e)),
            on_close_callback=self._on_close,
            custom_ioloop=self.loop,
        )

    async def open(self) -> PikaPublisher:
        """Wait until the channel is in confirm mode."""
        self.channel = await self.opened
        return self

    def publish(
        self, exchange: str, routing_key: str, body: bytes, properties: pika.BasicProperties
    ) -> None:
        """Write one message, ``mandatory``."""
        self.channel.basic_publish(exchange, routing_key, body, properties, mandatory=True)
        self.tag += 1
        self.outstanding.add(self.tag)

    async def confirmed(self) -> None:
        """Wait until every message written is confirmed."""
        if self.outstanding:
            self.waiter = self.loop.create_future()
            await asyncio.wait_for(self.waiter, CONFIRM_TIMEOUT_SECONDS)

    async def close(self) -> None:
        """Close the connection."""
        self.connection.close()
        await self.closed

    def _settle(self, error: BaseException | None = None) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            self._settle(RuntimeError(f"nacked: {method.delivery_tag}"))
            return
        if method.multiple:
            self.outstanding.difference_update(
                [t for t in self.outstanding if t <= method.delivery_tag]
            )
        else:
            self.outstanding.discard(method.delivery_tag)
        if not self.outstanding:
            self._settle()

    def _on_channel(self, channel: Any) -> None:
        channel.add_on_return_callback(lambda *_: self._settle(RuntimeError("returned")))
        channel.confirm_delivery(
            self._on_confirm, callback=lambda _: self.opened.set_result(channel)
        )

    def _on_close(self, connection: Any, reason: BaseException) -> None:
        self._settle(ConnectionError(reason))
        if not self.closed.done():
            self.closed.set_result(reason)


async def pika_asyncio_client(name: str, groups: Sequence[Sequence[Message]]) -> None:
    """pika's ``AsyncioConnection`` on the running loop: a group written, its confirms
    awaited on a future that the confirm callback resolves."""
    publisher = await PikaPublisher().open()
    try:
        for group in groups:
            for body, message_id in group:
                properties = pika.BasicProperties(
                    message_id=message_id, content_type=CONTENT_TYPE, delivery_mode=2
                )
                publisher.publish(name, ROUTING_KEY, body, properties)
            await publisher.confirmed()
    finally:
        await publisher.close()


def py_amqp_client(name: str, groups: Sequence[Sequence[Message]]) -> None:
    """py-amqp: a group's ``basic_publish`` calls, then ``drain_events`` until confirmed."""
    import amqp

    parts = urlsplit(RABBITMQ_URL)
    connection = amqp.Connection(
        f"{parts.hostname}:{parts.port or 5672}",
        userid=parts.username or "guest",
        password=parts.password or "guest",
    )
    connection.connect()
    outstanding: set[int] = set()
    failures: list[str] = []

    def on_ack(tag: int, multiple: bool) -> None:
        if multiple:
            outstanding.difference_update([t for t in outstanding if t <= tag])
        else:
            outstanding.discard(tag)

    try:
        channel = connection.channel()
        channel.confirm_select()
        channel.events["basic_ack"].add(on_ack)
        channel.events["basic_nack"].add(lambda tag, multiple: failures.append(f"nack {tag}"))
        channel.events["basic_return"].add(lambda *args: failures.append("returned"))
        tag = 0
        for group in groups:
            for body, message_id in group:
                channel.basic_publish(
                    amqp.Message(
                        body, message_id=message_id, content_type=CONTENT_TYPE, delivery_mode=2
                    ),
                    exchange=name,
                    routing_key=ROUTING_KEY,
                    mandatory=True,
                )
                tag += 1
                outstanding.add(tag)
            while outstanding and not failures:
                connection.drain_events(timeout=CONFIRM_TIMEOUT_SECONDS)
            if failures:
                raise RuntimeError(f"py-amqp: {failures[0]}")
    finally:
        connection.close()


def _clients() -> dict[str, Callable[[str, Sequence[Sequence[Message]]], None]]:
    clients: dict[str, Callable[[str, Sequence[Sequence[Message]]], None]] = {
        "aio-pika": lambda name, groups: asyncio.run(aio_pika_client(name, groups)),
        "aiormq": lambda name, groups: asyncio.run(aiormq_client(name, groups)),
        "aiormq-nowait": lambda name, groups: asyncio.run(aiormq_client(name, groups, wait=False)),
        "pika": pika_client,
        "pika-asyncio": lambda name, groups: asyncio.run(pika_asyncio_client(name, groups)),
    }
    try:
        import amqp  # noqa: F401
    except ImportError:
        pass
    else:
        clients["py-amqp"] = py_amqp_client
    return clients


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per client run")
    parser.add_argument("--group-size", type=int, default=1000, help="messages per group")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", help="comma-separated names to run (default: every one found)")
    args = parser.parse_args()

    clients = _clients()
    if args.clients:
        clients = {name: clients[name] for name in args.clients.split(",")}
    messages = bodies(args.messages)
    groups = [messages[i : i + args.group_size] for i in range(0, len(messages), args.group_size)]
    size = statistics.mean(len(body) for body, _ in messages)
    print(f"{args.messages:,} messages of {size:.0f} bytes, groups of {args.group_size:,}")
    name = f"outbox-bench-clients-{uuid.uuid4().hex[:12]}"
    asyncio.run(_declare(name))
    rates: dict[str, list[float]] = {client: [] for client in clients}
    cpu: dict[str, list[float]] = {client: [] for client in clients}
    try:
        for run in range(args.runs):
            order = list(clients)
            if run % 2:
                order.reverse()
            for client in order:
                wall, spent = time.perf_counter(), time.process_time()
                clients[client](name, groups)
                wall, spent = time.perf_counter() - wall, time.process_time() - spent
                held = asyncio.run(_purge(name))
                if held != args.messages:
                    raise RuntimeError(f"{client}: {held} in the queue, not {args.messages}")
                rates[client].append(round(args.messages / wall))
                cpu[client].append(round(1e6 * spent / args.messages, 1))
                print(
                    f"run {run + 1} {client}: {rates[client][-1]:,} messages/s, "
                    f"{cpu[client][-1]} µs CPU per message"
                )
    finally:
        asyncio.run(_purge(name, delete=True))
    base = statistics.median(rates["aio-pika"]) if "aio-pika" in rates else None
    results = {}
    for client in clients:
        rate = statistics.median(rates[client])
        ratio = round(rate / base, 2) if base else None
        results[client] = {
            "messages_per_second": rates[client],
            "median": rate,
            "cpu_us_per_message": cpu[client],
            "cpu_us_median": statistics.median(cpu[client]),
            "over_aio_pika": ratio,
        }
        print(
            f"{client:>14}: {rate:>8,.0f} messages/s, "
            f"{statistics.median(cpu[client]):>6} µs CPU per message, {ratio} of aio-pika's rate"
        )
    write(
        "amqp_clients",
        {
            "benchmark": "amqp_clients",
            "command": command_line("benchmarks.amqp_clients", args),
            "machine": machine(),
            "messages": args.messages,
            "group_size": args.group_size,
            "body_bytes": round(size),
            "clients": results,
        },
    )


if __name__ == "__main__":
    main()
